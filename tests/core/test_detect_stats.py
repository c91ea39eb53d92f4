"""Rolling robust statistics: exact median/MAD, trend-aware z, rollback, checkpointing."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.stats import LevelTracker, RollingWindow, sorted_mad


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=80))
@settings(max_examples=200, deadline=None)
def test_sorted_mad_equals_brute_force(xs: list[float]) -> None:
    s = sorted(xs)
    m = statistics.median(s)
    assert math.isclose(sorted_mad(s), statistics.median([abs(x - m) for x in s]), rel_tol=1e-9, abs_tol=1e-9)


@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=60), st.integers(1, 20))
@settings(max_examples=100, deadline=None)
def test_rolling_window_keeps_only_the_last_values(xs: list[float], size: int) -> None:
    w = RollingWindow(size)
    for i, x in enumerate(xs):
        w.push(x)
        if i % 3 == 0:  # read between pushes: a cached MAD must follow the window
            w.mad()
    tail = xs[-size:]
    assert len(w) == len(tail)
    assert w.median() == statistics.median(tail)
    m = statistics.median(tail)
    assert math.isclose(w.mad(), statistics.median([abs(x - m) for x in tail]), abs_tol=1e-9)


def test_cached_mad_follows_pop_and_clear() -> None:
    w = RollingWindow(8, [1.0, 2.0, 3.0, 10.0])
    assert w.mad() == 1.0
    w.pop_newest()
    assert w.mad() == 1.0 and w.values() == [1.0, 2.0, 3.0]
    w.push(3.0)
    assert w.mad() == 0.5
    w.clear()
    w.push(5.0)
    assert w.mad() == 0.0


def test_identical_values_do_not_divide_by_zero() -> None:
    t = LevelTracker(window=50, level_size=8, floor=0.01)
    for i in range(30):
        t.push(1.0, i)
    assert t.scale() == 0.01
    assert t.z(1.0) == 0.0
    assert t.z(1.1) > 9


def test_z_follows_a_trend_instead_of_flagging_it() -> None:
    """A steadily falling loss is not anomalous; the same value as a jump against a flat level is."""
    falling = LevelTracker(window=200, level_size=8, floor=0.001)
    for i in range(100):
        falling.push(-0.01 * i, i)
    assert abs(falling.z(-1.0)) < 6  # the next value on the trend
    assert falling.z(-0.99 + 0.2) > 6  # 0.2 above the trend


def test_forget_after_takes_back_replayed_steps() -> None:
    t = LevelTracker(window=100, level_size=4, floor=0.01)
    for i in range(20):
        t.push(float(i % 3), i)
    before = t.state_dict()
    for i in range(20, 23):
        t.push(50.0, i)
    assert t.forget_after(19) == 3
    assert t.state_dict()["resid"] == before["resid"]
    assert t.z(50.0) > 6


def test_state_dict_round_trip() -> None:
    t = LevelTracker(window=64, level_size=8, floor=0.02)
    for i in range(100):
        t.push(math.sin(i / 5), i)
    u = LevelTracker(window=64, level_size=8, floor=0.5)
    u.load_state_dict(t.state_dict())
    for x in (-1.0, 0.0, 0.3, 2.0):
        assert u.z(x) == t.z(x)
