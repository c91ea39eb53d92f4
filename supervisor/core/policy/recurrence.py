"""Pure decisions the runtime asks for between plans: reopen an incident? re-make a plan?

- ``reopens``: a new incident near a resolved one is that incident coming back (same id,
  next attempt), within ``recurrence.reopen_within_steps`` of its onset or of the end of its
  observation window. A recurrence is never folded into an unrelated incident.
- ``occurrence_after``: a periodic chain's occurrence after its incident was resolved (or while
  it is observed) is a recurrence to record and fix where it recurs, never silent: it carries
  this occurrence's own numbers (onset, detection, suspects, source) and the exclusion that
  covers it (``Occurrence.exclusion``), for the runtime to record and apply.
- ``replan_reason``: when the diagnosis changes before the plan's first irreversible action,
  the plan is re-made; this says whether the new plan differs and why, in one sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.model import Diagnosis
from supervisor.core.policy.actions import ACTIONS
from supervisor.core.policy.plan import Plan
from supervisor.core.policy.settings import Recurrence


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolved incident as the recurrence check needs it."""

    incident_id: int
    onset_step: int
    window_end_step: int | None = None
    attempts: int = 1


def reopens(resolved: Iterable[Resolved], onset_step: int, rec: Recurrence) -> tuple[Resolved, str] | None:
    """(the incident this onset reopens, why) or None; the nearest one wins."""
    if rec.reopen_within_steps <= 0:
        return None
    best: tuple[int, Resolved, str] | None = None
    for r in resolved:
        anchors = [("onset", r.onset_step)]
        if r.window_end_step is not None:
            anchors.append(("observation window end", r.window_end_step))
        for what, step in anchors:
            gap = abs(onset_step - step) if what == "onset" else onset_step - step
            if 0 <= gap <= rec.reopen_within_steps and (best is None or gap < best[0]):
                why = (
                    f"onset {onset_step} is {gap} steps from incident {r.incident_id}'s {what} {step} "
                    f"(recurrence.reopen_within_steps={rec.reopen_within_steps}): reopened as attempt "
                    f"{r.attempts + 1}"
                )
                best = (gap, r, why)
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One more occurrence of a recurring fault, with its own numbers (never the first one's)."""

    incident_id: int
    onset_step: int
    detected_step: int | None
    number: int  # 1-based: the chain's n-th occurrence
    period: int | None
    suspect_samples: tuple[str, ...]
    source: str | None
    rank: int | None

    def exclusion(self) -> dict[str, Any]:
        """The ``apply`` exclusion that covers this occurrence: its samples, its source, its steps."""
        out: dict[str, Any] = {"samples": list(self.suspect_samples)}
        if self.source is not None:
            out["sources"] = [self.source]
        out["batch_range"] = [self.onset_step, (self.detected_step or self.onset_step) + 1]
        return out

    def message(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        src = f", source `{self.source}`" if self.source else ""
        every = f" (every {self.period} steps)" if self.period else ""
        det = f", detected at step {self.detected_step}" if self.detected_step is not None else ""
        return (
            f"incident {self.incident_id} recurred: occurrence {self.number}{every} from step "
            f"{self.onset_step}{where}{det}{src}; {len(self.suspect_samples)} suspect samples of this occurrence"
        )


def occurrence_after(
    resolved: Resolved, d: Diagnosis, occurrences: Sequence[int], detected_step: int | None = None
) -> Occurrence | None:
    """The latest occurrence of ``d``'s chain (``occurrences``: its onsets, the latest last) when it
    began after ``resolved`` was handled (after its observation window's end, or after its onset
    while no window ended yet); None when there is none. The suspects are the diagnosis's own,
    the latest occurrence's first (``core.periodic``)."""
    if not occurrences:
        return None
    onset = int(occurrences[-1])
    since = resolved.window_end_step if resolved.window_end_step is not None else resolved.onset_step
    if onset <= since:
        return None
    return Occurrence(
        incident_id=resolved.incident_id,
        onset_step=onset,
        detected_step=detected_step if detected_step is not None else d.detected_step,
        number=len(occurrences),
        period=d.period,
        suspect_samples=tuple(d.suspect_samples),
        source=d.source_local,
        rank=d.first_rank if d.rank_local else None,
    )


def first_irreversible(plan: Plan) -> int | None:
    """Index of the plan's first action the action table marks ``irreversible``, or None."""
    return next((i for i, a in enumerate(plan.actions) if ACTIONS[a.name].irreversible), None)


def replan_reason(old: Plan, new: Plan, done: int) -> str | None:
    """Why ``new`` replaces ``old`` when ``done`` actions of ``old`` have run; None: keep ``old``.

    Only before the first irreversible action: after it, the old plan is carried through
    and a failed observation window re-plans instead.
    """
    cut = first_irreversible(old)
    if cut is not None and done > cut:
        return None
    if (old.rule, old.action_names, set(old.evidence)) == (new.rule, new.action_names, set(new.evidence)):
        return None
    ev_old = ", ".join(old.evidence) or "none"
    ev_new = ", ".join(new.evidence) or "none"
    return (
        f"diagnosis changed before the first irreversible action: rule {old.rule or 'fallback'} -> "
        f"{new.rule or 'fallback'}, evidence [{ev_old}] -> [{ev_new}]"
    )
