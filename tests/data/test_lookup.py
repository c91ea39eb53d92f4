"""Exclusions filtered a block at a time, and samples found by ID, without a table of the dataset."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from supervisor.errors import SupervisorError
from supervisor.sdk import Exclusions, SupervisedLoader
from supervisor.sdk.data import lookup
from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.order import Permutation
from supervisor.sdk.data.schedule import BLOCK, Schedule
from supervisor.sdk.data.shards import IterableShards, WebDatasetShards
from supervisor.sdk.replay import _batch_of, _control_batch
from tests.data.conftest import collate_rows, hf_stream, wds_source


class Indexed:
    """``n`` samples named ``"<i>"`` (no ``sample_id``: the loader's default IDs); counts reads."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.reads += 1
        return i


class Named(Indexed):
    """IDs of the dataset's own making; ``index_of`` inverts them when ``invertible``."""

    def __init__(self, n: int, invertible: bool) -> None:
        super().__init__(n)
        if invertible:
            self.index_of = lambda sid: int(sid[4:]) if sid.startswith("doc-") else None

    def sample_id(self, i: int) -> str:
        self.named = getattr(self, "named", 0) + 1
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


def bounded(fn):
    """``fn()`` and the peak of Python allocations while it ran."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("ds", [Indexed(10**12), Named(10**12, True)])
def test_replay_finds_samples_at_a_trillion_indices_without_a_table(ds):
    ld = SupervisedLoader(ds, 4, seed=0, rank=0, world_size=1, collate_fn=list)
    name = getattr(ds, "sample_id", str)
    want = [7, 10**12 - 1, 123_456_789_012, 7]
    (batch, peak) = bounded(lambda: _batch_of(ld, [str(name(i)) for i in want]))
    assert batch == want and ds.reads <= len(want)
    assert peak < 1 << 20  # a table of 10^12 IDs would not fit; a few IDs take a few KB
    assert getattr(ds, "named", 0) <= 4 + 4 + 4  # the IDs asked for, one check each: no scan
    (control, ids), peak = bounded(lambda: _control_batch(ld, 3, {str(name(0))}))
    assert len(control) == 3 and str(name(0)) not in ids and peak < 1 << 20
    with pytest.raises(SupervisorError, match="not in the dataset"):
        _batch_of(ld, [str(name(3)), "no-such-sample", str(10**12)])


def test_ids_that_do_not_invert_are_scanned_lazily_and_stop_when_found():
    ds = Named(200_000, invertible=False)
    ld = SupervisedLoader(ds, 4, seed=0, rank=0, world_size=1, collate_fn=list)
    got, peak = bounded(lambda: ld.samples(["doc-5000", "doc-17"]))
    assert got == [5000, 17]
    assert ds.named <= 5000 + lookup.SCAN_BLOCK  # stopped at the block holding the last one found
    assert peak < 1 << 20
    with pytest.raises(SupervisorError, match="deadline"):
        _batch_of(ld, ["doc-unknown"], deadline=time.monotonic() - 1)


def test_stream_samples_by_shard_offset_and_by_key(jsonl_shards, tar_shards, rows):
    plain = SupervisedLoader(
        IterableShards([{"n": k} for k in range(50)]), 4, rank=0, world_size=1, collate_fn=list
    )
    assert plain.samples(["stream:41", "stream:3"]) == [{"n": 41}, {"n": 3}]  # <shard>:<offset>, opened there
    with pytest.raises(KeyError):
        plain.samples(["stream:50"])
    for src, kw in ((hf_stream(jsonl_shards), {}), (WebDatasetShards(tar_shards), {"source_fn": wds_source})):
        ld = SupervisedLoader(src, 4, rank=0, world_size=1, collate_fn=collate_rows, **kw)
        picked = [rows[200], rows[3]]  # keys: found by streaming the shards past
        batch = _batch_of(ld, [r["id"] for r in picked])
        assert batch["input_ids"].tolist() == [r["tokens"] for r in picked]
        control, ids = _control_batch(ld, 2, {rows[0]["id"]})
        assert len(ids) == 2 and rows[0]["id"] not in ids and control["input_ids"].shape[0] == 2
