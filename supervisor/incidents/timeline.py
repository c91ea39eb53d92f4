"""Timeline events in words a person reads: "Froze all 2 ranks at step 259.", never a memo dict.

One describer per event kind (a registry; an unknown kind gets a generic sentence). Action
events carry ``{"action", "params", "memo", "reason"}`` as their payload and the action's
outcome as their result (``supervisor/runtime/actions``); older records and hand-made ones keep
the same fields at the top of the payload. ``field`` looks in that order: result, memo, params,
payload.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.incidents.models import Event
from supervisor.incidents.states import EventKind, EventStatus

#: The command that lifts the hold an escalated incident leaves on `latest` (``cli/release.py``).
RELEASE_HINT = "supervisor incidents release {id} --job <job.yaml> --note '<what was fixed>'"
#: Longest free text (a failure reason, evidence) quoted in one sentence.
MAX_QUOTE = 240
_METRIC_WORDS = {
    "loss": "the loss",
    "grad_norm": "the grad norm",
    "update_ratio": "the update ratio",
    "lr": "the learning rate",
    "loss_scale": "the loss scale",
    "param_checksum": "the parameter fingerprints",
}
_CHECK_WORDS = {
    "loss": "loss",
    "grad_norm": "grad norm",
    "update_ratio": "update ratio",
    "throughput": "throughput",
    "no_new_anomaly": "no new anomaly",
}


@dataclass(frozen=True, slots=True)
class Context:
    """Facts about the job that make a sentence complete."""

    world_size: int | None = None
    closed: bool = False
    """The incident reached a terminal state: a pending event there never finished."""


def field(e: Event, name: str) -> Any:
    """An event's field: from its result, then the action's memo, params, then the payload itself."""
    p = e.payload or {}
    for src in (e.result or {}, p.get("memo") or {}, p.get("params") or {}, p):
        if isinstance(src, dict) and src.get(name) is not None:
            return src[name]
    return None


def quote(text: Any, limit: int = MAX_QUOTE) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


def num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def metric_words(metric: Any) -> str:
    return _METRIC_WORDS.get(str(metric), f"the {str(metric).replace('_', ' ')}")


def ranks_words(ranks: Any, ctx: Context) -> str:
    """ "all 2 ranks", "ranks 0, 1 of 4", "rank 3"."""
    if ctx.world_size == 1 and (not isinstance(ranks, list) or len(ranks) <= 1):
        return "the single rank"
    if not isinstance(ranks, list) or not ranks:
        return f"all {ctx.world_size} ranks" if ctx.world_size else "all ranks"
    if ctx.world_size is not None and len(ranks) == ctx.world_size:
        return f"all {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    of = f" of {ctx.world_size}" if ctx.world_size else ""
    if len(ranks) == 1:
        return f"rank {ranks[0]}{of}"
    shown = ", ".join(str(r) for r in ranks[:8]) + (", …" if len(ranks) > 8 else "")
    return f"ranks {shown}{of}"


def _at(e: Event) -> str:
    step = field(e, "acked_at_step")
    step = step if step is not None else e.step
    return f" at step {step}" if step is not None else ""


def _diagnosis(e: Event) -> dict[str, Any]:
    d = field(e, "diagnosis")
    return d if isinstance(d, dict) else {}


def _where(d: dict[str, Any], ctx: Context) -> str:
    if d.get("first_rank") is not None and d.get("rank_local"):
        return f" on rank {d['first_rank']}"
    return "" if ctx.world_size == 1 else " on all ranks"


def _detected(e: Event, ctx: Context) -> str:
    d = _diagnosis(e)
    fault = field(e, "machinery")
    if isinstance(fault, str):  # the worker group's own fault (a rank lost, failed or hung), not a metric
        what = fault.split(": ", 1)[0]  # "worker rank(s) [2, 3] lost"; the restart says why
        return f"Detected a worker-group fault{_at(e)}: {quote(what)}."
    call = f"; first reading {d['phenotype'].replace('_', ' ')}" if d.get("phenotype") else ""
    sev = f", severity {d['severity']}" if d.get("severity") else ""
    return f"Detected a loss spike{_at(e)}{_first_anomaly(d)}{call}{sev}."


def _first_anomaly(d: dict[str, Any]) -> str:
    """The first abnormal quantity in words: ': <metric> left its band at step N on rank R (its
    value against a level of b, z z)', else ': onset at step N'."""
    fa = d.get("first_anomaly") or {}
    if fa.get("metric"):
        on = f" on rank {fa['rank']}" if fa.get("rank") is not None else ""
        level = ""
        if isinstance(fa.get("value"), int | float) and isinstance(fa.get("baseline"), int | float):
            level = f" ({num(fa['value'])} against a level of {num(fa['baseline'])}"
            level += f", z {num(fa['z'])})" if isinstance(fa.get("z"), int | float) else ")"
        return f": {metric_words(fa['metric'])} left its band at step {fa.get('step')}{on}{level}"
    return f": onset at step {d['onset_step']}" if d.get("onset_step") is not None else ""


