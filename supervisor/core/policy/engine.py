"""The policy engine: (incident, job state, policy) -> plan. Pure, deterministic, no side effects.

    1. pick the first rule whose match fits (or the policy's fallback);
    2. a metric artifact gets an alert and nothing else;
    3. escalate when the observation window failed too often, the rule's attempts ran out (a data
       recurrence whose fixes held then goes on without the rollback), the incident recurred too
       often (``recurrence.max_attempts``) or its rank is a repeat offender;
    4. enforce the invariants, adapt to what the job can do, resolve each action's parameters
       (with no rollback target: an onset in the first checkpoint interval rolls back to the run's
       start, unless it is a transient whose weights kept nothing abnormal; a transient goes on
       under an observation window; anything else escalates);
    5. a data fault whose rollback would re-run its own earlier occurrence goes on without it.

Every choice carries a sentence naming the rule and the setting behind it.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.core.model import Cause, Diagnosis
from supervisor.core.policy.actions import ACTIONS
from supervisor.core.policy.args import RollbackArgs
from supervisor.core.policy.evidence import data_recurrence, findings
from supervisor.core.policy.invariants import (
    RECURS_WHERE_IT_IS,
    Step,
    block_before_rollback,
    fix_after_rollback,
    metric_artifact_only,
    release_after_freeze,
    rollback_before_continuing,
    rollback_dispensable,
    rollback_reruns_occurrence,
    weights_kept,
    without_rollback,
)
from supervisor.core.policy.plan import JobState, Plan, PlannedAction, Recovery
from supervisor.core.policy.resolve import NoRollbackTarget, resolve
from supervisor.core.policy.schema import ActionSpec, Policy, Rule
from supervisor.core.policy.settings import Observation

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
    found = findings(diagnosis)
    if found:
        because += "; evidence: " + "; ".join(f"{k} ({v})" for k, v in found.items())
    base = Plan(
        policy=policy.name,
        rule=rule.name if rule else None,
        matched_because=because,
        actions=(),
        passed_over=tuple(passed),
        evidence=tuple(found),
        supervision=state.supervision,
    )
    steps = [Step(s) for s in specs]
    if diagnosis.top_cause is Cause.METRIC_ARTIFACT:
        steps, notes = metric_artifact_only(steps)
        return _finish(base, steps, notes, name, diagnosis, state, policy)

    attempts, notes = _attempts_so_far(rule, state, policy)
    if why_data := data_recurrence(diagnosis):
        notes += _data_recurrence_notes(why_data, diagnosis, state, policy)
    base = replace(base, attempt=attempts + 1)
    if why := _exhausted(rule, attempts, diagnosis, state, policy):
        return _escalation(base, why, diagnosis, state, notes)
    ran_out = _attempts_ran_out(rule, attempts, policy)
    if ran_out and (why_data is None or not any(s.spec.action == "rollback" for s in steps)):
        return _escalation(base, f"Deciding to escalate: {ran_out}", diagnosis, state, notes)

    for fix_up in (rollback_before_continuing, fix_after_rollback):
        steps, more = fix_up(steps, diagnosis, state)
        notes += more
    steps, more = adapt_to_job(steps, state)
    notes += more
    for order in (block_before_rollback, release_after_freeze):
        steps, more = order(steps)
        notes += more
    if ran_out:
        # A data recurrence past its rule's attempts: its earlier fixes held (their samples are
        # out), and a rollback at every period would re-train a period's worth each time. The rule's
        # attempts bound its rollbacks; this occurrence is kept out where it recurs, and the window
        # judges the state (a window that fails re-plans, and escalates at its own bound).
        spent = f"{ran_out}, on a data recurrence whose earlier fixes held ({why_data})"
        steps, more = without_rollback(steps, RECURS_WHERE_IT_IS, spent)
        return _finish(base, steps, notes + more, name, diagnosis, state, policy)
    try:
        done = _finish(base, steps, notes, name, diagnosis, state, policy)
    except NoRollbackTarget as exc:
        dispensable, kept = rollback_dispensable(diagnosis), weights_kept(diagnosis)
        no_start: NoRollbackTarget | None = None
        if dispensable is None or kept is not None:
            # A young run: the run's start stands in for the checkpoint it does not have yet (for a
            # transient too, when the weights kept its abnormal step).
            more = [f"a transient, started over: {kept}"] if dispensable and kept else []
            try:
                done = _finish(base, steps, notes + more, name, diagnosis, state, policy, start=True)
            except NoRollbackTarget as why_not:
                no_start = why_not
        if dispensable is None and no_start is not None:
            return _escalation(base, f"Deciding to escalate: {no_start}", diagnosis, state, notes)
        if dispensable is not None and (kept is None or no_start is not None):
            steps, more = without_rollback(steps, dispensable, str(exc))
            return _finish(base, steps, notes + more, name, diagnosis, state, policy)
    if (cause := rollback_reruns_occurrence(done.actions, diagnosis, state)) is not None:
        steps, more = without_rollback(
            steps, RECURS_WHERE_IT_IS, f"no target that re-runs none of it: {cause}"
        )
        return _finish(base, steps, notes + more, name, diagnosis, state, policy)
    return done


def adapt_to_job(steps: list[Step], state: JobState) -> tuple[list[Step], list[str]]:
    """Drop what this job cannot carry out, saying what happens instead (never a silent no-op)."""
    out, notes = [], []
    for s in steps:
        name = s.spec.action
        if name == "replay" and state.can_replay is False:
            notes.append(
                "replay dropped: the job has no replay_hooks; the suspect data is excluded without replay"
            )
            continue
        if ACTIONS[name].steer_only and state.supervision == "observe":
            notes.append(
                f"{name} dropped: an observe-level job has no step-boundary control; "
                "recovery restarts the group from a verified checkpoint through the framework's resume path"
            )
            continue
        out.append(s)
    return out, notes


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


def _exhausted(rule: Rule | None, attempts: int, d: Diagnosis, state: JobState, policy: Policy) -> str | None:
    """Why the incident escalates whatever its plan (the rule's own attempts: ``_attempts_ran_out``)."""
    limit = policy.defaults.max_observation_failures
    if state.observation_failures >= limit:
        return (
            f"Deciding to escalate: the observation window failed {state.observation_failures} time(s), "
            f"reaching defaults.max_observation_failures={limit}{_what_to_fix(d)}"
        )
    rec = policy.recurrence
    # A data recurrence's earlier fixes held (their samples are out for good); its next occurrence
    # is fresh data at the data's period, fixed where it recurs: the rule's own attempts bound it.
    if state.incident_attempt >= rec.max_attempts and not data_recurrence(d):
        return (
            f"Deciding to escalate: this incident came back after {state.incident_attempt} recovery "
            f"attempt(s), reaching recurrence.max_attempts={rec.max_attempts}{_what_to_fix(d)}"
        )
    if why := repeat_offender(d, state, policy):
        return why
    return None


def _attempts_ran_out(rule: Rule | None, attempts: int, policy: Policy) -> str | None:
    """Why the rule has no attempt left (``max_attempts``), or None."""
    max_attempts, _ = _limits(rule, policy)
    if attempts < max_attempts:
        return None
    name = rule.name if rule else FALLBACK
    setting = (
        "max_attempts" if rule is not None and rule.max_attempts is not None else "defaults.max_attempts"
    )
    return f"attempts {attempts} reached rule {name!r} {setting}={max_attempts}"


def _what_to_fix(d: Diagnosis, limit: int = 400) -> str:
    """The cause an escalation leaves to a person: the top cause and its first evidence (for an LR
    fault back after the fix, that the job's own schedule produces it)."""
    if not d.causes:
        return ""
    top = d.causes[0]
    first = top.evidence[0] if top.evidence else ""
    line = f"; top cause {top.cause.value}" + (f": {first}" if first else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _data_recurrence_notes(why: str, d: Diagnosis, state: JobState, policy: Policy) -> list[str]:
    """What a recurrence of the data's (``evidence.data_recurrence``) is not held against."""
    notes = []
    if d.rank_local:
        notes.append(
            f"not counted towards rank_offenders: {why}, so it is no evidence against rank "
            f"{d.first_rank}; each occurrence's data is excluded where it recurs"
        )
    if state.incident_attempt >= policy.recurrence.max_attempts:
        notes.append(
            f"recurrence.max_attempts={policy.recurrence.max_attempts} not applied: {why}; the "
            f"{state.incident_attempt} earlier fixes held (their samples are out), this is a new "
            "occurrence; the rule's own max_attempts bounds its rollbacks"
        )
    return notes


def repeat_offender(d: Diagnosis, state: JobState, policy: Policy) -> str | None:
    """Escalation reason when this rank-local incident makes its rank a hardware suspect. Only an
    incident whose evidence points at the rank counts: a recurrence that keeps the data's period,
    with its samples named, is the data's (``evidence.data_recurrence``)."""
    if not d.rank_local or d.first_rank is None or data_recurrence(d):
        return None
    lim = policy.rank_offenders
    earlier = [
        s for s, r in state.rank_incidents if r == d.first_rank and 0 <= d.onset_step - s <= lim.window_steps
    ]
    if len(earlier) + 1 < lim.count:
        return None
    return (
        f"Deciding to escalate: rank {d.first_rank} deviated first in {len(earlier) + 1} incidents within "
        f"{lim.window_steps} steps (onsets {', '.join(map(str, [*earlier, d.onset_step]))}), reaching "
        f"rank_offenders.count={lim.count}: hardware suspect"
    )


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
    base: Plan,
    steps: list[Step],
    notes: list[str],
    name: str,
    d: Diagnosis,
    state: JobState,
    policy: Policy,
    start: bool = False,
) -> Plan:
    default = policy.defaults.on_failure
    planned: list[PlannedAction] = []
    rollback_to: int | None = None
    speed_fix = False
    for i, s in enumerate(steps, 1):
        a = _planned(s, i, name, d, state, default, policy.observation, rollback_to, speed_fix, start)
        planned.append(a)
        speed_fix = speed_fix or (a.name == "apply" and "precision" in a.params)
        if isinstance(a.args, RollbackArgs):
            rollback_to = a.args.target_step if a.args.target_step is not None else a.args.max_target_step
    notes = list(notes)
    for a in planned:
        if a.name == "apply" and not a.params:
            notes.append(f"apply dropped: it would change nothing ({a.reason.split(': ', 1)[-1]})")
    actions = tuple(a for a in planned if a.name != "apply" or a.params)
    esc = next((a for a in actions if a.name == "escalate"), None)
    reason = None
    if esc is not None:
        msg = esc.params.get("message")
        reason = f"Deciding to escalate: rule {name!r} says so" + (f": {msg}" if msg else "")
    recovery: Recovery = "none"
    if any(a.name == "rollback" for a in actions):
        # The run's start is no checkpoint to load in place: the group restarts from scratch.
        to_start = any(a.name == "rollback" and a.params.get("to_start") for a in actions)
        recovery = "restart" if state.supervision == "observe" or to_start else "in_place"
    return replace(base, actions=actions, escalate_reason=reason, notes=tuple(notes), recovery=recovery)


def _planned(
    step: Step,
    i: int,
    rule: str,
    d: Diagnosis,
    state: JobState,
    default: str,
    obs: Observation | None = None,
    rollback_to: int | None = None,
    speed_fix: bool = False,
    start: bool = False,
) -> PlannedAction:
    spec = step.spec
    params, detail = resolve(spec.action, spec.params, d, state, obs, rollback_to, speed_fix, start)
    origin = f"inserted by the engine ({step.inserted})" if step.inserted else f"rule {rule!r} action {i}"
    return PlannedAction(spec.action, params, f"{origin}: {detail}", spec.on_failure or default)
