"""Pure decisions the runtime asks for between plans: reopen an incident? re-make a plan?

- ``reopens``: a new incident near a resolved one is that incident coming back (same id,
  next attempt), within ``recurrence.reopen_within_steps`` of its onset or of the end of its
  observation window. A recurrence is never folded into an unrelated incident.
- ``replan_reason``: when the diagnosis changes before the plan's first irreversible action,
  the plan is re-made; this says whether the new plan differs and why, in one sentence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