def _diagnosed(e: Event, ctx: Context) -> str:
    d = _diagnosis(e)
    causes = d.get("causes") or []
    phen = str(d.get("phenotype", "unknown")).replace("_", " ")
    text = f"Diagnosed {phen}{_where(d, ctx)}"
    if d.get("nonfinite"):
        text += ", NaN/Inf" + (f" first at {d['nonfinite_at']}" if d.get("nonfinite_at") else "")
    if d.get("source_local"):
        text += f", confined to source {d['source_local']}"
    if causes:
        top = causes[0]
        text += f"; top cause {top['cause']} ({float(top['score']):.2f})"
        if top.get("evidence"):
            text += f": {quote(top['evidence'][0], 160)}"
    return text + "."


def _state(e: Event, ctx: Context) -> str:
    p = e.payload
    why = f": {quote(p['reason'])}" if p.get("reason") else ""
    release = (
        f" To release `latest` once fixed: {RELEASE_HINT.format(id=e.incident_id)}."
        if p.get("to") in ("escalated", "stopped")
        else ""
    )
    return f"Incident {p.get('from')} → {p.get('to')}{why}.{release}"


def seconds_words(v: Any) -> str:
    x = float(v or 0.0)
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min" if x < 7200 else f"{x / 3600:.1f} h"


def incident_words(lost: dict[str, Any]) -> str:
    """One incident's ``time_lost`` note in words."""
    return (
        f"{lost.get('steps_retrained', 0)} step(s) re-trained in {seconds_words(lost.get('retrain_s'))}; "
        f"training stood still {seconds_words(lost.get('downtime_s'))}"
    )


