"""Shared builders: hand-made diagnoses and policies, so each test states only what it varies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.core.model import Cause, CauseScore, Diagnosis, Phenotype, Severity
from supervisor.core.policy import JobState, Policy, load_policy

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"


def diag(
    phenotype: str = "divergence",
    causes: tuple[str, ...] = ("optimizer",),
    *,
    onset: int = 340,
    peak: int | None = None,
    end: int | None = None,
    **attrs: Any,
) -> Diagnosis:
    """A diagnosis with ranked causes (first = top, scores descending)."""
    scored = [
        CauseScore(Cause(c), round(0.9 - 0.2 * i, 2), [f"evidence for {c}"]) for i, c in enumerate(causes)
    ]
    severity = Severity(attrs.pop("severity", "high"))
    return Diagnosis(
        onset_step=onset,
        peak_step=peak if peak is not None else onset + 10,
        end_step=end,
        phenotype=Phenotype(phenotype),
        causes=scored,
        severity=severity,
        detected_step=onset + 5,
        **attrs,
    )


def state(**kw: Any) -> JobState:
    """A job at step 345 that clips at 1.0 and runs LR 3e-3, with three healthy checkpoints."""
    kw.setdefault("step", 345)
    kw.setdefault("grad_clip", 1.0)
    kw.setdefault("lr", 3e-3)
    kw.setdefault("checkpoints", ((100, "healthy"), (200, "healthy"), (300, "healthy")))
    return JobState(**kw)


def write_policy(tmp_path: Path, body: dict[str, Any] | str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False))
    return path


def one_rule(actions: list[Any], match: dict[str, Any] | None = None, **rule: Any) -> dict[str, Any]:
    """A minimal policy dict with one rule."""
    return {
        "version": 1,
        "name": "test",
        "rules": [{"name": "r", "match": match if match is not None else {}, "actions": actions, **rule}],
    }


@pytest.fixture(scope="session")
def default_policy() -> Policy:
    return load_policy("default")


@pytest.fixture(scope="session")
def default_yaml() -> dict[str, Any]:
    """default.yaml read independently of the loader: what the file says."""
    data: dict[str, Any] = yaml.safe_load((POLICIES / "default.yaml").read_text())
    return data
