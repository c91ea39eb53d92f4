"""Turn an action's policy parameters into concrete ones for one incident, with the reason.

Symbolic values (`suspects`, `suspect`, `incident`) become what the diagnosis names, the rollback
target is chosen from the known checkpoints, and fixes are made relative to what the job runs now
(docs/policies.md, "Fixes are relative to what the job runs"). With no checkpoint to restore,
resolution raises ``NoRollbackTarget`` and the engine decides what happens instead.
"""

from __future__ import annotations

import re
from typing import Any

from supervisor.core.model import Diagnosis, HealthMark
from supervisor.core.policy.actions import (
    ACTIONS,
    ActionParams,
    AlertParams,
    ApplyParams,
    EscalateParams,
    Exclude,
    ObserveParams,
    ReplayParams,
    RollbackParams,
    SnapshotParams,
    StopParams,
)
from supervisor.core.policy.plan import JobState
from supervisor.core.policy.settings import Observation

Resolved = tuple[dict[str, Any], str]


class NoRollbackTarget(Exception):
    """No checkpoint qualifies as a rollback target; the message says why."""


def resolve(
    name: str,
    params: ActionParams,
    d: Diagnosis,
    state: JobState,
    observation: Observation | None = None,
    rollback_to: int | None = None,
    speed_fix: bool = False,
    start: bool = False,
) -> Resolved:
    """(concrete params, detail sentence) of one action; ``rollback_to``: the step an earlier
    rollback of the plan goes back to (at most); ``speed_fix``: an earlier apply changes step speed
    (precision); ``start``: a rollback may go back to the run's start (``start_target``)."""
    if isinstance(params, RollbackParams):
        return _rollback(params, d, state, start)
    if isinstance(params, ObserveParams):
        return _observe(params, d, observation or Observation.model_validate({}), speed_fix)
    if isinstance(params, ApplyParams):
        return _apply(params, d, state, rollback_to)
    if isinstance(params, ReplayParams):
        where = " on another rank than the suspect one" if params.other_rank else ""
        control = " and a control batch" if params.control else ""
        resolved = params.model_dump() | {"from_step": d.onset_step, "suspect_rank": d.first_rank}
        return resolved, f"replay {params.batches} batch(es) from step {d.onset_step}{control}{where}"
    if isinstance(params, SnapshotParams):
        # A snapshot of a suspect state is evidence: marked diagnostic, never a rollback target.
        marked = params.model_dump() | {"mark": HealthMark.DIAGNOSTIC.value}
        return marked, "save the suspect state, marked diagnostic"
    summary = ACTIONS[name].summary
    if isinstance(params, AlertParams | EscalateParams | StopParams) and params.message:
        return params.model_dump(), f"{summary}: {params.message}"
    return params.model_dump(by_alias=True), summary


def start_target(p: RollbackParams, d: Diagnosis, state: JobState) -> str | None:
    """Why the run's start cannot stand in for a missing checkpoint, or None when it can: the policy
    allows it (``from_start``) and the onset comes before the run's first checkpoint could have
    earned the rollback's mark -- within the first checkpoint interval, and for a ``healthy`` one
    the ``healthy_after`` steps after it too, which an onset inside keeps from being marked -- so
    starting over loses at most that much, and nothing trained before the onset needs keeping."""
    if not p.from_start:
        return "rollback from_start=false"
    every = state.checkpoint_every
    if every is None:
        return "the checkpoint interval is not known"
    window = state.healthy_after if p.min_mark == HealthMark.HEALTHY.value else 0
    if d.onset_step > every + window:
        within = f" and the {window} steps it needs to be marked healthy" if window else ""
        return (
            f"the onset {d.onset_step} lies beyond the run's first checkpoint interval "
            f"(checkpoint.every_steps={every}){within}: the run's start is no target"
        )
    return None


_LR_STEP = re.compile(r"^learning rate changed (\S+)x from the previous step at step (\d+)", re.IGNORECASE)
_LR_RISE = re.compile(r"^learning rate \S+ at step (\d+) -> \S+ at step \d+ \(", re.IGNORECASE)