def _note(e: Event, ctx: Context) -> str:
    p = e.payload
    if isinstance(p.get("time_lost"), dict):
        return f"Time lost to this incident: {incident_words(p['time_lost'])}."
    if "plan" in p:
        rule, _, actions = str(p["plan"]).partition(": ")
        steps = " → ".join(a.strip().replace("_", " ") for a in actions.split(",") if a.strip())
        attempt = f" (attempt {p['attempt']})" if p.get("attempt") else ""
        text = f"Policy {rule}{attempt} plans: {steps or 'nothing'}"
        if p.get("escalate"):
            text += f"; escalates because {quote(p['escalate'])}"
        return text + "."
    if "plan_remade" in p:
        return f"Plan remade: {quote(p['plan_remade'])}."
    if isinstance(p.get("same_occurrence"), dict):
        d = p["same_occurrence"].get("diagnosis") or {}
        d = d if isinstance(d, dict) else {}
        return (f"Also seen{_at(e)}{_first_anomaly(d)}: more evidence of this occurrence (the same onset), "
                "not an incident of its own.")  # fmt: skip
    if "downtime_s" in p:
        return f"Training stood still for {float(p['downtime_s']):.1f} s while the incident was handled."
    if "recurrence_of" in p:
        return f"Recurrence of incident {p['recurrence_of']}: {quote(p.get('why', ''))}."
    if "recurred_as" in p:
        return f"Recurred as incident {p['recurred_as']}: {quote(p.get('why', ''))}."
    if "skipped" in p:
        left = p["skipped"]
        names = ", ".join(str(x) for x in left) if isinstance(left, list) else str(left)
        return f"Not carried out ({quote(p.get('reason', 'training ended'))}): {names}."
    if "unfinished" in p:
        return f"Left unfinished: {quote(p['unfinished'])}."
    if isinstance(p.get("stopped"), dict):  # a person stopped the job during the plan
        st = p["stopped"]

        def listed(key: str) -> str:
            got = st.get(key)
            return ", ".join(str(x) for x in got) if isinstance(got, list) and got else "nothing"

        return (f"Stopped on request ({quote(st.get('reason', 'stop'))}): done {listed('done')}; "
                f"not done {listed('not_done')}.")  # fmt: skip
    if p.get("released_latest"):
        at = p.get("latest_at_block")
        held = f" (held at step {at})" if at is not None else ""
        return f"{p.get('by', 'A person')} released `latest`{held}: {quote(p.get('note', ''))}."
    if "latest_after_release" in p:
        if p.get("still_held_by"):
            return f"`latest` stays held by incident {', '.join(str(h) for h in p['still_held_by'])}."
        after, before = p.get("latest_after_release"), p.get("latest_before")
        if after is not None and after != before:
            return f"`latest` moved forward from step {before} to step {after}."
        return f"`latest` stays at step {after} (no newer healthy checkpoint yet; the next one moves it)."
    return "Note: " + "; ".join(f"{k.replace('_', ' ')} {quote(v, 120)}" for k, v in p.items()) + "."


def _alert(e: Event, ctx: Context) -> str:
    if e.status == EventStatus.PENDING:
        return "Sending the alert."
    channels = field(e, "channels") or ["log"]
    where = " and ".join("the log" if c == "log" else f"the {c}" for c in channels)
    status = field(e, "http_status")
    detail = f" (HTTP {status}, {field(e, 'format') or 'json'} payload)" if status is not None else ""
    if e.status == EventStatus.FAILED:
        return f"Alert written to the log; the webhook failed: {quote(_reason(e))}."
    return f"Alert sent to {where}{detail}."


def _froze(e: Event, ctx: Context) -> str:
    if e.status == EventStatus.PENDING:
        return "Freezing every rank at the next step boundary."
    if e.status == EventStatus.FAILED:
        return f"Freeze failed: {quote(_reason(e))}."
    return f"Froze {ranks_words(field(e, 'ranks'), ctx)}{_at(e)}."


def _snapshot(e: Event, ctx: Context) -> str:
    if e.status == EventStatus.FAILED:
        return f"Diagnostic snapshot failed: {quote(_reason(e))}."
    what = " (model and optimizer)" if field(e, "include_optimizer") else ""
    if e.status == EventStatus.PENDING:
        return f"Saving a diagnostic snapshot{what}."
    where = field(e, "checkpoint")
    ref = f" to {where}" if where else ""
    return f"Saved a diagnostic snapshot{what} of {ranks_words(field(e, 'ranks'), ctx)}{_at(e)}{ref}."


def _blocked(e: Event, ctx: Context) -> str:
    at = field(e, "latest_at_block")
    holders = field(e, "holders") or []
    held = f", held by incident {', '.join(str(h) for h in holders)}" if holders else ""
    return f"Blocked `latest`{f' at step {at}' if at is not None else ''}{held}."


