"""The dry run behind `supervisor policy explain`: plan every incident of a trace, in order.

What it cannot show: checkpoints come from the trace's `checkpoint_saved` events (or an assumed
interval), healthy unless inside an incident; every plan is assumed to run and succeed (attempts
counted, observation windows never fail, an incident near a resolved one reopens it); nothing is
executed. The job's LR, grad clip and grad norm come from its records before each onset.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.core.model import Diagnosis, HealthMark
from supervisor.core.policy.engine import plan
from supervisor.core.policy.evidence import nonfinite_skipped
from supervisor.core.policy.plan import CheckpointRef, JobState, Plan, Supervision
from supervisor.core.policy.recurrence import Resolved, reopens
from supervisor.core.policy.schema import Policy
from supervisor.core.records import Record


@dataclass(frozen=True, slots=True)
class ExplainedIncident:
    index: int
    diagnosis: Diagnosis
    state: JobState
    plan: Plan

    def to_json(self) -> dict[str, Any]:
        return {
            "incident": self.index,
            "diagnosis": self.diagnosis.to_json(),
            "state": self.state.to_json(),
            "plan": self.plan.to_json(),
        }


def checkpoints_from_records(
    records: Iterable[Record], incidents: Sequence[Diagnosis], every: int | None = None
) -> tuple[CheckpointRef, ...]:
    """Checkpoints seen in the trace (or every `every` steps when given); inside an incident: verified only."""
    recs = list(records)
    if every:
        # The multiples of `every` that training passed through, one per record at most:
        # never a range sized by the largest step (a hostile step 1e30 once took 5.6 GB).
        steps = {0} | {r.step - r.step % every for r in recs if r.step >= 0}
    else:
        steps = {r.step for r in recs if "checkpoint_saved" in r.events}
        # An asynchronous save is reported when it committed, in a later record: checkpoint_saved:<step>.
        steps |= {
            int(e[17:])
            for r in recs
            for e in r.events
            if e.startswith("checkpoint_saved:") and e[17:].isdigit()
        }
    windows = [(d.onset_step, d.end_step if d.end_step is not None else d.peak_step) for d in incidents]

    def mark(step: int) -> HealthMark:
        inside = any(lo <= step <= hi for lo, hi in windows)
        return HealthMark.VERIFIED if inside else HealthMark.HEALTHY

    return tuple(CheckpointRef(s, mark(s)) for s in sorted(steps))


def job_values(
    records: Sequence[Record], before_step: int, grad_clip: float | None = None
) -> tuple[float | None, float | None, float | None]:
    """What the job ran just before ``before_step``, from its records: (the LR of the last step, the
    clip it logged, the median grad norm of 100 steps)."""
    pre = [r for r in records if r.step < before_step]
    lrs = [r.lr for r in pre if r.lr is not None and math.isfinite(r.lr)]
    norms = [r.grad_norm for r in pre[-400:] if r.grad_norm is not None and math.isfinite(r.grad_norm)]
    clips = [float(c) for r in pre if isinstance(c := r.attrs.get("grad_clip"), int | float)]
    clip = grad_clip if grad_clip is not None else (clips[-1] if clips else None)
    return lrs[-1] if lrs else None, clip, statistics.median(norms[-100:]) if norms else None


def dry_run(
    policy: Policy,
    incidents: Sequence[Diagnosis],
    checkpoints: Sequence[CheckpointRef],
    records: Sequence[Record] = (),
    *,
    grad_clip: float | None = None,
    supervision: Supervision = "steer",
    can_replay: bool | None = None,
    checkpoint_every: int | None = None,
    max_steps: int | None = None,
) -> list[ExplainedIncident]:
    """Plan each incident with the state the live supervisor would have had at its detection."""
    attempts: dict[str, int] = {}
    last_end: int | None = None
    resolved: list[Resolved] = []
    rank_incidents: list[tuple[int, int]] = []
    recs = sorted(records, key=lambda r: r.step)
    out = []
    for i, d in enumerate(sorted(incidents, key=lambda x: x.onset_step), 1):
        step = d.detected_step if d.detected_step is not None else d.peak_step
        again = reopens(resolved, d.onset_step, policy.recurrence)
        lr, clip, norm = job_values(recs, d.onset_step, grad_clip)
        state = JobState(
            step=step,
            attempts=attempts,
            steps_since_last_incident=None if last_end is None else max(0, d.onset_step - last_end),
            checkpoints=tuple(c for c in checkpoints if c.step <= step),
            state_maybe_nonfinite=d.nonfinite and not nonfinite_skipped(d),
            lr=lr,
            grad_clip=clip,
            grad_norm=norm,
            supervision=supervision,
            incident_attempt=again[0].attempts if again else 0,
            rank_incidents=tuple(rank_incidents),
            can_replay=can_replay,
            checkpoint_every=checkpoint_every,
            max_steps=max_steps,
        )
        p = plan(d, state, policy)
        if again is not None:
            p = replace(p, notes=(*p.notes, again[1]))
            resolved.remove(again[0])
        out.append(ExplainedIncident(i, d, state, p))
        if p.rule is not None and not p.escalates:
            attempts = {**attempts, p.rule: p.attempt}
        if d.rank_local and d.first_rank is not None:
            rank_incidents.append((d.onset_step, d.first_rank))
        last_end = d.end_step if d.end_step is not None else d.peak_step
        if not p.escalates:
            observe = p.action("observe")
            end = None
            if observe is not None and observe.params.get("cover_until_step") is not None:
                end = max(int(observe.params["cover_until_step"]), step + int(observe.params["steps"]))
            if again is None:
                resolved.append(Resolved(i, d.onset_step, end, 1))
            else:
                first = again[0]
                resolved.append(Resolved(first.incident_id, first.onset_step, end, first.attempts + 1))
    return out
