"""Find and load a policy: a shipped name (`default` -> policies/default.yaml) or a file path."""

from __future__ import annotations

import sys
from pathlib import Path

from supervisor.config.loader import check_model
from supervisor.core.policy.schema import Policy, with_valid_keys
from supervisor.errors import PolicyError

#: Where the shipped policies are, first found wins: the source tree's `policies/` (a checkout
#: or an editable install), then the copy a wheel installs (pyproject's data-files).
SHIPPED_DIRS = (
    Path(__file__).resolve().parents[3] / "policies",
    Path(sys.prefix) / "share" / "spike-supervisor" / "policies",
)


def shipped_dir() -> Path | None:
    return next((d for d in SHIPPED_DIRS if d.is_dir()), None)


def shipped_policies() -> list[str]:
    """Names of the shipped policies (policies/ in the repository)."""
    found = shipped_dir()
    return sorted(p.stem for p in found.glob("*.yaml")) if found is not None else []


def resolve_policy_path(name_or_path: str | Path) -> Path:
    """A path as given, or the shipped file for a bare name; PolicyError listing names otherwise."""
    text = str(name_or_path)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or "/" in text or path.exists():
        return path
    found = shipped_dir()
    if found is not None and (found / f"{text}.yaml").is_file():
        return found / f"{text}.yaml"
    names = ", ".join(shipped_policies()) or "none found"
    raise PolicyError(f"no such policy file or shipped policy (shipped: {names})", source=text)


def load_policy(name_or_path: str | Path) -> Policy:
    """Load and validate a policy; every failure is a one-line PolicyError naming file and field."""
    found, problems = check_policy(resolve_policy_path(name_or_path))
    if found is None:
        raise problems[0]
    return found


def check_policy(path: Path) -> tuple[Policy | None, list[PolicyError]]:
    """(the policy, []) or (None, every problem), each one line naming the file and the field."""
    found, problems = check_model(Policy, path, error=PolicyError)
    return found, [_with_valid_keys(p) for p in problems]


def _with_valid_keys(exc: Exception) -> PolicyError:
    if not isinstance(exc, PolicyError):  # check_model raises only `error`; keep mypy honest
        return PolicyError(str(exc))
    if exc.field is None or exc.message != "unknown key":
        return exc
    return PolicyError(with_valid_keys(Policy, exc.field, exc.message), source=exc.source, field=exc.field)
