"""Exclusions filtered a block at a time, and samples found by ID, without a table of the dataset."""

from __future__ import annotations

import numpy as np
import pytest

from supervisor.sdk import Exclusions, SupervisedLoader
from supervisor.sdk.data import lookup
from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.order import Permutation
from supervisor.sdk.data.schedule import BLOCK, Schedule


class Indexed:
    """``n`` samples named ``"<i>"`` (no ``sample_id``: the loader's default IDs)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Named(Indexed):
    """IDs of the dataset's own making; ``index_of`` inverts them when ``invertible``."""

    def __init__(self, n: int, invertible: bool) -> None:
        super().__init__(n)
        if invertible:
            self.index_of = lambda sid: int(sid[4:]) if sid.startswith("doc-") else None

    def sample_id(self, i: int) -> str:
        return f"doc-{i}"

    def source(self, i: int) -> str:
        return ("web", "books", "code")[i % 3]


def naive_order(ds, n_draws: int, excluded: set[str], sources: set[str], batch: int) -> list[str]:
    """The reference: walk the permutation one index at a time and name every sample."""
    name = getattr(ds, "sample_id", str)
    source = getattr(ds, "source", lambda i: "default")
    out: list[str] = []
    epoch = 0
    while len(out) < n_draws * batch:
        for i in Permutation(len(ds), 0, epoch).block(0, len(ds)).tolist():
            if str(name(i)) not in excluded and source(i) not in sources:
                out.append(str(name(i)))
        epoch += 1
    return out[: n_draws * batch]


@pytest.mark.parametrize("ds", [Indexed(3 * BLOCK + 17), Named(2 * BLOCK + 5, True), Named(BLOCK + 3, False)])
def test_block_filter_draws_what_a_per_sample_check_would(ds):
    rng = np.random.default_rng(1)
    name = getattr(ds, "sample_id", str)
    excluded = {str(name(int(i))) for i in rng.integers(0, len(ds), size=len(ds) // 3)}
    sources = {"books"} if isinstance(ds, Named) else set()
    ld = SupervisedLoader(ds, 8, seed=0, rank=0, world_size=1, collate_fn=list)
    ld.exclude(Exclusions(samples=tuple(excluded) + ("042", "-1", "doc-x"), sources=tuple(sources)))
    draws = (len(ds) // 8) + 40  # past an epoch boundary and over several blocks
    got = [sid for _ in range(draws) for sid in ld.batch_meta(ld.next_batch()).sample_ids]
    assert got == naive_order(ds, draws, excluded, sources, 8)


def test_an_exclusion_added_inside_a_block_takes_effect_at_the_next_batch():
    ex = ExclusionSet()
    sched = Schedule(10_000, 4, rank=0, world_size=1, seed=0, shuffle=True, sample_id=None, source=None,
                     exclusions=ex, index_of=lookup.inverse(Indexed(10_000), 10_000))  # fmt: skip
    first = sched.next()
    ahead = Permutation(10_000, 0, 0).block(4, 8).tolist()
    ex.add(Exclusions(samples=(str(ahead[0]), str(ahead[5]))))
    nxt = sched.next().indices + sched.next().indices
    assert first.indices == Permutation(10_000, 0, 0).block(0, 4).tolist()
    assert nxt == [
        i for i in Permutation(10_000, 0, 0).block(4, 10).tolist() if i not in (ahead[0], ahead[5])
    ]


def test_member_matches_a_set():
    rng = np.random.default_rng(0)
    excluded = np.unique(rng.integers(0, 10**9, size=50_000))
    block = np.concatenate([rng.choice(excluded, 300), rng.integers(0, 10**9, size=3_000)])
    rng.shuffle(block)
    as_set = set(excluded.tolist())
    want = np.array([int(b) in as_set for b in block])
    assert (lookup.member(block, excluded) == want).all() and want.sum() >= 300
    assert not lookup.member(block, np.array([], dtype=np.int64)).any()


def test_default_ids_invert_only_in_canonical_form():
    inv = lookup.inverse(Indexed(100), 100)
    assert inv is not None
    assert [inv(s) for s in ("0", "42", "99", "100", "042", "-1", "4.0", "x", "")] == [
        0, 42, 99, None, None, None, None, None, None,
    ]  # fmt: skip
    assert lookup.inverse(Named(10, False), 10) is None
    assert lookup.inverse(Named(10, True), 10)("doc-3") == 3
