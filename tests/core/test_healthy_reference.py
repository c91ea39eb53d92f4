"""``core.reference.healthy_reference``: what the healthy run's metric did over a window's steps."""

from __future__ import annotations

from supervisor.core.reference import healthy_reference


def rising(onset: int) -> list[tuple[int, float]]:
    """A grad norm that grows 1 -> 60 as the run trains, up to the step before the onset."""
    return [(s, float(s)) for s in range(1, onset)]


def test_past_the_onset_the_reference_is_the_level_at_the_onset() -> None:
    # No rollback: the window starts at step 70, every step past the onset at 61.
    ref = healthy_reference(rising(61), 61, range(71, 171), level_window=16)
    assert ref == 52.5  # the median of steps 45-60, not of steps 1-60 (30.5)


def test_steps_the_window_re_runs_take_the_healthy_run_s_own_values() -> None:
    # A rollback to 10 on a falling metric: the window re-runs steps 11-60 at their own (high) values.
    falling = [(s, 100.0 - s) for s in range(1, 61)]
    ref = healthy_reference(falling, 61, range(11, 61), level_window=16)
    assert ref == 64.5  # the median of 89..40, not the level at the onset (47.5)


def test_a_window_across_the_onset_mixes_both() -> None:
    ref = healthy_reference(rising(61), 61, range(41, 141), level_window=16)
    assert ref == 52.5  # 20 re-run steps (41-60) and 80 at the level


def test_a_missing_step_counts_at_the_level_and_no_values_give_none() -> None:
    gappy = [(s, float(s)) for s in range(1, 61) if s != 50]
    assert healthy_reference(gappy, 61, range(50, 51), level_window=16) == 52.5  # steps 44-60 but 50
    assert healthy_reference([], 61, range(41, 141), level_window=16) is None


def test_values_at_or_after_the_onset_are_not_the_healthy_run() -> None:
    values = rising(61) + [(61, 1e6), (62, 1e6)]
    assert healthy_reference(values, 61, range(61, 100), level_window=16) == 52.5
