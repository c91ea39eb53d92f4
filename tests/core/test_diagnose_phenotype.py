"""Phenotype and severity from an incident's trajectory alone (no detector involved)."""

from __future__ import annotations

import math

from supervisor.core.detect import DetectorSettings
from supervisor.core.diagnose import Facts, IncidentTrack, Point, classify
from supervisor.core.model import FirstAnomaly, Phenotype

ST = DetectorSettings()


def _incident(excess: list[float], steps: list[int] | None = None, band: float = 0.1) -> IncidentTrack:
    steps = steps or list(range(100, 100 + len(excess)))
    inc = IncidentTrack(1, steps[0], steps[0], FirstAnomaly(steps[0], "loss"), 0.0, Facts())
    for s, e in zip(steps, excess, strict=True):
        nonfinite = math.isinf(e)
        inb = e < band and not nonfinite
        if e > inc.peak_excess:
            if inc.trajectory:
                inc.facts.rising_steps += 1
            inc.peak_excess, inc.peak_step = e, s
        inc.trajectory.append(Point(s, e, 1.0, inb, nonfinite, loss_in_band=inb))
    return inc


def test_one_high_step_is_transient() -> None:
    assert classify(_incident([0.8, 0.02, 0.01, 0.0]), ST) is Phenotype.TRANSIENT


def test_a_plateau_that_ends_abruptly_is_transient() -> None:
    """Input-driven: 12 steps up (corrupt data on one rank), then back in one step."""
    assert classify(_incident([0.5] * 12 + [0.02, 0.01]), ST) is Phenotype.TRANSIENT


def test_gradual_decay_is_slow_recovery() -> None:
    excess = [0.9 * math.exp(-k / 6) for k in range(30)]
    assert classify(_incident(excess), ST) is Phenotype.SLOW_RECOVERY


def test_return_seen_only_across_a_gap_is_not_abrupt() -> None:
    """Logged every 10 steps, then a gap of 4000: the path back is unknown, so not 'abrupt'."""
    inc = _incident([0.9, 1.1, 0.9, 0.0], steps=[100, 110, 120, 4120])
    assert classify(inc, ST) is Phenotype.SLOW_RECOVERY


def test_new_peaks_are_divergence() -> None:
    assert classify(_incident([0.2, 0.4, 0.7, 1.1, 1.6]), ST) is Phenotype.DIVERGENCE


def test_nan_that_stays_is_divergence_and_a_single_nan_is_not() -> None:
    assert classify(_incident([math.inf, math.inf, math.inf]), ST) is Phenotype.DIVERGENCE
    assert classify(_incident([math.inf, 0.0, 0.0, 0.0]), ST) is Phenotype.TRANSIENT


def test_a_known_period_wins() -> None:
    inc = _incident([0.8, 0.0, 0.0])
    inc.period = 40
    assert classify(inc, ST) is Phenotype.PERIODIC
