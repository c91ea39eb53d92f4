"""A loader worker's turns counted past the others' batches equal stepping through every batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.lookup import inverse
from supervisor.sdk.data.order import Permutation
from supervisor.sdk.data.schedule import BLOCK, Cursor, Schedule
from supervisor.sdk.directives import Exclusions


def schedule(n, ex, *, batch=4, world=2, rank=1, shuffle=True):
    return Schedule(
        n, batch, rank=rank, world_size=world, seed=9, shuffle=shuffle, sample_id=None, source=None,
        exclusions=ex, index_of=inverse(range(n), n),
    )  # fmt: skip


def as_tuple(draw):
    return draw.batch_index, draw.indices, draw.sample_ids, draw.sources, draw.after


@pytest.mark.parametrize(
    ("n", "shuffle", "turns"),
    [(10_000, True, 400), (10_000, False, 400), (13, True, 12)],  # 13: fewer allowed than one batch
)
def test_counted_turns_equal_stepping_through_every_batch(monkeypatch, n, shuffle, turns):
    perm0, perm1 = (Permutation(n, 9, e, shuffle=shuffle) for e in (0, 1))
    rng = np.random.default_rng(1)
    # Excluded: runs of samples straddling the block boundaries of epochs 0 and 1, the end of
    # epoch 0, and a random sixth of the rest; IDs that name no sample are dropped.
    around = [p for b in (BLOCK, 2 * BLOCK) for p in range(b - 3, b + 3) if p < n] + list(range(n - 4, n))
    excluded = set(perm0.block(0, n)[around].tolist()) if n > 2 * BLOCK else {int(perm0[n - 1])}
    excluded |= set(perm1.block(0, n)[[p for p in around if p < n]].tolist()) if n > 2 * BLOCK else set()
    excluded |= set(rng.choice(n, n // 6 if n > 100 else 5, replace=False).tolist())
    ex = ExclusionSet()
    ex.add(Exclusions(samples=(*map(str, excluded), "007", "x"), batch_ranges=((3, 5), (150, 151))))
    base = schedule(n, ex, shuffle=shuffle)
    base.cursor = Cursor(epoch=0, pos=around[0] if n > 2 * BLOCK else 2, batch=10, skip_pending=2)
    workers = 3
    stepping = base.for_worker()
    want = [as_tuple(stepping.next()) for _ in range(turns * workers)]
    assert want[-1][-1].epoch >= 1, "the walk crosses an epoch end"

    mapped: list[int] = []
    at = Permutation.at
    monkeypatch.setattr(Permutation, "at", lambda self, p: mapped.append(len(p)) or at(self, p))
    monkeypatch.setattr(Permutation, "block", lambda *a: pytest.fail("a worker mapped a whole block"))
    for worker in range(workers):
        copy = base.for_worker()
        got = [as_tuple(d) for d in itertools.islice(copy.turns(worker, workers), turns)]
        assert got == want[worker::workers]
        assert copy.cursor == got[-1][-1]
    # Only each worker's own rank's samples were mapped: batch size x its turns (a run ahead at most).
    assert turns * workers * 4 <= sum(mapped) <= (turns + BLOCK // 4) * workers * 4


def test_excluded_sources_walk_every_batch_and_agree():
    ex = ExclusionSet()
    ex.add(Exclusions(sources=("nothing-named-so",), samples=("5",)))
    base = schedule(1_000, ex)
    stepping = base.for_worker()
    want = [as_tuple(stepping.next()) for _ in range(40)]
    got = [as_tuple(d) for d in itertools.islice(base.for_worker().turns(1, 2), 20)]
    assert not base._countable() and got == want[1::2]