def _rolled_back(e: Event, ctx: Context) -> str:
    src = field(e, "from_step")
    src = src if src is not None else e.step
    dst = field(e, "to_step")
    if e.status == EventStatus.FAILED:
        return f"Rollback from step {src} failed: {quote(_reason(e))}."
    ver = field(e, "verification")
    kind = ""
    if isinstance(ver, dict):
        kind = f"{ver.get('health', 'verified')} " if ver.get("ok") else "UNVERIFIED "
        rejected = ver.get("rejected") or []
        if rejected:
            kind = f"{kind}(after rejecting {', '.join(str(r[0] if isinstance(r, list) else r) for r in rejected)}) "
    elif field(e, "verified") is not None:
        kind = "verified " if field(e, "verified") else "UNVERIFIED "
    start = f"the run's start (no checkpoint before onset {field(e, 'onset_step')})"
    if e.status == EventStatus.PENDING:
        if field(e, "to_start"):
            return f"Rolling back from step {src} to {start}."
        return f"Rolling back from step {src} to {kind}checkpoint {dst}."
    notes = [str(field(e, "checkpoint"))] if field(e, "checkpoint") else []
    if isinstance(src, int) and isinstance(dst, int):
        notes.append(f"{src - dst} steps to train again")
    for refused in field(e, "passed_over") or []:  # targets the ranks' restore check refused
        if isinstance(refused, dict):
            notes.append(
                f"checkpoint {refused.get('step')} quarantined: {quote(str(refused.get('reason', '')))}"
            )
    lost = f" ({'; '.join(notes)})" if notes else ""
    # In place, or by a restart of the worker group (the record's mode_why says why).
    how = " by restarting the worker group" if field(e, "mode") == "restart" else ""
    if field(e, "to_start"):
        return f"Rolled back from step {src} to {start}{how}{lost}."
    return f"Rolled back from step {src} to {kind}checkpoint {dst}{how}{lost}."


def exclusion_words(e: Event) -> list[str]:
    """What a fix excluded, in words: samples, sources, the batches of a step range."""
    out = []
    applied = (
        (field(e, "overrides") or {}).get("exclusions") if isinstance(field(e, "overrides"), dict) else None
    )
    samples = (applied or {}).get("samples") or field(e, "exclude_samples")
    if not samples and isinstance(field(e, "exclude"), dict):
        samples = field(e, "exclude").get("samples")
    if isinstance(samples, list) and samples:
        out.append(f"excluded {len(samples)} sample{'s' if len(samples) != 1 else ''}")
    elif samples == "suspects":
        out.append("excluded the suspect samples")
    sources = (applied or {}).get("sources") or field(e, "exclude_sources")
    if sources:
        out.append("excluded source " + ", ".join(str(s) for s in sources))
    out += excluded_range_words(e)
    return out


def _pair(r: Any) -> tuple[Any, Any] | None:
    return (r[0], r[1]) if isinstance(r, list | tuple) and len(r) == 2 else None


def excluded_range_words(e: Event) -> list[str]:
    """A batch-range exclusion in the policy's unit, the steps ("the batches of steps 130–131"),
    with the loader's batch indices the runtime applied beside it when they differ: the launch
    summary and the timeline name the same range (the indices alone read one off)."""
    asked = field(e, "exclude") if isinstance(field(e, "exclude"), dict) else {}
    steps = _pair(field(e, "exclude_batches")) or _pair(asked.get("batch_range"))
    overrides = field(e, "overrides")
    applied = (overrides.get("exclusions") or {}) if isinstance(overrides, dict) else {}
    indices = [p for p in (_pair(r) for r in applied.get("batch_ranges") or []) if p is not None]
    if steps is None:
        return [f"excluded batch indices {a}–{b}" for a, b in indices]
    text = f"excluded the batches of steps {steps[0]}–{steps[1]}"
    if indices and [tuple(steps)] != indices:
        text += " (batch indices " + ", ".join(f"{a}–{b}" for a, b in indices) + ")"
    return [text]


