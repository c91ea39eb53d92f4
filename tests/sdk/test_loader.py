"""The supervised loader: stable IDs, a resumable cursor, exclusions and skips."""

from __future__ import annotations

import pytest

from examples.tinylm.data import collate
from supervisor.sdk import Exclusions, SupervisedLoader


def loader(ds, **kw):
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return SupervisedLoader(ds, 4, seed=3, collate_fn=collate, **kw)


def ids(ld, n):
    return [ld.next_batch()["sample_ids"] for _ in range(n)]


def test_same_seed_same_order_and_ids_are_not_text(dataset):
    a, b = ids(loader(dataset), 5), ids(loader(dataset), 5)
    assert a == b
    for sid in sum(a, []):
        source, name, offset = sid.split(":")
        assert source in {"code", "docstrings", "tests"} and name.endswith(".py") and offset.isdigit()


def test_cursor_replays_exactly(dataset):
    ld = loader(dataset)
    ids(ld, 3)
    state = ld.state_dict()
    first = ids(ld, 4)
    ld.load_state_dict(state)
    assert ids(ld, 4) == first


def test_exclusions_and_skip(dataset):
    ld = loader(dataset)
    state = ld.state_dict()
    plain = ids(ld, 6)
    ld.load_state_dict(state)
    ld.exclude(Exclusions(samples=(plain[0][1],), sources=("tests",)))
    got = sum(ids(ld, 6), [])
    assert plain[0][1] not in got and not any(s.startswith("tests:") for s in got)
    kept = [s for s in sum(plain, []) if s != plain[0][1] and not s.startswith("tests:")]
    assert got[: len(kept)] == kept  # the same order, minus exclusions


def test_batch_ranges_and_skip_consume_batches(dataset):
    ld = loader(dataset)
    state = ld.state_dict()
    plain = [ld.next_batch() for _ in range(6)]
    ld.load_state_dict(state)
    ld.exclude(Exclusions(batch_ranges=((1, 2),)))
    ld.skip(1)
    got = [ld.next_batch()["batch_index"] for _ in range(3)]
    assert got == [3, 4, 5]
    assert plain[3]["batch_index"] == 3
    restored = SupervisedLoader(dataset, 4, seed=3, collate_fn=collate, rank=0, world_size=1)
    restored.load_state_dict(ld.state_dict())
    assert restored.exclusions() == ld.exclusions()


def test_ranks_split_one_global_batch(dataset):
    r0, r1 = loader(dataset, rank=0, world_size=2), loader(dataset, rank=1, world_size=2)
    single = SupervisedLoader(dataset, 8, seed=3, collate_fn=collate, rank=0, world_size=1)
    for _ in range(3):
        a, b, both = r0.next_batch(), r1.next_batch(), single.next_batch()
        assert a["sample_ids"] + b["sample_ids"] == both["sample_ids"]
        assert a["batch_index"] == b["batch_index"]


def test_everything_excluded_fails_clearly(dataset):
    ld = loader(dataset)
    ld.exclude(Exclusions(sources=tuple(dataset.sources)))
    with pytest.raises(ValueError, match="every sample is excluded"):
        ld.next_batch()
