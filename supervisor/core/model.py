"""The vocabulary of docs/detection.md as types: phenotypes, attributes, causes, incidents.

``Diagnosis.to_json()`` is the stable JSON contract printed by ``supervisor analyze --json``
and stored with every incident.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any


class Phenotype(str, Enum):
    """What the curve does (exactly one per incident)."""

    TRANSIENT = "transient"
    SLOW_RECOVERY = "slow_recovery"
    DIVERGENCE = "divergence"
    PERIODIC = "periodic"


class Cause(str, Enum):
    """Cause categories, ranked per incident with evidence."""

    DATA = "data"
    OPTIMIZER = "optimizer"
    NUMERIC = "numeric"
    DISTRIBUTED = "distributed"
    RESUME_STATE = "resume_state"
    METRIC_ARTIFACT = "metric_artifact"


class Severity(str, Enum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return ["low", "medium", "high", "critical"].index(self.value)


class HealthMark(str, Enum):
    """Checkpoint health: unverified -> verified -> healthy; or diagnostic / quarantined."""

    UNVERIFIED = "unverified"
    VERIFIED = "verified"
    HEALTHY = "healthy"
    DIAGNOSTIC = "diagnostic"
    QUARANTINED = "quarantined"


@dataclass(slots=True)
class CauseScore:
    cause: Cause
    score: float
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause.value,
            "score": round(float(self.score), 4),
            "evidence": list(self.evidence),
        }


@dataclass(slots=True)
class FirstAnomaly:
    """The first abnormal quantity: earliest step, rank and metric that left its band."""

    step: int
    metric: str
    rank: int | None = None
    value: float | None = None
    baseline: float | None = None
    z: float | None = None


@dataclass(slots=True)
class Diagnosis:
    """One incident as the engine sees it; refined as more steps arrive."""

    onset_step: int
    peak_step: int
    end_step: int | None
    phenotype: Phenotype
    period: int | None = None
    nonfinite: bool = False
    nonfinite_at: str | None = None
    rank_local: bool = False
    first_rank: int | None = None
    after_resume: bool = False
    source_local: str | None = None
    causes: list[CauseScore] = field(default_factory=list)
    suspect_samples: list[str] = field(default_factory=list)
    severity: Severity = Severity.MEDIUM
    first_anomaly: FirstAnomaly | None = None
    detected_step: int | None = None

    @property
    def top_cause(self) -> Cause | None:
        return self.causes[0].cause if self.causes else None

    @property
    def attributes(self) -> list[str]:
        flags = (
            ("nonfinite", self.nonfinite),
            ("rank_local", self.rank_local),
            ("after_resume", self.after_resume),
            ("source_local", self.source_local),
        )
        return [name for name, on in flags if on]

    def to_json(self) -> dict[str, Any]:
        """The stable contract of `supervisor analyze --json` (one element of "incidents"): every
        field, in the order declared."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {
            "phenotype": self.phenotype.value,
            "causes": [c.to_json() for c in self.causes],
            "suspect_samples": list(self.suspect_samples),
            "severity": self.severity.value,
            "first_anomaly": asdict(self.first_anomaly) if self.first_anomaly else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Diagnosis:
        fa = d.get("first_anomaly")
        return cls(
            onset_step=int(d["onset_step"]),
            peak_step=int(d["peak_step"]),
            end_step=None if d.get("end_step") is None else int(d["end_step"]),
            phenotype=Phenotype(d["phenotype"]),
            period=d.get("period"),
            nonfinite=bool(d.get("nonfinite", False)),
            nonfinite_at=d.get("nonfinite_at"),
            rank_local=bool(d.get("rank_local", False)),
            first_rank=d.get("first_rank"),
            after_resume=bool(d.get("after_resume", False)),
            source_local=d.get("source_local"),
            causes=[
                CauseScore(Cause(c["cause"]), float(c["score"]), list(c.get("evidence", [])))
                for c in d.get("causes", [])
            ],
            suspect_samples=list(d.get("suspect_samples", [])),
            severity=Severity(d.get("severity", "medium")),
            first_anomaly=FirstAnomaly(**fa) if isinstance(fa, dict) else None,
            detected_step=d.get("detected_step"),
        )


@dataclass(slots=True)
class BenignShift:
    """A level change that is not an incident (e.g. a mixture switch to a harder domain)."""

    step: int
    metric: str
    before: float
    after: float
    source: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
