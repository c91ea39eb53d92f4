"""The end-of-run rule (``core/run_end.py``) against what a fault at the last step looks like and
what a drift does: an update that leaps out of band in the last step or two opens an incident, an
update ratio that climbs through its band over many steps (the optimizer settling on a new data
mixture, a schedule) does not."""

from __future__ import annotations

import math

import pytest

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.detect import Signals
from supervisor.core.run_end import judge_end
from supervisor.traces.synthetic import synthetic_records

STEPS = 200


def _scale_updates(records, factor_at) -> None:  # type: ignore[no-untyped-def]
    for r in records:
        f = factor_at(r.step)
        if f != 1.0 and r.update_norm is not None:
            r.update_norm *= f


def _judged(records) -> tuple[list[str], list[Signals]]:  # type: ignore[no-untyped-def]
    an = StreamingAnalyzer()
    for step, batch in group_steps(records):
        assert not an.observe_step(step, batch), f"an incident before the end, at step {step}"
    return [u.kind for u in judge_end(an)], list(an.recent)


def _trailing(recent: list[Signals], threshold: float) -> int:
    n = 0
    for sig in reversed(recent):
        if sig.update_z is None or sig.update_z < threshold:
            break
        n += 1
    return n


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_an_update_ratio_climbing_through_its_band_at_the_end_is_no_incident(seed: int) -> None:
    recs = synthetic_records(STEPS, 4, seed=seed)
    first, climb = STEPS - 9, math.log(1.4) / 9  # 1.4x over the last 9 steps, a little more each step
    _scale_updates(recs, lambda s: math.exp(climb * (s - first + 1)) if s >= first else 1.0)
    kinds, recent = _judged(recs)
    st = StreamingAnalyzer().settings
    # The premise: the last step is out as far as a fault's (and fewer than three steps are, so no
    # mid-run rule fired), but the ratio has been climbing out of its band for longer than that.
    assert 0 < _trailing(recent, st.grad_z_threshold) < 3, [s.update_z for s in recent[-10:]]
    assert _trailing(recent, st.band_z) >= 3, [s.update_z for s in recent[-10:]]
    assert kinds == [], [s.update_z for s in recent[-10:]]


@pytest.mark.parametrize(("factor", "last"), [(1.6, 1), (38.0, 1), (38.0, 2)])
def test_an_update_that_leaps_out_of_band_in_the_last_steps_is_an_incident(factor: float, last: int) -> None:
    recs = synthetic_records(STEPS, 4, seed=7)
    _scale_updates(recs, lambda s: factor if s > STEPS - last else 1.0)
    kinds, recent = _judged(recs)
    assert kinds == ["opened", "ready"], [s.update_z for s in recent[-5:]]
