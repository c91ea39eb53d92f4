"""What the diagnosis found, as named findings a rule can match and the engine can enforce.

The phenotype is a reading of the curve at one instant (a divergence reads `slow_recovery` a few
steps earlier); the causes' evidence are measured facts that do not flip with timing, so a plan
follows them: ``lr_jump`` (the LR changed abruptly or rose far above its level), ``update_jump`` (one
oversized step), ``nonfinite``, ``checksum``, where the fault is confined (``rank_local``,
``source_local``, ``after_resume``), and ``skipped_step`` (every non-finite step was skipped: no
weights changed, so the batch alone is the fix). The patterns below read the sentences
``supervisor.core.causes`` writes; tests/core (test_run_extremes.py, test_warmup_schedule.py,
test_stalled_source.py) read the findings of the real detector, so a rewording cannot silently
break the link.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from supervisor.core.model import Cause, Diagnosis, Phenotype

Finding = Literal[
    "lr_jump",
    "update_jump",
    "nonfinite",
    "rank_local",
    "source_local",
    "after_resume",
    "checksum",
    "skipped_step",
]
FINDINGS: tuple[str, ...] = get_args(Finding)

#: Findings that mean the optimizer state or its last updates are suspect: they always get a
#: rollback to before the onset plus a fix, whatever the phenotype reads.
STATE_SUSPECT = ("lr_jump", "update_jump", "nonfinite")

#: Finding -> (the evidence sentence that shows it, the causes whose evidence may hold it).
_PATTERNS: dict[str, tuple[str, tuple[Cause, ...]]] = {
    "lr_jump": (r"^learning rate ", (Cause.OPTIMIZER,)),
    "update_jump": (r"^update ratio \S+x its level", (Cause.OPTIMIZER, Cause.RESUME_STATE)),
    "nonfinite": (r"^non-finite values first at step", (Cause.NUMERIC,)),
    "checksum": (r"^param fingerprints of ranks", (Cause.DISTRIBUTED,)),
    "skipped_step": (r"^the non-finite step \d+ was skipped", (Cause.NUMERIC,)),
}


def findings(d: Diagnosis) -> dict[str, str]:
    """Finding name -> the evidence sentence (or attribute) behind it, in a stable order."""
    found: dict[str, str] = {}
    for name, (pattern, where) in _PATTERNS.items():
        hits = (e for cs in d.causes if cs.cause in where for e in cs.evidence if re.search(pattern, e, re.I))
        if (hit := next(hits, None)) is not None:
            found[name] = hit
    if d.nonfinite:
        found.setdefault(
            "nonfinite", f"NaN/Inf seen{f' first at {d.nonfinite_at}' if d.nonfinite_at else ''}"
        )
    if d.rank_local:
        found["rank_local"] = (
            f"rank {d.first_rank} deviated first" if d.first_rank is not None else "one rank"
        )
    if d.source_local:
        found["source_local"] = f"confined to source {d.source_local}"
    if d.after_resume:
        found["after_resume"] = "began within a few steps of a checkpoint restore"
    return {k: found[k] for k in FINDINGS if k in found}


def data_recurrence(d: Diagnosis) -> str | None:
    """Why the incident's evidence points at its data rather than at the rank it appeared on, or None.

    A fault that comes back at a fixed period with samples named each time is data coming around
    again (a shard, a bucket): the bad samples move with the data, and the rank's other steps are
    normal. A faulty device does not keep the data's period, and it shows as non-finite values or
    disagreeing replicas, which no data evidence explains away."""
    found = findings(d)
    if d.phenotype is not Phenotype.PERIODIC or not d.period or d.top_cause is not Cause.DATA:
        return None
    if not d.suspect_samples or {"nonfinite", "checksum"} & found.keys():
        return None
    return (
        f"it recurs every {d.period} steps with its data (top cause data, "
        f"{len(d.suspect_samples)} suspect samples named)"
    )


def data_fault(d: Diagnosis) -> str | None:
    """Why the incident reads as bad data that comes back where the data does, or None.

    Top cause data with its samples named, back in band (a transient or one occurrence of a
    periodic chain), and nothing that data does not explain: no NaN/Inf, no disagreeing replicas, no
    LR jump. One garbage batch may move the update ratio: that is still the batch's doing."""
    if d.top_cause is not Cause.DATA or not d.suspect_samples:
        return None
    if d.phenotype not in (Phenotype.TRANSIENT, Phenotype.PERIODIC):
        return None
    if {"nonfinite", "checksum", "lr_jump"} & findings(d).keys():
        return None
    return f"top cause data, {len(d.suspect_samples)} suspect samples named, back in band"


def state_suspect(d: Diagnosis) -> dict[str, str]:
    """The findings that require a rollback before the onset plus a fix. A non-finite step that was
    skipped changed no weights: it is no such finding (unless the incident went on diverging)."""
    found = findings(d)
    skipped = nonfinite_skipped(d, found)
    return {k: v for k, v in found.items() if k in STATE_SUSPECT and not (k == "nonfinite" and skipped)}


def nonfinite_skipped(d: Diagnosis, found: dict[str, str] | None = None) -> bool:
    """Every non-finite step of a transient incident was skipped: the weights never saw it."""
    found = findings(d) if found is None else found
    return "skipped_step" in found and d.phenotype is Phenotype.TRANSIENT
