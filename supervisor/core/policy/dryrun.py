"""The dry run behind `supervisor policy explain`: plan every incident of a trace, in order.

Differences from the live supervisor (so a reader knows what the dry run cannot show):
checkpoints come from the trace's `checkpoint_saved` events (or an assumed interval) and
are taken as healthy unless they fall inside an incident; every plan is assumed to run
and succeed (attempts are counted, observation windows never fail); nothing is executed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.model import Diagnosis, HealthMark
from supervisor.core.policy.engine import plan
from supervisor.core.policy.plan import CheckpointRef, JobState, Plan
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
        last = max((r.step for r in recs), default=0)
        steps = set(range(0, last + 1, every))
    else:
        steps = {r.step for r in recs if "checkpoint_saved" in r.events}
    windows = [(d.onset_step, d.end_step if d.end_step is not None else d.peak_step) for d in incidents]

    def mark(step: int) -> HealthMark:
        inside = any(lo <= step <= hi for lo, hi in windows)
        return HealthMark.VERIFIED if inside else HealthMark.HEALTHY

    return tuple(CheckpointRef(s, mark(s)) for s in sorted(steps))


def dry_run(
    policy: Policy, incidents: Sequence[Diagnosis], checkpoints: Sequence[CheckpointRef]
) -> list[ExplainedIncident]:
    """Plan each incident with the state the live supervisor would have had at its detection."""
    attempts: dict[str, int] = {}
    last_end: int | None = None
    out = []
    for i, d in enumerate(sorted(incidents, key=lambda x: x.onset_step), 1):
        step = d.detected_step if d.detected_step is not None else d.peak_step
        state = JobState(
            step=step,
            attempts=attempts,
            steps_since_last_incident=None if last_end is None else max(0, d.onset_step - last_end),
            checkpoints=tuple(c for c in checkpoints if c.step <= step),
            state_maybe_nonfinite=d.nonfinite,
        )
        p = plan(d, state, policy)
        out.append(ExplainedIncident(i, d, state, p))
        if p.rule is not None and not p.escalates:
            attempts = {**attempts, p.rule: p.attempt}
        last_end = d.end_step if d.end_step is not None else d.peak_step
    return out
