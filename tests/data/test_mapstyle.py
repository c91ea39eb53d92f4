"""A map-style dataset on disk through loader worker processes: exclusions, rollback, restart."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from supervisor import sdk
from supervisor.sdk import Exclusions, SupervisedLoader

pytestmark = pytest.mark.filterwarnings("ignore:.*pin_memory")  # no accelerator here: pinning is a no-op


def make(ds, rank=0, world_size=2, **kw):
    return SupervisedLoader(ds, 4, seed=5, rank=rank, world_size=world_size, **kw)


def ids(ld, n):
    out = []
    for _ in range(n):
        b = ld.next_batch()
        out.append(ld.batch_meta(b).sample_ids)
    return out


def flat(per_rank):
    """Global order: step by step, rank 0's samples then rank 1's."""
    return [sid for step in zip(*per_rank, strict=True) for batch in step for sid in batch]


def test_two_workers_yield_what_the_training_process_would(token_file):
    plain, workers = make(token_file), make(token_file, num_workers=2, prefetch_factor=3, pin_memory=True)
    try:
        for _ in range(6):
            a, b = plain.next_batch(), workers.next_batch()
            assert a["sample_ids"] == b["sample_ids"] and a["batch_index"] == b["batch_index"]
            assert torch.equal(a["input_ids"], b["input_ids"])
    finally:
        workers.close()


def test_rollback_exclusion_never_reappears_on_any_rank_and_restart_replays(token_file):
    ranks = [make(token_file, r, num_workers=2) for r in range(2)]
    try:
        for ld in ranks:
            ids(ld, 4)
        saved = [ld.state_dict() for ld in ranks]  # the checkpoint a rollback returns to
        original = [ids(ld, 8) for ld in ranks]
        bad = (original[1][3][2], original[0][6][0])
        # In-place rollback: restore the cursor, add the exclusions (steering's order).
        for ld, st in zip(ranks, saved, strict=True):
            ld.load_state_dict(st)
            ld.exclude(Exclusions(samples=bad))
        replay = [ids(ld, 8) for ld in ranks]
        want = [s for s in flat(original) if s not in bad]
        assert flat(replay)[: len(want)] == want  # the same order, minus the exclusions
        after_rollback = [ld.state_dict() for ld in ranks]
        more = [ids(ld, 170) for ld in ranks]  # past the end of the epoch (157 global batches)
        assert not set(bad) & set(flat(more)), "an excluded sample came back"
        assert {ld.state_dict()["cursor"]["epoch"] for ld in ranks} == {1}
    finally:
        for ld in ranks:
            ld.close()
    # Group restart: fresh loaders (new processes in a real run) from the saved state.
    restarted = [make(token_file, r, num_workers=2) for r in range(2)]
    try:
        for ld, st in zip(restarted, after_rollback, strict=True):
            ld.load_state_dict(st)
        assert [ids(ld, 170) for ld in restarted] == more
    finally:
        for ld in restarted:
            ld.close()


def test_rollback_to_a_checkpoint_older_than_an_exclusion_keeps_it(token_file):
    ld = make(token_file, world_size=1)
    old = ld.state_dict()  # saved before the exclusion
    first = ids(ld, 3)
    ld.exclude(Exclusions(samples=(first[2][0],)))
    ld.load_state_dict(old)
    again = [s for b in ids(ld, 3) for s in b]
    assert first[2][0] not in again and ld.exclusions().samples == (first[2][0],)


def test_exclusions_and_skips_reach_prefetched_batches(token_file):
    ref = make(token_file)
    ahead = make(token_file, num_workers=2, prefetch_factor=4)  # 8 batches sampled ahead
    try:
        assert ids(ref, 1) == ids(ahead, 1)
        upcoming = make(token_file)
        upcoming.load_state_dict(ref.state_dict())
        nxt = ids(upcoming, 2)
        for ld in (ref, ahead):
            ld.exclude(Exclusions(samples=(nxt[0][1], nxt[1][0])))
        got = ids(ahead, 2)
        assert got == ids(ref, 2)
        assert nxt[0][1] not in got[0] + got[1] and nxt[1][0] not in got[0] + got[1]
        for ld in (ref, ahead):
            ld.skip(2)
        assert (
            [ahead.next_batch()["batch_index"] for _ in range(2)]
            == [ref.next_batch()["batch_index"] for _ in range(2)]
            == [5, 6]
        )
        assert ahead.state_dict() == ref.state_dict()
    finally:
        ahead.close()


@dataclasses.dataclass
class Batch:
    input_ids: torch.Tensor
    sample_ids: list[str] = dataclasses.field(default_factory=list)


def test_ids_of_tuple_and_dataclass_batches(token_file):
    as_tuple = make(token_file, collate_fn=lambda items: (torch.stack([i["input_ids"] for i in items]),))
    as_dc = make(token_file, collate_fn=lambda items: Batch(torch.stack([i["input_ids"] for i in items])))
    ref = make(token_file)
    want = ref.next_batch()["sample_ids"]
    t, d = as_tuple.next_batch(), as_dc.next_batch()
    assert isinstance(t, tuple) and as_tuple.batch_meta(t).sample_ids == want
    assert d.sample_ids == want and as_dc.batch_meta(d).batch_index == 0


def test_probe_records_ids_of_a_tuple_batch(token_file):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make(
        token_file, world_size=1, collate_fn=lambda items: (torch.stack([i["input_ids"] for i in items]),)
    )
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(model, opt, loader=loader, transport=transport, max_steps=3)
    seen: list[list[str]] = []
    for (x,) in loader:
        seen.append(loader.batch_meta(loader._recent[-1][0]).sample_ids)
        with probe.step(loader._recent[-1][0]) as s:
            out = model(x).square()
            s.backward(sdk.StepLoss(out.sum(), torch.tensor(out.numel())))
            s.optimizer_step()
    probe.close()
    recs = [r for r in transport.records if not r.get("control")]
    assert [r["samples"] for r in recs] == seen and [r["attrs"]["batch"] for r in recs] == [0, 1, 2]


def test_everything_excluded_fails_clearly(token_file):
    ld = make(token_file, world_size=1)
    ld.exclude(Exclusions(sources=("even", "odd")))
    with pytest.raises(ValueError, match="every sample is excluded"):
        ld.next_batch()


def test_a_mixture_schedule_with_two_workers_reads_what_it_names_and_replays(token_file):
    """``locate``: a mixture switch decided in the training process as each batch is drawn (the
    mixture-shift drill's dataset), so worker processes read exactly the named samples."""
    from supervisor.drills.faults import FaultPlan
    from supervisor.drills.glue import plan_dataset

    plan = FaultPlan.from_specs(
        [{"kind": "mixture_shift", "step": 5, "weights": {"odd": 1.0}}], rank=0, world_size=1
    )
    mixed = plan_dataset(plan, token_file)
    plan.step_fn = lambda: 0  # the training step never reaches the workers; it must not matter

    def run(ld, n):
        out = []
        for _ in range(n):
            b = ld.next_batch()
            meta = ld.batch_meta(b)
            for sid, row in zip(meta.sample_ids, b["input_ids"], strict=True):  # data == the named sample
                assert torch.equal(row, token_file[token_file.index_of(sid)]["input_ids"]), sid
            out.append((meta.batch_index, meta.sample_ids, meta.sources))
        return out

    ranks = [make(mixed, r, num_workers=2, prefetch_factor=4) for r in range(2)]
    try:
        for ld in ranks:
            run(ld, 2)
        saved = [ld.state_dict() for ld in ranks]
        original = [run(ld, 6) for ld in ranks]
        for per_rank in original:  # batch index 4 is consumed by step 5: from there on only "odd"
            assert {s for _, _, srcs in per_rank[:2] for s in srcs} == {"even", "odd"}
            assert {s for _, _, srcs in per_rank[2:] for s in srcs} == {"odd"}
        bad = (original[0][3][1][0], original[1][1][1][2])
        for ld, st in zip(ranks, saved, strict=True):  # in-place rollback + exclusion
            ld.load_state_dict(st)
            ld.exclude(Exclusions(samples=bad))
        replay = [run(ld, 6) for ld in ranks]
        want = [s for s in flat([[ids for _, ids, _ in r] for r in original]) if s not in bad]
        assert flat([[ids for _, ids, _ in r] for r in replay])[: len(want)] == want
        after = [ld.state_dict() for ld in ranks]
        more = [run(ld, 4) for ld in ranks]
    finally:
        for ld in ranks:
            ld.close()
    restarted = [make(plan_dataset(plan, token_file), r, num_workers=2) for r in range(2)]
    try:
        for ld, st in zip(restarted, after, strict=True):
            ld.load_state_dict(st)
        assert [run(ld, 4) for ld in restarted] == more
    finally:
        for ld in restarted:
            ld.close()


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 2-core CI
def test_workers_schedule_in_turn_as_the_training_process_would(token_file):
    """Three workers each draw the whole schedule and load every third batch: with sources, IDs
    and batch ranges excluded, skips, an epoch boundary and a restored cursor, the batches are
    exactly those of the in-process loader."""
    ref, three = make(token_file, rank=1), make(token_file, rank=1, num_workers=3, prefetch_factor=1)
    try:
        first = ids(ref, 3)
        assert ids(three, 3) == first
        order = make(token_file, rank=1)
        order.load_state_dict(ref.state_dict())
        upcoming = sum(ids(order, 4), [])
        for ld in (ref, three):
            ld.exclude(Exclusions(samples=(upcoming[1], upcoming[6]), batch_ranges=((5, 6),)))
            ld.skip(1)
        assert ids(three, 5) == ids(ref, 5)
        saved = three.state_dict()
        assert saved == ref.state_dict()
        for ld in (ref, three):
            ld.exclude(Exclusions(sources=("odd",)))
        tail = ids(ref, 90)  # across the end of epoch 0 (every other sample left)
        assert ids(three, 90) == tail and three.state_dict() == ref.state_dict()
        assert three.state_dict()["cursor"]["epoch"] == 1
        assert not set(upcoming[1:2] + upcoming[6:7]) & set(sum(tail, []))
        three.load_state_dict(saved)  # rollback: the odd source stays out
        assert ids(three, 90) == tail
    finally:
        three.close()
