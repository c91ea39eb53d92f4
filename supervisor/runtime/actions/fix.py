"""apply and observe: change the recipe, then watch a window of steps against the baseline."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from supervisor.runtime import effects
from supervisor.runtime.actions.base import DirectiveAction, Outcome, Runtime
from supervisor.runtime.observe import Baseline, Check, evaluate, evaluate_young
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
    """The recipe's overrides, from the next step on (the SDK records each as an event)."""

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
        # The detector must take the fix's own effects (an LR ramp, a new clip) as expected.
        note = effects.NoteOverrides(int(out.result.get("acked_at_step", rt.current_step)), params,
                             f"fix of incident {rt.incident_id}")  # fmt: skip
        done = Outcome.done(overrides=memo["directive"], unsupported=unsupported, **out.result)
        return replace(done, effects=(note,))


class ObserveAction:
    """Release the freeze, run N steps -- and at least to the onset plus a margin, so a fault that
    comes back at its own step is inside the window -- then pass or fail each criterion against
    the pre-incident baseline of the same run."""

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        steps = int(params.get("steps", 100))
        end = max(rt.current_step + steps, rt.diagnosis.onset_step + rt.policy.observation.onset_margin_steps)
        return {
            "from_step": rt.current_step,
            "steps": end - rt.current_step,
            "onset_step": rt.diagnosis.onset_step,
            "release": Continue(id=f"{action_id}-release").to_dict(),
            "started_at": time.time(),
        }

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        return effects.Issue(Directive.from_dict(memo["release"])), effects.SetFrozen(False)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        window = rt.window_after(memo["from_step"])
        events = event_checks(rt, memo["from_step"])
        early = any(not c.passed for c in events)  # the fault came back, or a new anomaly: fail now
        ended = not early and rt.training_ended()
        short = len(window) < memo["steps"]
        if not early and short and not ended:
            return None
        stop = rt.stop_requested if ended else None
        if stop is not None and short:  # a stopped window is not a passed one
            return Outcome.skip(
                f"stopped on request ({stop}) {len(window)} of {memo['steps']} steps into the observation window",
                steps=len(window),
            )
        if ended and len(window) < 5:
            return Outcome.skip(
                f"training ended {len(window)} step(s) into the observation window", steps=len(window)
            )
        window = window[: memo["steps"]]
        base = rt.baseline()
        checks = list(events)
        if base is not None and window:  # every criterion, on the steps seen so far when failing early
            # A window from step 1 re-trains the run from its start (a rollback to it).
            start = memo["from_step"] <= 1
            judged = evaluate(
                Baseline.from_json(base), window, criteria(rt, params.get("pass") or {}), from_start=start
            )
            checks = judged + checks
        elif window:  # a fault in the run's first steps: what can be judged without a baseline
            checks = evaluate_young(window, memo.get("onset_step", 1) - 1) + checks
        failed = [c.name for c in checks if not c.passed]
        result = {
            "window": [window[0].step, window[-1].step] if window else [memo["from_step"], memo["from_step"]],
            "covers_onset": bool(window) and window[-1].step >= memo.get("onset_step", 0),
            "checks": {
                c.name: {"ok": c.passed, "value": c.value, "limit": c.limit, "detail": c.detail}
                for c in checks
            },
            "baseline": base,
            "passed": not failed,
        }
        if early:
            result["ended_early_at_step"] = rt.current_step
        if failed:
            return Outcome.fail(f"observation failed: {', '.join(failed)}", **result)
        if ended and short:
            # Every step the run gave went through the detector and nothing failed, but the window
            # is shorter than asked: not a passed observation (the fix is unverified).
            result["passed"] = None
            return Outcome.skip(
                f"training ended {len(window)} of {memo['steps']} steps into the observation window",
                steps=len(window), **result,
            )  # fmt: skip
        return Outcome.done(**result)


def event_checks(rt: Runtime, from_step: int) -> list[Check]:
    """Criteria on what was detected inside the window: the fault coming back (at any severity,
    even a ``low`` blip: the fix did not hold) and a new anomaly of medium or higher severity."""
    back = rt.recurrences_since(from_step)
    where = ", ".join(f"onset {r['onset_step']} ({r['severity']})" for r in back[:5])
    recurrence = Check(
        "recurrence", not back, float(len(back)), 0.0,
        f"the fault came back inside the window: {where}" if back else "the fault did not come back",
    )  # fmt: skip
    new = rt.incidents_opened_since(from_step)
    anomaly = Check(
        "no_new_anomaly", not new, float(new), 0.0,
        f"{new} new incident(s) of medium or higher severity inside the window" if new else "none",
    )  # fmt: skip
    return [recurrence, anomaly]


def criteria(rt: Runtime, given: dict[str, Any]) -> dict[str, Any]:
    """The action's pass criteria over the policy's ``observation`` defaults (read defensively:
    a policy without the section keeps the built-in defaults)."""
    section = getattr(rt.policy, "observation", None)
    out = {k: v for k, v in given.items() if v is not None}
    if section is not None:
        out.setdefault("throughput", getattr(section, "throughput", True))
        out.setdefault("throughput_min_ratio", getattr(section, "throughput_min_ratio", 0.8))
    return out
