"""Rank-local detection whose sensitivity does not fall with the number of ranks (issue 26,
point 0): one rank's garbage batch lifts the mean over N ranks by only (ratio - 1) / N, so a rank
that leaves its own band and the cross-rank distribution is an incident on its own evidence."""

from __future__ import annotations

import random

import pytest

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records

SIZES = (2, 16, 128, 1024)
FAULT_STEP = 120


def _steps(ranks: int, seed: int, n: int = 170) -> list[tuple[int, list[Record]]]:
    return list(group_steps(synthetic_records(n, ranks, seed=seed, samples_per_rank=1)))


def _run(ranks: int, seed: int, *, fault: bool) -> list:
    rng = random.Random(seed)
    bad = rng.randrange(ranks)
    a = StreamingAnalyzer()
    for step, batch in _steps(ranks, seed):
        if fault and step == FAULT_STEP:
            r = batch[bad]
            set_loss(r, r.loss * 1.7)  # a garbage batch on one rank
            for x in batch:  # its gradient is 1/N of the all-reduced one
                x.grad_norm = (x.grad_norm or 0.0) * (1.0 + 3.0 / ranks)
        a.observe_step(step, batch)
    return [bad, a.finish().incidents]


@pytest.mark.parametrize("ranks", SIZES)
def test_one_rank_garbage_batch_is_found_at_every_size(ranks: int) -> None:
    for seed in range(2 if ranks < 1024 else 1):
        bad, found = _run(ranks, seed, fault=True)
        assert [(d.onset_step, d.first_rank, d.rank_local) for d in found] == [(FAULT_STEP, bad, True)], (
            ranks,
            [d.to_json() for d in found],
        )


@pytest.mark.parametrize("ranks", SIZES)
def test_clean_runs_raise_nothing_at_every_size(ranks: int) -> None:
    for seed in range(3 if ranks < 128 else 1):
        _, found = _run(ranks, 10 + seed, fault=False)
        assert not found, (ranks, [d.to_json() for d in found])
