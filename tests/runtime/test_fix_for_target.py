"""Issue 29 point 5: a rollback that passed over a corrupt planned target for an older one gets
its re-warm ("from the rollback target to the onset") computed for the target actually used.

``PlanRunner`` on a real incident store, with the rollback's outcome recorded as a restarted or
running supervisor finds it; the runtime is a stub, and the directive is the effect it gets back.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from supervisor.core.policy.plan import Plan, PlannedAction
from supervisor.incidents import EventKind, IncidentStore
from supervisor.runtime.controller import _machinery_diagnosis
from supervisor.runtime.effects import BeginAction, Issue, MoveIncident
from supervisor.runtime.plans import PlanRunner, action_id, move
from supervisor.runtime.state import ActivePlan


def runner_at_apply(
    tmp_path: Path, used: int, warmup: int = 20
) -> tuple[PlanRunner, ActivePlan, Any, list[Any], Any]:
    store = IncidentStore(tmp_path / "incidents.db")
    inc = store.open_incident("job", _machinery_diagnosis(80, None, "spike"))
    rollback = PlannedAction("rollback", {"margin_steps": 10, "max_target_step": 70, "target_step": 60,
                                          "min_mark": "healthy"}, "newest healthy")  # fmt: skip
    apply = PlannedAction(
        "apply", {"lr_scale": 0.5, "warmup_steps": warmup}, "re-warm from the rollback target"
    )
    plan = Plan(policy="p", rule="r", matched_because="test", actions=(rollback, apply))
    active = ActivePlan(incident_id=inc.id, plan_no=1, plan=plan, index=1)
    ev = store.begin(inc.id, EventKind.ROLLED_BACK, actor="supervisor", step=90,
                     payload={"action": "rollback"}, action_id=action_id(active, 0, "rollback"))  # fmt: skip
    store.finish(ev.id, result={"to_step": used, "onset_step": 80, "from_step": 90})
    issued: list[Any] = []
    rt = SimpleNamespace(current_step=90, issued=issued, batch_range=lambda a, b: (a, b))
    runner = PlanRunner(store)
    return runner, active, store, issued, rt


def advance(runner: PlanRunner, active: ActivePlan, rt: Any, store: IncidentStore) -> None:
    """One step of the runner, with the incident store's effects carried out as the controller does
    (a directive issued lands in ``rt.issued``)."""
    while True:
        step = runner.advance(active, rt)
        for e in step.effects:
            if isinstance(e, MoveIncident):
                move(store, e.incident, e.to, e.reason, e.step)
            elif isinstance(e, BeginAction):
                store.begin(e.incident, e.kind, actor="supervisor", step=e.step, payload=e.payload,
                            action_id=e.action_id)  # fmt: skip
            elif isinstance(e, Issue):
                rt.issued.append(e.directive)
        if not step.again:
            return


def test_the_rewarm_is_recomputed_for_the_older_target_the_rollback_used(tmp_path: Path) -> None:
    runner, active, store, issued, rt = runner_at_apply(tmp_path, used=40)
    advance(runner, active, rt, store)
    event = store.event_for_action(active.incident_id, action_id(active, 1, "apply"))
    assert event is not None and event.payload["params"]["warmup_steps"] == 40  # 80 - 40, not 80 - 60
    assert event.payload["params"]["recomputed_for_target"]["planned_target"] == 60
    [directive] = issued
    assert directive.warmup_steps == 40 and directive.lr_scale == 0.5


def test_a_rollback_to_the_planned_target_or_a_rewarm_of_its_own_length_is_left_alone(tmp_path: Path) -> None:
    for used, warmup, sub in ((60, 20, "same"), (40, 15, "own")):
        runner, active, store, issued, rt = runner_at_apply(tmp_path / sub, used=used, warmup=warmup)
        advance(runner, active, rt, store)
        event = store.event_for_action(active.incident_id, action_id(active, 1, "apply"))
        assert event is not None and event.payload["params"] == {"lr_scale": 0.5, "warmup_steps": warmup}
