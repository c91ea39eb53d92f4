"""An AMP GradScaler overflow the scaler handled is the fp16 loop working, not an incident.

The scaler found inf/NaN in the scaled gradients, skipped the step (no weights changed, the
update is zero) and halved its scale: the records say grad norm inf, ``overflow`` true,
``nonfinite`` false, the loss of the step finite and unchanged. That happens from time to time in
any fp16 run and opens nothing of severity medium or more. The real fp16-overflow phenotype is the
scale collapsing: overflow after overflow, the scale halved again and again (sampler cell
``78342``, a clean mlp/Lion/fp16 run: one overflow at step 99 opened a high incident and a
rollback).
"""

from __future__ import annotations

import math

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.traces.synthetic import synthetic_records

N = 300


def _run(overflow_at: set[int], seed: int = 0, scale0: float = 32768.0, ranks: int = 2):
    a = StreamingAnalyzer()
    scale = scale0
    for step, batch in group_steps(synthetic_records(N, ranks, seed=seed)):
        over = step in overflow_at
        for r in batch:
            r.loss_scale = scale
            if over:
                r.grad_norm = math.inf
                r.update_norm = 0.0
                r.overflow = True
                r.nonfinite = False
        if over:
            scale /= 2
        a.observe_step(step, batch)
    return a.finish().incidents


def _medium(ds) -> list:
    return [d.to_json() for d in ds if d.severity.value != "low"]


def test_one_overflow_the_scaler_handled_opens_nothing_of_medium_or_more() -> None:
    for seed in range(3):
        for at in ({99}, {150}, {99, 180}, {120, 121}):
            assert not _medium(_run(at, seed)), (seed, at)


def test_the_scalers_start_of_run_search_for_its_scale_is_no_incident() -> None:
    assert not _medium(_run(set(range(1, 9))))


def test_a_collapsing_loss_scale_is_the_fp16_overflow_phenotype() -> None:
    ds = _medium(_run(set(range(200, 216))))
    assert ds, "16 overflows in a row, the scale 32768 -> 0.5, opened nothing"
    d = ds[0]
    assert d["causes"][0]["cause"] == "numeric", d
    assert 200 <= d["onset_step"] <= 202, d
