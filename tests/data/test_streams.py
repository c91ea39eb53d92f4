"""Streaming sources from local files: HF ``datasets`` streaming (JSONL) and webdataset (tar).

2 ranks x 2 loader workers = 4 slots over 8 shards of 30 rows: every slot reads 2 shards per
epoch, 15 batches of 4; each rank alternates its two workers, 30 batches per epoch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from supervisor.sdk import Exclusions, SupervisedLoader
from supervisor.sdk.data.shards import WebDatasetShards
from tests.data.conftest import ROWS_PER_SHARD, SHARDS, collate_rows, hf_stream, wds_source

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13

EPOCH = SHARDS * ROWS_PER_SHARD // (2 * 4)  # batches per rank per epoch


def sources(kind: str, jsonl_shards: list[str], tar_shards: list[str]) -> tuple[Any, dict[str, Any]]:
    if kind == "hf":
        return hf_stream(jsonl_shards), {}
    return WebDatasetShards(tar_shards), {"source_fn": wds_source}


def loaders(source: Any, world_size: int = 2, workers: int = 2, **kw: Any) -> list[SupervisedLoader]:
    return [
        SupervisedLoader(source, 4, seed=1, rank=r, world_size=world_size, collate_fn=collate_rows,
                         num_workers=workers, **kw)
        for r in range(world_size)
    ]  # fmt: skip


def take(ld: SupervisedLoader, n: int) -> list[list[str]]:
    return [ld.next_batch()["sample_ids"] for _ in range(n)]


def close(lds: list[SupervisedLoader]) -> None:
    for ld in lds:
        ld.close()


def by_worker(batches: list[list[str]]) -> list[list[str]]:
    """A rank's samples split by the worker that read them (batches alternate between 2 workers)."""
    return [[s for b in batches[w::2] for s in b] for w in range(2)]


@pytest.fixture(params=["hf", "webdataset"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_ranks_and_workers_split_an_epoch_without_duplicates_or_gaps(kind, jsonl_shards, tar_shards, rows):
    source, kw = sources(kind, jsonl_shards, tar_shards)
    lds = loaders(source, **kw)
    try:
        seen = [s for ld in lds for b in take(ld, EPOCH) for s in b]
    finally:
        close(lds)
    assert len(seen) == len(rows) and set(seen) == {r["id"] for r in rows}


def test_rollback_exclusion_never_reappears_and_restart_replays(kind, jsonl_shards, tar_shards):
    source, kw = sources(kind, jsonl_shards, tar_shards)
    lds = loaders(source, **kw)
    try:
        for ld in lds:
            take(ld, 3)
        saved = [ld.state_dict() for ld in lds]  # the checkpoint
        original = [take(ld, 8) for ld in lds]
        bad = (original[0][4][1], original[1][5][3])
        for ld, st in zip(lds, saved, strict=True):  # in-place rollback, as steering does it
            ld.load_state_dict(st)
            ld.exclude(Exclusions(samples=bad))
        replay = [take(ld, 8) for ld in lds]
        for orig, again in zip(original, replay, strict=True):
            for w_orig, w_again in zip(by_worker(orig), by_worker(again), strict=True):
                want = [s for s in w_orig if s not in bad]
                assert w_again[: len(want)] == want  # each worker's stream, minus the exclusions
        after = [ld.state_dict() for ld in lds]
        more = [take(ld, EPOCH + 2) for ld in lds]  # into the next epoch
        assert not set(bad) & {s for r in more for b in r for s in b}
    finally:
        close(lds)
    restarted = loaders(source, **kw)  # group restart: new loaders, new worker processes
    try:
        for ld, st in zip(restarted, after, strict=True):
            ld.load_state_dict(st)
        assert [take(ld, EPOCH + 2) for ld in restarted] == more
    finally:
        close(restarted)


def test_exclusion_in_flight_reaches_the_workers(jsonl_shards):
    (ld,) = loaders(hf_stream(jsonl_shards), world_size=1, prefetch_factor=4)
    (ref,) = loaders(hf_stream(jsonl_shards), world_size=1, workers=2)
    try:
        take(ld, 2)
        take(ref, 2)
        ahead = take(ref, 4)  # what the workers have already prefetched for `ld`
        ref.load_state_dict(ld.state_dict())
        ld.exclude(Exclusions(samples=(ahead[0][0], ahead[3][2]), sources=("prose",)))
        got = [s for b in take(ld, 6) for s in b]
        assert ahead[0][0] not in got and ahead[3][2] not in got
        assert all(int(s[3:]) % 3 for s in got)  # rows doc<j> with j % 3 == 0 are the excluded "prose"
    finally:
        close([ld, ref])


class Lines(torch.utils.data.IterableDataset):
    """A plain IterableDataset with no shards and no keys: IDs are ``stream:<offset>``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter({"tokens": [i % 256] * 4} for i in range(self.n))


def test_plain_iterable_is_split_by_item_across_ranks():
    lds = loaders(Lines(48), workers=0)
    got = [take(ld, 6) for ld in lds]
    flat = [s for r in got for b in r for s in b]
    assert sorted(flat, key=lambda s: int(s.split(":")[1])) == [f"stream:{i}" for i in range(48)]
    assert all(int(s.split(":")[1]) % 2 == r for r, batches in enumerate(got) for b in batches for s in b)


def test_missing_id_key_fails_at_the_first_batch_naming_the_fix(jsonl_shards):
    (ld,) = loaders(hf_stream(jsonl_shards), world_size=1, workers=0, id_key="doc_id")
    with pytest.raises(KeyError, match="id_key=<one of them>"):
        ld.next_batch()


def test_cursor_saved_with_other_workers_is_refused(jsonl_shards):
    (ld,) = loaders(hf_stream(jsonl_shards), world_size=1)
    try:
        take(ld, 2)
        state = ld.state_dict()
    finally:
        ld.close()
    (other,) = loaders(hf_stream(jsonl_shards), world_size=1, workers=1)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="num_workers"):
        other.next_batch()
