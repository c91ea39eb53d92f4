"""Rule matching: which incidents a rule applies to, and why it did or did not match.

A ``Match`` is a conjunction of conditions over a ``Diagnosis``; every empty condition
matches anything. ``Match.miss(d)`` returns the first condition that failed (a sentence) or
``None``, so a dry run can say why each earlier rule was passed over.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Literal

from pydantic import Field, field_validator

from supervisor.core.model import Cause, Diagnosis, Phenotype, Severity
from supervisor.core.policy.evidence import Finding, findings
from supervisor.core.policy.settings import Section

Attribute = Literal["nonfinite", "rank_local", "after_resume", "source_local"]


#: Diagnosis quantities a rule may compare (name -> extractor; None means "not known": no match).
METRICS: dict[str, Callable[[Diagnosis], float | None]] = {
    "duration_steps": lambda d: float((d.end_step if d.end_step is not None else d.peak_step) - d.onset_step),
    "rise_steps": lambda d: float(d.peak_step - d.onset_step),
    "detection_gap": lambda d: None if d.detected_step is None else float(d.detected_step - d.onset_step),
    "first_anomaly_z": lambda d: d.first_anomaly.z if d.first_anomaly else None,
    "period": lambda d: None if d.period is None else float(d.period),
    "top_cause_score": lambda d: d.causes[0].score if d.causes else None,
    "suspect_samples": lambda d: float(len(d.suspect_samples)),
    "onset_step": lambda d: float(d.onset_step),
}

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


class MetricCondition(Section):
    """`metric op value`, e.g. `{metric: duration_steps, op: "<=", value: 5}`."""

    metric: str = Field(description=f"One of: {', '.join(METRICS)}.")
    op: Literal["<", "<=", ">", ">=", "==", "!="] = Field(description="Comparison.")
    value: float = Field(description="Right-hand side.")

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in METRICS:
            raise ValueError(f"unknown metric {v!r} (valid: {', '.join(sorted(METRICS))})")
        return v

    def miss(self, d: Diagnosis) -> str | None:
        got = METRICS[self.metric](d)
        if got is None:
            return f"{self.metric} is not known for this incident"
        if _OPS[self.op](got, self.value):
            return None
        return f"{self.metric}={got:g} is not {self.op} {self.value:g}"


class Match(Section):
    """Conditions an incident must all meet; an empty list means "any"."""

    phenotype: list[Phenotype] = Field(default_factory=list, description="Phenotype is one of these.")
    attributes: list[Attribute] = Field(
        default_factory=list, description="All of these attributes are present."
    )
    any_attributes: list[Attribute] = Field(
        default_factory=list, description="At least one of these attributes is present."
    )
    not_attributes: list[Attribute] = Field(
        default_factory=list, description="None of these attributes is present."
    )
    top_cause: list[Cause] = Field(default_factory=list, description="The top-ranked cause is one of these.")
    causes: list[Cause] = Field(
        default_factory=list,
        description="One of these is among the ranked causes with score >= min_cause_score.",
    )
    min_cause_score: float = Field(0.0, ge=0, description="Score a cause in `causes` needs to count.")
    evidence: list[Finding] = Field(
        default_factory=list,
        description="At least one of these findings is in the diagnosis' evidence (see policy.evidence).",
    )
    not_evidence: list[Finding] = Field(
        default_factory=list, description="None of these findings is present."
    )
    severity_at_least: Severity | None = Field(None, description="Severity is at least this.")
    metrics: list[MetricCondition] = Field(
        default_factory=list, description="Numeric conditions, all must hold."
    )

    def miss(self, d: Diagnosis) -> str | None:
        """The first condition this incident fails, as a sentence; None if it matches."""
        attrs = set(d.attributes)
        top = d.top_cause
        if self.phenotype and d.phenotype not in self.phenotype:
            return f"phenotype {d.phenotype.value} not in {_names(self.phenotype)}"
        if missing := [a for a in self.attributes if a not in attrs]:
            return f"attribute(s) {', '.join(missing)} absent"
        if self.any_attributes and not attrs.intersection(self.any_attributes):
            return f"none of the attributes {', '.join(self.any_attributes)} present"
        if present := [a for a in self.not_attributes if a in attrs]:
            return f"excluded attribute(s) {', '.join(present)} present"
        if self.top_cause and top not in self.top_cause:
            return f"top cause {top.value if top else 'none'} not in {_names(self.top_cause)}"
        if self.causes and not any(
            c.cause in self.causes and c.score >= self.min_cause_score for c in d.causes
        ):
            return f"no cause in {_names(self.causes)} with score >= {self.min_cause_score:g}"
        if self.severity_at_least is not None and d.severity.rank < self.severity_at_least.rank:
            return f"severity {d.severity.value} below {self.severity_at_least.value}"
        if self.evidence or self.not_evidence:
            found = findings(d)
            if self.evidence and not found.keys() & set(self.evidence):
                return f"no evidence of {', '.join(self.evidence)}"
            if present_ev := [f for f in self.not_evidence if f in found]:
                return f"excluded evidence {', '.join(present_ev)} present"
        for cond in self.metrics:
            if why := cond.miss(d):
                return why
        return None

    def describe(self) -> str:
        """The conditions in words (for "matched because ...")."""
        parts = []
        if self.phenotype:
            parts.append(f"phenotype in {_names(self.phenotype)}")
        if self.attributes:
            parts.append(f"attributes {', '.join(self.attributes)}")
        if self.any_attributes:
            parts.append(f"any of attributes {', '.join(self.any_attributes)}")
        if self.not_attributes:
            parts.append(f"not {', '.join(self.not_attributes)}")
        if self.top_cause:
            parts.append(f"top cause in {_names(self.top_cause)}")
        if self.causes:
            parts.append(f"a cause in {_names(self.causes)} scoring >= {self.min_cause_score:g}")
        if self.severity_at_least is not None:
            parts.append(f"severity >= {self.severity_at_least.value}")
        if self.evidence:
            parts.append(f"evidence of {' or '.join(self.evidence)}")
        if self.not_evidence:
            parts.append(f"no evidence of {', '.join(self.not_evidence)}")
        parts.extend(f"{c.metric} {c.op} {c.value:g}" for c in self.metrics)
        return " and ".join(parts) or "any incident"


def _names(values: list[Phenotype] | list[Cause]) -> str:
    return "[" + ", ".join(v.value for v in values) + "]"
