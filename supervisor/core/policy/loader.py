"""Find and load a policy: a shipped name (`default` -> policies/default.yaml) or a file path."""

from __future__ import annotations

from pathlib import Path

from supervisor.config.loader import load_model
from supervisor.core.policy.schema import Policy, with_valid_keys
from supervisor.errors import PolicyError

#: The repository's `policies/` folder (shipped policies live next to the package).
SHIPPED_DIR = Path(__file__).resolve().parents[3] / "policies"


def shipped_policies() -> list[str]:
    """Names of the policies shipped in policies/."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml")) if SHIPPED_DIR.is_dir() else []


def resolve_policy_path(name_or_path: str | Path) -> Path:
    """A path as given, or the shipped file for a bare name; PolicyError listing names otherwise."""
    text = str(name_or_path)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or "/" in text or path.exists():
        return path
    shipped = SHIPPED_DIR / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(shipped_policies()) or "none found"
    raise PolicyError(f"no such policy file or shipped policy (shipped: {names})", source=text)


def load_policy(name_or_path: str | Path) -> Policy:
    """Load and validate a policy; every failure is a one-line PolicyError naming file and field."""
    path = resolve_policy_path(name_or_path)
    try:
        return load_model(Policy, path, error=PolicyError)
    except PolicyError as exc:
        if exc.field is None or exc.message != "unknown key":
            raise
        raise PolicyError(
            with_valid_keys(Policy, exc.field, exc.message), source=exc.source, field=exc.field
        ) from None