def _fix(e: Event, ctx: Context) -> str:
    parts = []
    if field(e, "lr_scale") is not None:
        parts.append(f"LR ×{num(field(e, 'lr_scale'))}")
    if field(e, "warmup_steps"):
        parts.append(f"re-warm the LR over {field(e, 'warmup_steps')} steps")
    if field(e, "grad_clip") is not None:
        parts.append(f"clip the grad norm at {num(field(e, 'grad_clip'))}")
    if field(e, "precision"):
        parts.append(f"precision {field(e, 'precision')}")
    parts += exclusion_words(e)
    if field(e, "skip_batches"):
        parts.append(f"skip {field(e, 'skip_batches')} batches")
    unsupported = field(e, "unsupported") or []
    what = ", ".join(parts) or "no change"
    if e.status == EventStatus.FAILED:
        return f"Fix ({what}) failed: {quote(_reason(e))}."
    if e.status == EventStatus.PENDING:
        return f"Applying the fix: {what}."
    tail = f"; not supported by this job: {', '.join(unsupported)}" if unsupported else ""
    return f"Applied the fix{_at(e)}: {what}{tail}."


def _check_words(name: str, c: Any) -> str:
    label = _CHECK_WORDS.get(name, name.replace("_", " "))
    if not isinstance(c, dict):
        return f"{label} {'ok' if c else 'FAILED'}"
    verdict = "ok" if c.get("ok") else "FAILED"
    if c.get("detail"):
        return f"{label} {verdict}: {quote(c['detail'], 80)}"
    if isinstance(c.get("value"), int | float) and isinstance(c.get("limit"), int | float):
        return f"{label} {verdict} ({num(c['value'])}, limit {num(c['limit'])})"
    return f"{label} {verdict}"


def _observation(e: Event, ctx: Context) -> str:
    window = field(e, "window")
    if isinstance(window, list | tuple) and len(window) == 2:
        span = f"steps {window[0]}–{window[1]}"
    elif field(e, "steps") is not None:
        start = field(e, "from_step")
        span = f"{field(e, 'steps')} steps" + (f" from step {start}" if start is not None else "")
    else:
        span = "the window"
    if e.status == EventStatus.PENDING:
        return f"Observing {span} against the baseline before the onset."
    checks = field(e, "checks") or {}
    detail = "; ".join(_check_words(k, v) for k, v in checks.items())
    passed = field(e, "passed")
    if e.status == EventStatus.FAILED or passed is False:
        verdict = "failed" if not field(e, "skipped") else "not judged"
        why = detail or quote(_reason(e))
        return f"Observation of {span} {verdict}: {why}."
    return f"Observation of {span} passed{f': {detail}' if detail else ''}."


def _resumed(e: Event, ctx: Context) -> str:
    released = " and released `latest`" if field(e, "latest_unblocked") else ""
    return f"Resumed training{_at(e)}{released}."


def _escalated(e: Event, ctx: Context) -> str:
    reason = field(e, "reason") or _reason(e)
    saved = field(e, "state_saved_at_step")
    tail = f"; state saved at step {saved}, training stopped" if saved is not None else ""
    if e.status == EventStatus.PENDING:
        return f"Escalating to a person: {quote(reason)}."
    # The command that releases `latest` is named once, by the move to `escalated` (every way of
    # escalating makes it; not every one records this event).
    return f"Escalated to a person: {quote(reason)}{tail}; `latest` stays held until a person releases it."


def _replayed(e: Event, ctx: Context) -> str:
    if e.status == EventStatus.PENDING:
        return "Replaying the suspect batch and a control batch from the last verified checkpoint."
    verdict = field(e, "verdict")
    why = field(e, "why")
    text = "Replayed the suspect batch" + (f": verdict {verdict}" if verdict else "")
    if e.status == EventStatus.FAILED:
        return f"Replay did not implicate the data: {quote(why or _reason(e))}."
    return text + (f" ({quote(why)})" if why else "") + "."


