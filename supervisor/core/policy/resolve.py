"""Turn an action's policy parameters into concrete ones for one incident, with the reason.

Symbolic values (`suspects`, `suspect`, `incident`) are replaced by what the diagnosis
names; the rollback target is chosen from the known checkpoints. Resolution raises
``NoRollbackTarget`` when no checkpoint may be restored: the engine then escalates.
"""

from __future__ import annotations

from collections.abc import Callable
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

Resolved = tuple[dict[str, Any], str]


class NoRollbackTarget(Exception):
    """No checkpoint qualifies as a rollback target; the message says why."""


def resolve(name: str, params: ActionParams, d: Diagnosis, state: JobState) -> Resolved:
    """(concrete params, detail sentence) of one action."""
    fn = _RESOLVERS.get(name)
    if fn is None:
        return params.model_dump(by_alias=True), ACTIONS[name].summary
    return fn(params, d, state)


def _rollback(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, RollbackParams)
    limit = d.onset_step - p.margin_steps
    marks = {HealthMark.HEALTHY} if p.min_mark == "healthy" else {HealthMark.HEALTHY, HealthMark.VERIFIED}
    where = f"at or before step {limit} (onset {d.onset_step} - margin_steps={p.margin_steps})"
    params = {
        "margin_steps": p.margin_steps,
        # Invariant: whatever the policy says, the target is re-verified before loading.
        "require_verified": True,
        "min_mark": p.min_mark,
        "check_completeness": p.check_completeness,
        "max_target_step": limit,
        "target_step": None,
    }
    complete = "; state completeness checked" if p.check_completeness else ""
    known = state.checkpoint_refs
    if known is None:
        detail = f"target step chosen at run time, margin {p.margin_steps} steps: newest {p.min_mark} checkpoint {where}"
        return params, f"{detail}; re-verified before loading{complete}"
    eligible = [c for c in known if c.step <= limit and c.mark in marks]
    if not eligible:
        listed = ", ".join(f"{c.step} {c.mark.value}" for c in known) or "none"
        raise NoRollbackTarget(f"no {p.min_mark} checkpoint {where} (known checkpoints: {listed})")
    target = eligible[-1]
    passed = [f"{c.step} {c.mark.value}" for c in known if target.step < c.step <= limit]
    params["target_step"] = target.step
    detail = (
        f"target step {target.step} ({target.mark.value}), margin {p.margin_steps} steps: "
        f"newest {p.min_mark} checkpoint {where}"
    )
    if passed:
        detail += f"; passing over {', '.join(passed)}"
    return params, detail + f"; re-verified before loading{complete}"


def _exclude(e: Exclude, d: Diagnosis) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    words: list[str] = []
    if e.samples is not None:
        out["samples"] = list(d.suspect_samples) if e.samples == "suspects" else list(e.samples)
        words.append(f"{len(out['samples'])} sample(s)" if out["samples"] else "no samples (none named)")
    if e.sources is not None:
        src = ([d.source_local] if d.source_local else []) if e.sources == "suspect" else list(e.sources)
        out["sources"] = src
        words.append(f"source(s) {', '.join(src)}" if src else "no source (incident not source-local)")
    if e.batch_range is not None:
        end = d.end_step if d.end_step is not None else d.peak_step
        rng = [d.onset_step, end] if e.batch_range == "incident" else list(e.batch_range)
        out["batch_range"] = rng
        words.append(f"batches of steps {rng[0]}..{rng[1]}")
    return out, words


def _apply(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, ApplyParams)
    params = p.model_dump(exclude_none=True, exclude={"exclude"})
    words = []
    if p.lr_scale is not None:
        words.append(f"LR x{p.lr_scale:g}")
    if p.warmup_steps is not None:
        words.append(f"re-warm over {p.warmup_steps} steps")
    if p.grad_clip is not None:
        words.append(f"clip grad norm at {p.grad_clip:g}")
    if p.precision is not None:
        words.append(f"precision {p.precision}")
    if p.exclude is not None:
        params["exclude"], excluded = _exclude(p.exclude, d)
        words.append("quarantine " + ", ".join(excluded))
    if p.skip_batches is not None:
        words.append(f"skip {p.skip_batches} batches after the resume point")
    return params, "; ".join(words)


def _observe(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, ObserveParams)
    c = p.pass_
    params = p.model_dump(by_alias=True) | {"baseline_until_step": d.onset_step}
    detail = (
        f"watch {p.steps} steps against the baseline before step {d.onset_step}: loss within "
        f"{c.loss_within_mads:g} MADs, grad norm <= {c.grad_norm_ratio_max:g}x, update ratio <= "
        f"{c.update_ratio_max:g}x, throughput >= {c.throughput_min_ratio:g}x"
    )
    return params, detail


def _replay(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, ReplayParams)
    params = p.model_dump() | {"from_step": d.onset_step, "suspect_rank": d.first_rank}
    where = " on another rank than the suspect one" if p.other_rank else ""
    control = " and a control batch" if p.control else ""
    return params, f"replay {p.batches} batch(es) from step {d.onset_step}{control}{where}"


def _snapshot(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, SnapshotParams)
    # A snapshot of a suspect state is evidence: marked diagnostic, never a rollback target.
    return p.model_dump() | {"mark": HealthMark.DIAGNOSTIC.value}, "save the suspect state, marked diagnostic"


def _message(p: Any, d: Diagnosis, state: JobState) -> Resolved:
    assert isinstance(p, AlertParams | EscalateParams | StopParams)
    summary = {AlertParams: "alert", EscalateParams: "escalate", StopParams: "stop"}[type(p)]
    detail = ACTIONS[summary].summary
    return p.model_dump(), f"{detail}: {p.message}" if p.message else detail


_RESOLVERS: dict[str, Callable[[Any, Diagnosis, JobState], Resolved]] = {
    "rollback": _rollback,
    "apply": _apply,
    "observe": _observe,
    "replay": _replay,
    "snapshot": _snapshot,
    "alert": _message,
    "escalate": _message,
    "stop": _message,
}
