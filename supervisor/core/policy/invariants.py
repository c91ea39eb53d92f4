"""Safety rules the engine enforces whatever a policy says.

They are numbered as in docs/policies.md ("Invariants the engine enforces"). Each function
takes the rule's action list and returns the adjusted list plus notes; an entry's ``inserted``
says why the engine added or moved it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.core.model import Cause, Diagnosis, Phenotype
from supervisor.core.policy.actions import ACTIONS, CONTINUES, TERMINAL
from supervisor.core.policy.evidence import data_fault, nonfinite_skipped, state_suspect
from supervisor.core.policy.plan import JobState, PlannedAction
from supervisor.core.policy.schema import ActionSpec


@dataclass(frozen=True, slots=True)
class Step:
    spec: ActionSpec
    inserted: str | None = None


def metric_artifact_only(steps: list[Step]) -> tuple[list[Step], list[str]]:
    """Invariant 1 (for a top cause of metric_artifact): keep only the alert, adding one if missing."""
    alerts = [s for s in steps if s.spec.action == "alert"][:1]
    dropped = [s.spec.action for s in steps if s not in alerts]
    if not alerts:
        why = "top cause is metric_artifact: alert only"
        alerts = [Step(ActionSpec.model_validate("alert"), why)]
    notes = []
    if dropped:
        notes.append(
            f"top cause is metric_artifact: the spike is in how the metric is computed, not in the model; "
            f"dropped {', '.join(dropped)} (never rollback or apply on a metric artifact)"
        )
    return alerts, notes


def state_suspect_reason(d: Diagnosis, state: JobState) -> str | None:
    """Why the weights or optimizer moments cannot be trusted (non-finite, LR or update jump), or None."""
    skipped = d.nonfinite and nonfinite_skipped(d)
    if d.nonfinite and not skipped:
        where = f" (first at {d.nonfinite_at})" if d.nonfinite_at else ""
        return f"NaN/Inf seen{where}"
    if state.state_maybe_nonfinite and not skipped:  # the flag is d.nonfinite
        return "the job state reports possibly non-finite weights or optimizer moments"
    if d.phenotype is Phenotype.DIVERGENCE and d.top_cause is Cause.NUMERIC:
        return "numeric divergence"
    if found := state_suspect(d):
        name, sentence = next(iter(found.items()))
        return f"{name.replace('_', ' ')} ({sentence})"
    if state.observation_failures:
        # The fix did not hold, and the weights trained on through the failed window: whatever
        # the first reading said, the state is no longer one to go on from.
        return (
            f"the observation window failed {state.observation_failures} time(s) after this "
            "incident's fix: the state trained through it is not vouched for"
        )
    return None


#: The fix the engine adds after a rollback when the rule names none: re-warm the LR from the
#: rollback target to the onset, so the steps that blew up are re-run at a lower LR and the
#: schedule is back on plan from the onset on.
DEFAULT_FIX = {"apply": {"warmup_steps": "to_onset"}}


def fix_after_rollback(steps: list[Step], d: Diagnosis, state: JobState) -> tuple[list[Step], list[str]]:
    """Invariant 2, second half: a state-suspect incident gets a fix after its rollback."""
    names = [s.spec.action for s in steps]
    if "rollback" not in names or state_suspect_reason(d, state) is None:
        return steps, []
    first = names.index("rollback")
    if "apply" in names[first:]:
        return steps, []
    go = next((i for i, n in enumerate(names) if i > first and n in CONTINUES), len(names))
    if go == len(names) and TERMINAL.intersection(names):
        return steps, []  # the rule hands over to a person: no fix to add
    out = list(steps)
    why = "a rollback alone re-runs the same recipe: re-warm the LR through the steps that blew up"
    out.insert(go, Step(ActionSpec.model_validate(DEFAULT_FIX), why))
    return out, [f"apply inserted after the rollback: {why}"]


def rollback_before_continuing(
    steps: list[Step], d: Diagnosis, state: JobState
) -> tuple[list[Step], list[str]]:
    """Invariant 2: no apply/observe/resume on a suspect state (non-finite, LR/update jump) before a rollback."""
    why = state_suspect_reason(d, state)
    names = [s.spec.action for s in steps]
    first_go = next((i for i, n in enumerate(names) if n in CONTINUES), None)
    if first_go is None and not TERMINAL.intersection(names):
        first_go = len(names)  # an alert-only plan lets training go on too
    if why is None or first_go is None or "rollback" in names[:first_go]:
        return steps, []
    out = list(steps)
    later = next((s for s in out[first_go:] if s.spec.action == "rollback"), None)
    reason = f"{why}: lowering the LR and continuing is never a fix; roll back first"
    where = repr(names[first_go]) if first_go < len(names) else "training goes on"
    if later is not None:
        out.remove(later)
        rollback = Step(later.spec, f"moved before {where}: {reason}")
    else:
        rollback = Step(ActionSpec.model_validate("rollback"), reason)
    out.insert(first_go, rollback)
    notes = [f"rollback {'moved' if later else 'inserted'} before {where}: {reason}"]
    if "freeze" not in names[:first_go]:
        out.insert(first_go, Step(ActionSpec.model_validate("freeze"), "stop updates before rollback"))
        notes.append("freeze inserted before the rollback")
    return out, notes


def block_before_rollback(steps: list[Step]) -> tuple[list[Step], list[str]]:
    """Invariant 3: `latest` is blocked before the first rollback."""
    names = [s.spec.action for s in steps]
    if "rollback" not in names:
        return steps, []
    first = names.index("rollback")
    if "block_latest" in names[:first]:
        return steps, []
    # None precedes the rollback, so dropping later ones leaves `first` where it was.
    out = [s for s in steps if s.spec.action != "block_latest"]
    reason = "block_latest must precede any rollback so `latest` cannot advance past the incident"
    out.insert(first, Step(ActionSpec.model_validate("block_latest"), reason))
    moved = "block_latest" in names
    return out, [f"block_latest {'moved' if moved else 'inserted'} before rollback"]


def release_after_freeze(steps: list[Step]) -> tuple[list[Step], list[str]]:
    """A plan that froze training and does not hand over ends by releasing it (observe or resume)."""
    names = [s.spec.action for s in steps]
    if "freeze" not in names or TERMINAL.intersection(names):
        return steps, []
    last = len(names) - 1 - names[::-1].index("freeze")
    if any(ACTIONS[n].releases_freeze for n in names[last:]):
        return steps, []
    why = "the plan froze training and hands nothing over: release it at the end"
    return [*steps, Step(ActionSpec.model_validate("resume"), why)], [f"resume appended: {why}"]


def rollback_dispensable(d: Diagnosis) -> str | None:
    """Why the incident can go on without the rollback its plan asked for, or None: a transient (or
    one occurrence of a recurring data fault, ``evidence.data_fault``) left no trend to undo, so with
    no checkpoint to go back to its batch is kept out and a window watched. A state that took a
    broken step fails that window at once, which is re-planned and escalates: what a missing
    checkpoint costs is bounded, never the job stopped."""
    if d.phenotype is Phenotype.TRANSIENT:
        return "the incident is a transient (back in band): nothing after the onset needs undoing to go on"
    recurring = data_fault(d)
    if recurring is not None:
        # Each occurrence of a data fault that recurs at its data's period came back by itself (that
        # is how the period was seen); its source is kept out, and the window judges the state.
        return f"one occurrence of a data fault that recurs ({recurring}): nothing after the onset needs undoing to go on"
    return None


#: Findings that the weights kept an abnormal step: an update applied at the wrong size stays in
#: the state when the loss comes back into band, as a NaN the optimizer skipped does not.
KEPT_IN_WEIGHTS = ("lr_jump", "update_jump")


def weights_kept(d: Diagnosis) -> str | None:
    """The evidence that the weights kept the incident's abnormal step, or None. A transient with it
    still has something after its onset to undo: where the run's start is a target (a young run),
    starting over costs fewer steps than training on from a state that took the step."""
    found = state_suspect(d)
    kept = [f"{k} ({found[k]})" for k in KEPT_IN_WEIGHTS if k in found]
    return "the weights kept the abnormal step: " + "; ".join(kept) if kept else None


def without_rollback(steps: list[Step], why: str, cause: str) -> tuple[list[Step], list[str]]:
    """The plan with its rollbacks dropped (no target: ``cause``) and, when nothing watches the
    state it goes on from, an observation window before training goes on."""
    out = [s for s in steps if s.spec.action != "rollback"]
    notes = [f"rollback dropped: {cause}; {why}"]
    names = [s.spec.action for s in out]
    if "observe" not in names and not TERMINAL.intersection(names):
        at = names.index("resume") if "resume" in names else len(out)
        reason = "no rollback was possible: watch the state training goes on from"
        out.insert(at, Step(ActionSpec.model_validate("observe"), reason))
        notes.append(f"observe inserted: {reason}")
    return out, notes


def rollback_reruns_occurrence(actions: Sequence[PlannedAction], d: Diagnosis, state: JobState) -> str | None:
    """Invariant 7: why the plan's rollback would re-run an earlier occurrence of this data fault
    (``JobState.earlier_onsets``), or None. Only a data fault (``evidence.data_fault``) is kept
    from going back: anything else that needs a rollback before its onset gets one."""
    earlier = [s for s in state.earlier_onsets if s < d.onset_step]
    if not earlier or (why := data_fault(d)) is None:
        return None
    prev = max(earlier)
    for a in actions:
        if a.name != "rollback":
            continue
        target = a.params.get("target_step")
        bound = a.params.get("max_target_step") if target is None else target  # unknown: the newest it may be
        if isinstance(bound, int) and bound < prev:
            what = f"target {bound}" if target is not None else f"newest possible target {bound}"
            return (
                f"its {what} lies before step {prev}, an earlier occurrence of this incident's data fault "
                f"({why}): a rollback re-serves the data in the same order, so the re-run would meet it again"
            )
    return None


#: Why an occurrence of a data fault goes on without the rollback that would re-run an earlier one.
RECURS_WHERE_IT_IS = (
    "the occurrence is back in band: its data is kept out where it recurs and a window judges the state"
)
