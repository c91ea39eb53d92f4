"""Permanent measures suggested by a postmortem: a registry from cause / attribute to advice.

Each suggestion names the concrete thing to add (a data rule, a per-rank monitor, an
update-ratio alert, a numeric unit test, a checkpoint check) and why this incident calls
for it, filled in from the diagnosis so it is never generic boilerplate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from supervisor.core.causes import PHENOTYPE_PRIOR
from supervisor.core.model import Cause, CauseScore, Diagnosis

_MIN_SCORE = 0.25


@dataclass(frozen=True, slots=True)
class Measure:
    kind: str
    action: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _data(d: Diagnosis) -> Measure:
    where = f"source `{d.source_local}`" if d.source_local else "the suspect batch"
    n = len(d.suspect_samples)
    samples = (
        f"the {n} suspect sample{'s' if n != 1 else ''} (IDs under root cause)"
        if n
        else "the suspect samples"
    )
    return Measure(
        "data_rule",
        f"Add a data rule for {where}: quarantine {samples} and filter their pattern "
        "(length, repetition, token-id range) in the loader; keep a per-source loss monitor.",
        "the top cause is data: one batch or source carried the spike",
    )


def _optimizer(d: Diagnosis) -> Measure:
    return Measure(
        "update_ratio_alert",
        "Alert on the update ratio ‖Δθ‖/‖θ‖ leaving its band, and review the LR peak and warmup length.",
        "an oversized update (optimizer / LR) is among the likely causes",
    )


def _numeric(d: Diagnosis) -> Measure:
    where = f"`{d.nonfinite_at}`" if d.nonfinite_at else "the module where the first NaN/Inf appeared"
    return Measure(
        "numeric_unit_test",
        f"Add a numeric unit test for {where}: run it in the training precision on the suspect batch and "
        "assert finite outputs and gradients; consider fp32 for that op.",
        "non-finite values or a numeric cause were found",
    )


def _distributed(d: Diagnosis) -> Measure:
    who = f"rank {d.first_rank}" if d.first_rank is not None else "one rank"
    return Measure(
        "per_rank_monitor",
        "Monitor loss and grad norm per rank against the other ranks, and compare parameter checksums "
        "across data-parallel ranks every few steps.",
        f"{who} deviated first",
    )


def _resume(d: Diagnosis) -> Measure:
    return Measure(
        "checkpoint_check",
        "Check checkpoints for completeness on save (optimizer, scheduler, scaler, RNG, data cursor) and "
        "compare the first steps after a resume against the metrics saved with the checkpoint.",
        "the spike began right after a checkpoint restore",
    )


def _metric(d: Diagnosis) -> Measure:
    return Measure(
        "metric_fix",
        "Log the token-weighted loss (loss_sum / tokens) and add a unit test of the loss reduction with "
        "padding and uneven batches.",
        "the spike is in how the metric was computed, not in training",
    )


#: cause -> suggestion; unknown causes get none (they are listed in the evidence instead).
BY_CAUSE: dict[Cause, Callable[[Diagnosis], Measure]] = {
    Cause.DATA: _data,
    Cause.OPTIMIZER: _optimizer,
    Cause.NUMERIC: _numeric,
    Cause.DISTRIBUTED: _distributed,
    Cause.RESUME_STATE: _resume,
    Cause.METRIC_ARTIFACT: _metric,
}

#: attribute -> suggestion, for what the curve showed regardless of the cause ranking.
BY_ATTRIBUTE: dict[str, Callable[[Diagnosis], Measure]] = {
    "nonfinite": _numeric,
    "rank_local": _distributed,
    "after_resume": _resume,
    "source_local": _data,
}


#: Steps named in an evidence sentence ("at step 221", "from step 160", "resumed at step 150").
_STEP = re.compile(r"\b(?:at|from) step (\d+)")


@dataclass(frozen=True, slots=True)
class RootCause:
    """The earliest evidence that explains the incident, and what followed from it."""

    cause: Cause
    step: int | None
    evidence: str
    consequences: list[str]

    def headline(self) -> str:
        return f"{self.cause.value}: {self.evidence}"

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause.value,
            "step": self.step,
            "evidence": self.evidence,
            "consequences": list(self.consequences),
        }


def _first_step(text: str) -> int | None:
    steps = [int(m) for m in _STEP.findall(text)]
    return min(steps) if steps else None


def root_cause(diagnosis: Diagnosis | None) -> RootCause | None:
    """The root cause is the first abnormal quantity: among the likely causes (score >=
    ``_MIN_SCORE``), the one whose evidence names the earliest step (an LR x25 at step 221 comes
    before the update-ratio jump and the loss peak it caused); at the same step, the higher score.
    The phenotype's own sentence (the loss curve) is a symptom, never a root. Later evidence of
    every cause is listed as consequences, in step order. None without a diagnosis or causes."""
    if diagnosis is None or not diagnosis.causes:
        return None
    likely = [c for c in diagnosis.causes if c.score >= _MIN_SCORE] or diagnosis.causes[:1]
    found: list[tuple[int, int, CauseScore, str]] = []
    for rank, cs in enumerate(likely):
        for line in cs.evidence[1:] if _is_prior(cs, diagnosis) else cs.evidence:
            step = _first_step(line)
            if step is not None:
                found.append((step, rank, cs, line))
    if not found:
        top = diagnosis.causes[0]
        return RootCause(top.cause, None, top.evidence[0] if top.evidence else top.cause.value, [])
    found.sort(key=lambda x: (x[0], x[1]))
    step, _, cs, line = found[0]
    later = [f"{c.cause.value}: {t}" for s, _, c, t in found[1:] if t != line]
    return RootCause(cs.cause, step, line, later)


def _is_prior(cs: CauseScore, d: Diagnosis) -> bool:
    """The cause's first sentence is the phenotype's description of the loss curve (the prior)."""
    return PHENOTYPE_PRIOR.get(d.phenotype) is cs.cause and bool(cs.evidence)


def suggest(diagnosis: Diagnosis | None, earlier_signal: str | None = None) -> list[Measure]:
    """Measures for this incident, most important first, one per kind: the root cause's first
    (``root_cause``: the earliest evidence), then the other likely causes'."""
    out: list[Measure] = []
    if diagnosis is not None:
        causes = [c for c in diagnosis.causes if c.score >= _MIN_SCORE] or diagnosis.causes[:1]
        root = root_cause(diagnosis)
        if root is not None:
            causes.sort(key=lambda c: c.cause is not root.cause)
        out += [BY_CAUSE[c.cause](diagnosis) for c in causes if c.cause in BY_CAUSE]
        out += [BY_ATTRIBUTE[a](diagnosis) for a in diagnosis.attributes]
    if earlier_signal in ("grad_norm", "update_ratio"):
        out.append(
            Measure(
                "update_ratio_alert",
                f"Alert on {earlier_signal} as well as the loss: it left its band before the loss did.",
                f"{earlier_signal} would have caught this incident earlier",
            )
        )
    unique: dict[str, Measure] = {}
    for measure in out:
        unique.setdefault(measure.kind, measure)
    return list(unique.values())
