"""apply and observe: change the recipe, then watch a window of steps against the baseline."""

from __future__ import annotations

import time
from typing import Any

from supervisor.incidents import EventKind
from supervisor.runtime.actions.base import DirectiveAction, Outcome, Runtime
from supervisor.runtime.observe import Baseline, evaluate
from supervisor.sdk.directives import ApplyOverrides, Continue, Directive, Exclusions


def exclusions(rt: Runtime, exclude: dict[str, Any] | None) -> Exclusions:
    """The policy's resolved ``exclude`` as SDK exclusions (a step range becomes batch indices)."""
    if not exclude:
        return Exclusions()
    ranges: tuple[tuple[int, int], ...] = ()
    if exclude.get("batch_range"):
        first, last = exclude["batch_range"]
        ranges = (rt.batch_range(int(first), int(last)),)
    return Exclusions(
        samples=tuple(exclude.get("samples") or ()),
        sources=tuple(exclude.get("sources") or ()),
        batch_ranges=ranges,
    )


class ApplyAction(DirectiveAction):
    """LR scale / warmup / clipping / exclusions / skip N, from the next step on (the SDK records
    each override as an event in the records)."""

    event = EventKind.FIX_APPLIED

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        return ApplyOverrides(
            lr_scale=params.get("lr_scale"),
            warmup_steps=params.get("warmup_steps"),
            grad_clip=params.get("grad_clip"),
            exclusions=exclusions(rt, params.get("exclude")),
            skip_batches=int(params.get("skip_batches") or 0),
            id=action_id,
        )

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        unsupported = ["precision"] if params.get("precision") else []
        return Outcome.done(overrides=memo["directive"], unsupported=unsupported, **out.result)


class ObserveAction:
    """Release the freeze, run N steps, and pass or fail them against the pre-incident baseline."""

    event = EventKind.OBSERVATION

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        return {
            "from_step": rt.current_step,
            "steps": int(params.get("steps", 100)),
            "release": Continue(id=f"{action_id}-release").to_dict(),
            "started_at": time.time(),
        }

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> None:
        rt.issue(Directive.from_dict(memo["release"]))
        rt.set_frozen(False)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        window = rt.window_after(memo["from_step"])
        if rt.incidents_opened_since(memo["from_step"]):
            why = "a new anomaly was detected inside the observation window"
            return Outcome.fail(
                why, steps=len(window), passed=False, checks={"no_new_anomaly": {"ok": False, "detail": why}}
            )
        if len(window) < memo["steps"] and not rt.training_ended():
            return None
        base = rt.baseline()
        if rt.training_ended() and len(window) < 5:
            return Outcome.done(
                passed=None, steps=len(window), note="training ended before the window could run"
            )
        if base is None or len(window) < 5:
            return Outcome.fail(
                f"not enough steps to judge (baseline {base is not None}, window {len(window)})"
            )
        checks = evaluate(Baseline.from_json(base), window[: memo["steps"]], params.get("pass") or {})
        failed = [c.name for c in checks if not c.passed]
        result = {
            "window": [window[0].step, window[min(len(window), memo["steps"]) - 1].step],
            "checks": {
                c.name: {"ok": c.passed, "value": c.value, "limit": c.limit, "detail": c.detail}
                for c in checks
            },
            "baseline": base,
            "passed": not failed,
        }
        if failed:
            return Outcome.fail(f"observation failed: {', '.join(failed)}", **result)
        return Outcome.done(**result)
