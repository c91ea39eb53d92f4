"""The policy engine: (incident, job state, policy) -> plan. Pure, deterministic, no side effects.

    1. pick the first rule whose match fits (or the policy's fallback);
    2. a metric artifact gets an alert and nothing else;
    3. escalate when the observation window failed too often or attempts ran out;
    4. enforce the invariants on the rule's actions, then resolve each one's parameters
       (escalating when no checkpoint qualifies as a rollback target).

Every choice carries a sentence naming the rule and the setting behind it.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.core.model import Cause, Diagnosis
from supervisor.core.policy.invariants import (
    Step,
    block_before_rollback,
    metric_artifact_only,
    rollback_before_continuing,
)
from supervisor.core.policy.plan import JobState, Plan, PlannedAction
from supervisor.core.policy.resolve import NoRollbackTarget, resolve
from supervisor.core.policy.schema import ActionSpec, Policy, Rule

FALLBACK = "fallback"


def select_rule(policy: Policy, d: Diagnosis) -> tuple[Rule | None, str, list[tuple[str, str]]]:
    """(first matching rule or None, why it matched, [(rule, why not)] for those passed over)."""
    passed: list[tuple[str, str]] = []
    for rule in policy.rules:
        misses = [m.miss(d) for m in rule.match]
        hit = next((m for m, why in zip(rule.match, misses, strict=True) if why is None), None)
        if hit is not None:
            return rule, f"rule {rule.name!r} matched: {hit.describe()}", passed
        passed.append((rule.name, "; ".join(w for w in misses if w)))
    return None, f"no rule of policy {policy.name!r} matched: using its fallback", passed


def plan(diagnosis: Diagnosis, state: JobState, policy: Policy) -> Plan:
    """The plan for one incident (see the module docstring for the order of decisions)."""
    rule, because, passed = select_rule(policy, diagnosis)
    name = rule.name if rule else FALLBACK
    specs = rule.actions if rule else policy.fallback
    base = Plan(
        policy=policy.name,
        rule=rule.name if rule else None,
        matched_because=because,
        actions=(),
        passed_over=tuple(passed),
    )
    steps = [Step(s) for s in specs]
    if diagnosis.top_cause is Cause.METRIC_ARTIFACT:
        steps, notes = metric_artifact_only(steps)
        return _finish(base, steps, notes, name, diagnosis, state, policy)

    attempts, notes = _attempts_so_far(rule, state, policy)
    base = replace(base, attempt=attempts + 1)
    if why := _exhausted(rule, attempts, state, policy):
        return _escalation(base, why, diagnosis, state, notes)

    steps, more = rollback_before_continuing(steps, diagnosis, state)
    notes += more
    steps, more = block_before_rollback(steps)
    notes += more
    try:
        return _finish(base, steps, notes, name, diagnosis, state, policy)
    except NoRollbackTarget as exc:
        return _escalation(base, f"Deciding to escalate: {exc}", diagnosis, state, notes)


def _limits(rule: Rule | None, policy: Policy) -> tuple[int, int]:
    d = policy.defaults
    if rule is None:
        return d.max_attempts, d.cooldown_steps
    max_attempts = rule.max_attempts if rule.max_attempts is not None else d.max_attempts
    cooldown = rule.cooldown_steps if rule.cooldown_steps is not None else d.cooldown_steps
    return max_attempts, cooldown


def _attempts_so_far(rule: Rule | None, state: JobState, policy: Policy) -> tuple[int, list[str]]:
    """Attempts of this rule that count: the count starts over after `cooldown_steps` clean steps."""
    name = rule.name if rule else FALLBACK
    n = state.attempts.get(name, 0)
    _, cooldown = _limits(rule, policy)
    since = state.steps_since_last_incident
    if n and since is not None and since >= cooldown:
        return 0, [
            f"attempt count of {name!r} starts over: {since} steps since the last incident >= cooldown_steps={cooldown}"
        ]
    return n, []


def _exhausted(rule: Rule | None, attempts: int, state: JobState, policy: Policy) -> str | None:
    name = rule.name if rule else FALLBACK
    max_attempts, _ = _limits(rule, policy)
    limit = policy.defaults.max_observation_failures
    if state.observation_failures >= limit:
        return (
            f"Deciding to escalate: the observation window failed {state.observation_failures} time(s), "
            f"reaching defaults.max_observation_failures={limit}"
        )
    if attempts >= max_attempts:
        setting = (
            "max_attempts" if rule is not None and rule.max_attempts is not None else "defaults.max_attempts"
        )
        return f"Deciding to escalate: attempts {attempts} reached rule {name!r} {setting}={max_attempts}"
    return None


def _escalation(base: Plan, why: str, d: Diagnosis, state: JobState, notes: list[str]) -> Plan:
    """Freeze (so nothing trains on a state no one vouches for), alert, and hand over."""
    steps = [
        Step(ActionSpec.model_validate("freeze"), "hold training while a person decides"),
        Step(ActionSpec.model_validate("alert"), "tell a person, with the incident context"),
        Step(ActionSpec.model_validate({"escalate": {"message": why}}), "escalation"),
    ]
    # A failed alert must not block the hand-over; anything else failing here stops the job.
    actions = tuple(
        _planned(s, i, "escalation", d, state, "continue" if s.spec.action == "alert" else "stop")
        for i, s in enumerate(steps, 1)
    )
    return replace(base, actions=actions, escalate_reason=why, notes=tuple(notes))


def _finish(
    base: Plan, steps: list[Step], notes: list[str], name: str, d: Diagnosis, state: JobState, policy: Policy
) -> Plan:
    default = policy.defaults.on_failure
    actions = tuple(_planned(s, i, name, d, state, default) for i, s in enumerate(steps, 1))
    esc = next((a for a in actions if a.name == "escalate"), None)
    reason = None
    if esc is not None:
        msg = esc.params.get("message")
        reason = f"Deciding to escalate: rule {name!r} says so" + (f": {msg}" if msg else "")
    return replace(base, actions=actions, escalate_reason=reason, notes=tuple(notes))


def _planned(step: Step, i: int, rule: str, d: Diagnosis, state: JobState, default: str) -> PlannedAction:
    spec = step.spec
    params, detail = resolve(spec.action, spec.params, d, state)
    origin = f"inserted by the engine ({step.inserted})" if step.inserted else f"rule {rule!r} action {i}"
    return PlannedAction(spec.action, params, f"{origin}: {detail}", spec.on_failure or default)