def lr_dated_onset(d: Diagnosis) -> int | None:
    """The first step that ran at a faulty LR, when the LR dates the onset (it rose from the previous
    step, or from a level held until a named step). The LR is an input, not an effect: no state
    saved before that step can hold the fault. None: the onset is dated by effects only, which may
    lag the fault."""
    steps: list[int] = []
    for cs in d.causes:
        for e in cs.evidence:
            m = _LR_STEP.search(e)
            if m is not None and _ratio(m.group(1)) > 1.0:
                steps.append(int(m.group(2)))
            r = _LR_RISE.search(e)
            if r is not None:
                steps.append(int(r.group(1)) + 1)
    dated = [s for s in steps if 0 < s <= d.onset_step]
    return min(dated) if dated else None


def _ratio(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _rollback(p: RollbackParams, d: Diagnosis, state: JobState, start: bool) -> Resolved:
    """The newest checkpoint of the mark at least ``margin_steps`` (at least 1: a checkpoint at the
    onset holds its update) before the onset, else the newest before it (the margin buys room for an
    onset dated late; an older healthy state beats none). An onset the LR dates cannot be late:
    ``lr_dated_margin_steps`` replaces the margin there. With none before the onset, the run's start
    when ``start`` and ``start_target`` allow it, else no target."""
    dated = lr_dated_onset(d) if p.lr_dated_margin_steps is not None else None
    if dated is not None and p.lr_dated_margin_steps is not None:
        margin, first = p.lr_dated_margin_steps, dated
        why = (
            f"step {dated}, where the LR left its level, - lr_dated_margin_steps={margin}: the LR dates the "
            f"onset, so margin_steps={p.margin_steps} (room for an onset dated late) is not needed"
        )
    else:
        margin, first = p.margin_steps, d.onset_step
        why = f"onset {d.onset_step} - margin_steps={p.margin_steps}"
    limit = first - max(margin, 1)
    marks = {HealthMark.HEALTHY} if p.min_mark == "healthy" else {HealthMark.HEALTHY, HealthMark.VERIFIED}
    where = f"at or before step {limit} ({why})"
    params = {
        "margin_steps": margin,
        # Invariant: whatever the policy says, the target is re-verified before loading.
        "require_verified": True,
        "min_mark": p.min_mark,
        "check_completeness": p.check_completeness,
        "max_target_step": limit,
        "target_step": None,
        "from_start": p.from_start,
        "to_start": False,
    }
    complete = "; state completeness checked" if p.check_completeness else ""
    known = state.checkpoint_refs
    if known is None:
        detail = (
            f"target step chosen at run time, margin {margin} steps: newest {p.min_mark} checkpoint {where}"
        )
        return params, f"{detail}; re-verified before loading{complete}"
    eligible = [c for c in known if c.step <= limit and c.mark in marks]
    short = ""
    if not eligible:
        before = limit = params["max_target_step"] = first - 1  # a checkpoint at the onset holds its update
        eligible = [c for c in known if c.step <= before and c.mark in marks]
        short = f"; margin not met: no {p.min_mark} checkpoint {where}, so the newest before the onset"
        if not eligible and dated is not None and HealthMark.VERIFIED not in marks:
            # The healthy mark guards against a state saved after a fault had begun unseen; an LR-dated
            # onset rules that out, so a verified checkpoint before it beats starting over or none.
            eligible = [c for c in known if c.step <= before and c.mark is HealthMark.VERIFIED]
            if eligible:
                params["min_mark"] = HealthMark.VERIFIED.value  # the runtime still prefers a healthy one
                short = (
                    f"; no {p.min_mark} checkpoint before step {dated}, where the LR left its level: a "
                    "verified one stands in, since every step from it to there ran at the scheduled LR"
                )
        if not eligible:
            listed = ", ".join(f"{c.step} {c.mark.value}" for c in known) or "none"
            missing = (
                f"no {p.min_mark} checkpoint before the onset {d.onset_step} (known checkpoints: {listed})"
            )
            why_not = start_target(p, d, state)
            if not start or why_not is not None:
                raise NoRollbackTarget(missing + (f"; {why_not}" if start and why_not else ""))
            params |= {"max_target_step": 0, "target_step": 0, "to_start": True}
            return params, (
                f"target the run's start (no checkpoint before onset {d.onset_step}): {missing}, and the "
                f"onset lies within the first checkpoint interval (checkpoint.every_steps="
                f"{state.checkpoint_every}, healthy after {state.healthy_after}); the worker group restarts from the job's initial state, its "
                "data from the beginning with the plan's exclusions kept, no checkpoint resumed"
            )
    target = eligible[-1]
    passed = [f"{c.step} {c.mark.value}" for c in known if target.step < c.step <= limit]
    params["target_step"] = target.step
    why_this = short or f": newest {p.min_mark} checkpoint {where}"
    detail = f"target step {target.step} ({target.mark.value}), margin {margin} steps{why_this}"
    if passed:
        detail += f"; passing over {', '.join(passed)}"
    return params, detail + f"; re-verified before loading{complete}"


def _exclude(e: Exclude, d: Diagnosis) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    words: list[str] = []
    # What resolves to nothing (no suspect named, not source-local) is said and left out: an
    # empty exclusion would be a fix that changes nothing.
    if e.samples is not None:
        samples = list(d.suspect_samples) if e.samples == "suspects" else list(e.samples)
        if samples:
            out["samples"] = samples
        words.append(f"{len(samples)} sample(s)" if samples else "no samples (none named)")
    if e.sources is not None:
        src = ([d.source_local] if d.source_local else []) if e.sources == "suspect" else list(e.sources)
        if src:
            out["sources"] = src
        words.append(f"source(s) {', '.join(src)}" if src else "no source (incident not source-local)")
    if e.batch_range is not None:
        end = d.end_step if d.end_step is not None else d.peak_step
        rng = [d.onset_step, end] if e.batch_range == "incident" else list(e.batch_range)
        out["batch_range"] = rng
        words.append(f"batches of steps {rng[0]}..{rng[1]}")
    return out, words


def _apply(p: ApplyParams, d: Diagnosis, state: JobState, rollback_to: int | None) -> Resolved:
    params: dict[str, Any] = {}
    words: list[str] = []
    factor = p.lr_scale
    if p.lr_scale_on_retry is not None and state.incident_attempt > 0:
        factor = (factor or 1.0) * p.lr_scale_on_retry
        words.append(
            f"attempt {state.incident_attempt + 1} of this incident: lr_scale_on_retry={p.lr_scale_on_retry:g}"
        )
    if factor is not None:
        params["lr_scale"], text = _lr_scale(factor, state)
        words.append(text)
    if p.warmup_steps == "to_onset":
        ramp = 0 if rollback_to is None else d.onset_step - rollback_to
        left = None if state.max_steps is None else state.max_steps - d.onset_step
        if ramp <= 0:
            words.append("warmup_steps to_onset dropped: the plan does not roll back to before the onset")
        elif left is not None and left < ramp:
            # The ramp is insurance for the steps after the onset, paid in LR over the steps before
            # it; with fewer steps left than it is long, the price lands on the run's final state.
            words.append(
                f"re-warm dropped: {ramp} steps from the rollback target {rollback_to} to the "
                f"onset {d.onset_step} would protect the {left} steps the run has left after it (max_steps="
                f"{state.max_steps}); the rollback alone removes the fault, the window judges the state"
            )
        else:
            params["warmup_steps"] = ramp
            words.append(
                f"re-warm the LR from zero over {ramp} steps: from the rollback target "
                f"{rollback_to} to the onset {d.onset_step}, then the schedule as planned"
            )
    elif p.warmup_steps is not None:
        params["warmup_steps"] = p.warmup_steps
        words.append(f"re-warm the LR from zero over {p.warmup_steps} steps")
    clip, text = _grad_clip(p, state)
    if clip is not None:
        params["grad_clip"] = clip
    if text:
        words.append(text)
    if p.precision is not None:
        params["precision"] = p.precision
        words.append(f"precision {p.precision}")
    if p.exclude is not None:
        exclude, excluded = _exclude(p.exclude, d)
        if exclude:
            params["exclude"] = exclude
        words.append("quarantine " + ", ".join(excluded))
    if p.skip_batches is not None:
        params["skip_batches"] = p.skip_batches
        words.append(f"skip {p.skip_batches} batches after the resume point")
    return params, "; ".join(words)


def _lr_scale(factor: float, state: JobState) -> tuple[float, str]:
    """The absolute LR multiplier to send: the policy's factor times the override in force."""
    total = round(state.lr_scale * factor, 12)
    text = f"LR x{factor:g}"
    if state.lr_scale != 1.0:
        text += f" of the x{state.lr_scale:g} override in force (x{total:g} of the schedule)"
    if state.lr is not None:
        text += f": {_g(state.lr)} -> {_g(state.lr * factor)}"
    return total, text


def _grad_clip(p: ApplyParams, state: JobState) -> tuple[float | None, str]:
    """(absolute clip to send or None, words): relative to the clip in force; never a no-op."""
    current = state.grad_clip
    in_force = current if current is not None and current > 0 else None
    if p.grad_clip is not None:
        if in_force is not None and p.grad_clip >= in_force:
            return None, (
                f"grad_clip {p.grad_clip:g} dropped: the job already clips at {in_force:g} (it would change nothing)"
            )
        was = f" (was {in_force:g})" if in_force is not None else ""
        return p.grad_clip, f"clip grad norm at {p.grad_clip:g}{was}"
    if p.grad_clip_scale is None:
        return None, ""
    if in_force is not None:
        value = in_force * p.grad_clip_scale
        return (
            value,
            f"clip grad norm at {_g(value)} ({p.grad_clip_scale:g} x the clip in force, {in_force:g})",
        )
    if state.grad_norm is not None and state.grad_norm > 0:
        off = "the job does not clip" if current == 0 else "the job's clip is not known"
        return (
            state.grad_norm,
            f"clip grad norm at {_g(state.grad_norm)}, its median before the onset ({off})",
        )
    return None, "grad_clip_scale dropped: neither the job's clip nor its grad norm is known"


def _g(x: float) -> str:
    return f"{x:.3g}"


def _observe(p: ObserveParams, d: Diagnosis, obs: Observation, speed_fix: bool) -> Resolved:
    c = p.pass_
    setting = obs.throughput if c.throughput is None else c.throughput
    throughput = speed_fix if setting == "auto" else bool(setting)
    ratio = obs.throughput_min_ratio if c.throughput_min_ratio is None else c.throughput_min_ratio
    cover = d.onset_step + obs.onset_margin_steps
    params = {
        "steps": p.steps,
        "pass": {
            "loss_within_mads": c.loss_within_mads,
            "grad_norm_ratio_max": c.grad_norm_ratio_max,
            "update_ratio_max": c.update_ratio_max,
            "throughput": throughput,
            "throughput_min_ratio": ratio,
        },
        "baseline_until_step": d.onset_step,
        "cover_until_step": cover,
    }
    tput = f"sustained throughput >= {ratio:g}x this run's own" if throughput else "throughput not judged"
    if setting == "auto":
        tput += " (observation.throughput=auto: " + (
            "the fix changes precision)" if speed_fix else "no fix here changes step speed)"
        )
    detail = (
        f"watch at least {p.steps} steps and until step {cover} (onset {d.onset_step} + "
        f"observation.onset_margin_steps={obs.onset_margin_steps}) against the baseline before step "
        f"{d.onset_step}: loss within {c.loss_within_mads:g} MADs, grad norm <= {c.grad_norm_ratio_max:g}x, "
        f"update ratio <= {c.update_ratio_max:g}x, {tput}"
    )
    return params, detail
