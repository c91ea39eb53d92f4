"""The action table (docs/architecture.md, "The action table"): one row per action, read by everyone."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.core.policy.actions import ACTIONS, TERMINAL, names_where
from supervisor.core.policy.args import Args
from supervisor.core.policy.plan import Plan, PlannedAction
from supervisor.core.policy.recurrence import first_irreversible, replan_reason
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.actions import REGISTRY

PKG = Path(__file__).resolve().parents[2] / "supervisor"
TABLE = PKG / "core" / "policy" / "actions.py"
#: Literal lists of action names that are not what an action means: a drill's kill points per stage.
NOT_MEANINGS = {PKG / "drills" / "kill.py"}


def _trees() -> list[tuple[Path, ast.AST]]:
    return [(f, ast.parse(f.read_text())) for f in sorted(PKG.rglob("*.py"))]


def _action_literal(node: ast.expr) -> str | None:
    """The action name a spec literal names: ``"freeze"`` or ``{"escalate": {...}}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Dict) and len(node.keys) == 1 and isinstance(node.keys[0], ast.Constant):
        return str(node.keys[0].value)
    return None


def test_every_action_the_engine_or_runtime_plans_is_in_the_table() -> None:
    emitted: set[str] = set()
    for f, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            fn = node.func
            callee = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
            if (owner, callee) == ("ActionSpec", "model_validate") or callee == "PlannedAction":
                name = _action_literal(node.args[0])
                if name is not None:
                    assert name in ACTIONS, (
                        f"{f.relative_to(PKG.parent)}:{node.lineno} plans unknown {name!r}"
                    )
                    emitted.add(name)
    # The engine inserts these itself (escalation, invariants), whatever the policy says.
    assert {"freeze", "alert", "escalate", "rollback", "block_latest", "resume"} <= emitted
    assert set(REGISTRY) == set(ACTIONS) and all(issubclass(k.args, Args) for k in ACTIONS.values())


def test_no_list_of_action_names_outside_the_table() -> None:
    """What an action means is read from its row, never from a literal list of names elsewhere."""
    names = set(ACTIONS)
    for f, tree in _trees():
        if f == TABLE or f in NOT_MEANINGS:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Set | ast.Tuple | ast.List):
                continue
            items = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(items) == len(node.elts) >= 2 and set(items) <= names:
                raise AssertionError(
                    f"{f.relative_to(PKG.parent)}:{node.lineno} lists actions {items}: read the action "
                    "table (supervisor/core/policy/actions.py) instead"
                )


def test_each_row_names_a_real_event_and_incident_state() -> None:
    for name, kind in ACTIONS.items():
        assert REGISTRY[name].event is EventKind(kind.event)
        assert kind.enters is None or REGISTRY[name].state is IncidentState(kind.enters)
        assert not (kind.ends_plan and kind.continues), name
    assert {"escalate", "stop"} == TERMINAL
    # Each skipped effect that leaves the fault unhandled is one that changes the ranks' state.
    assert names_where("needs_workers") == {"freeze", "snapshot", "rollback", "apply"}


PARAMS = {
    "observe": {"steps": 100, "baseline_until_step": 200},
    "rollback": {"margin_steps": 100, "max_target_step": 100},
    "apply": {"warmup_steps": 100},
}


def _plan(*names: str, rule: str = "r") -> Plan:
    actions = tuple(PlannedAction(n, PARAMS.get(n, {}), "") for n in names)
    return Plan(policy="p", rule=rule, matched_because="", actions=actions)


def test_watching_and_resuming_are_not_irreversible() -> None:
    # Observing a window and letting training go on change neither the state nor the data: a
    # diagnosis that changes class while an unfixed plan watches still re-makes the plan.
    watch = ("alert", "observe", "resume")
    assert first_irreversible(_plan(*watch)) is None
    assert replan_reason(_plan(*watch), _plan(*watch, rule="other"), done=2) is not None
    fix = ("alert", "freeze", "block_latest", "rollback", "apply", "observe")
    assert first_irreversible(_plan(*fix)) == 3
    assert replan_reason(_plan(*fix), _plan(*fix, rule="other"), done=3) is not None  # not begun
    assert replan_reason(_plan(*fix), _plan(*fix, rule="other"), done=4) is None