def _metric_check(e: Event, ctx: Context) -> str:
    artifact = field(e, "artifact")
    if artifact is None:
        return "Checked how the metric was computed."
    if artifact:
        return "Checked the metric: the spike is in how the loss was computed (a metric artifact)."
    return "Checked the metric: the loss recomputed from token sums shows the spike too (it is real)."


def _dismissed(e: Event, ctx: Context) -> str:
    return f"Dismissed: {quote(field(e, 'reason') or 'not an incident')}."


def _worker_restarted(e: Event, ctx: Context) -> str:
    why = field(e, "reason") or "worker group lost"
    gen = field(e, "from_generation")
    to = field(e, "resume_step") or field(e, "to_step")
    text = (
        f"Restarted the worker group{f' (generation {gen} → {int(gen) + 1})' if isinstance(gen, int) else ''}"
    )
    text += f" from checkpoint {to}" if to is not None else ""
    return f"{text}: {quote(why)}."


def _supervisor_resumed(e: Event, ctx: Context) -> str:
    pending = field(e, "pending_actions") or []
    found = field(e, "workers_found")
    workers = (
        "" if found is None else ("; its workers were still running" if found else "; no workers were found")
    )
    left = f", finishing {', '.join(str(p) for p in pending)}" if pending else ""
    return f"A new supervisor took over{left}{workers}."


def _reason(e: Event) -> str:
    return str(field(e, "reason") or field(e, "error") or "no reason recorded")


def _generic(e: Event, ctx: Context) -> str:
    name = e.kind.value.replace("_", " ")
    reason = (e.payload or {}).get("reason")
    return f"{name[:1].upper()}{name[1:]}{_at(e)}" + (f": {quote(reason)}" if reason else "") + "."


DESCRIBERS: dict[EventKind, Callable[[Event, Context], str]] = {
    EventKind.DETECTED: _detected,
    EventKind.DIAGNOSED: _diagnosed,
    EventKind.STATE_CHANGED: _state,
    EventKind.NOTE: _note,
    EventKind.ALERT_SENT: _alert,
    EventKind.FROZE: _froze,
    EventKind.SNAPSHOT: _snapshot,
    EventKind.LATEST_BLOCKED: _blocked,
    EventKind.ROLLED_BACK: _rolled_back,
    EventKind.FIX_APPLIED: _fix,
    EventKind.OBSERVATION: _observation,
    EventKind.RESUMED: _resumed,
    EventKind.ESCALATED: _escalated,
    EventKind.REPLAYED: _replayed,
    EventKind.METRIC_CHECK: _metric_check,
    EventKind.DISMISSED: _dismissed,
    EventKind.WORKER_RESTARTED: _worker_restarted,
    EventKind.SUPERVISOR_RESUMED: _supervisor_resumed,
}


def describe(event: Event, ctx: Context | None = None) -> str:
    """One sentence; a pending action says it is under way, a failed one says why."""
    ctx = ctx or Context()
    text = DESCRIBERS.get(event.kind, _generic)(event, ctx)
    if event.status == EventStatus.PENDING and ctx.closed:
        return text + " (never finished: the incident ended first)"
    if event.status == EventStatus.PENDING and event.kind not in _SAYS_PENDING:
        return text + " (started, not finished)"
    if event.status == EventStatus.FAILED and "fail" not in text.lower():
        return text + " (FAILED)"
    return text


_SAYS_PENDING = frozenset(
    {
        EventKind.ALERT_SENT,
        EventKind.FROZE,
        EventKind.SNAPSHOT,
        EventKind.ROLLED_BACK,
        EventKind.FIX_APPLIED,
        EventKind.OBSERVATION,
        EventKind.ESCALATED,
        EventKind.REPLAYED,
    }
)
