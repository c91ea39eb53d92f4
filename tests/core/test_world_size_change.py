"""A data-parallel group that goes on with fewer ranks (a restart on the nodes left, or an elastic
run's trace): the global batch shrinks, so the mean gradient is noisier (its norm rises) and the
tokens of a step fall with the ranks. Both are the new regime, never evidence of a fault; a real
fault after the change is still found."""

from __future__ import annotations

import math

import pytest

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records

CHANGE = 260


def _steps(seed: int, n: int = 480) -> list[tuple[int, list[Record]]]:
    return list(group_steps(synthetic_records(n, 4, seed=seed)))


def _on_fewer_ranks(batch: list[Record], ranks: int) -> list[Record]:
    kept = [r for r in batch if r.rank < ranks]
    for r in kept:
        r.world_size = ranks
        r.grad_norm = (r.grad_norm or 0.0) * math.sqrt(4 / ranks)  # half the batch: a noisier mean
    return kept


def _run(seed: int, ranks: int, fault_at: int | None = None) -> StreamingAnalyzer:
    a = StreamingAnalyzer()
    for step, batch in _steps(seed):
        for r in batch:
            r.world_size = 4
        if step >= CHANGE:
            batch = _on_fewer_ranks(batch, ranks)
        if fault_at is not None and fault_at <= step < fault_at + 6:  # a 30x LR bug
            for r in batch:
                r.lr = (r.lr or 0.0) * 30
                r.update_norm = (r.update_norm or 0.0) * 30
                r.grad_norm = (r.grad_norm or 0.0) * 5
                set_loss(r, r.loss * 1.8)
        a.observe_step(step, batch)
    return a


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_going_on_with_fewer_ranks_opens_nothing(seed: int, ranks: int) -> None:
    a = _run(seed, ranks)
    assert not a.incidents, [d.to_json() for d in a.finish().incidents]


def test_a_fault_after_the_change_is_still_found() -> None:
    a = _run(0, 2, fault_at=CHANGE + 80)
    [d] = a.finish().incidents
    assert d.onset_step == CHANGE + 80
