"""Data faults on real batches: garbage keyed by sample, a corrupt shard, periodic garbage, a mixture switch."""

from __future__ import annotations

import torch

from supervisor.drills.faults import FaultPlan
from tests.drills.conftest import VOCAB, make_batch, make_model, train_step


def _plan(spec: dict, rank: int = 0) -> FaultPlan:
    plan = FaultPlan.from_specs([spec], rank=rank, world_size=2)
    plan.install(make_model())
    return plan


def _changed_rows(before: dict, after: dict) -> list[int]:
    return [
        r
        for r in range(before["input_ids"].shape[0])
        if not torch.equal(before["input_ids"][r], after["input_ids"][r])
    ]


def test_garbage_batch_replaces_one_step_on_one_rank() -> None:
    plan, other = (
        _plan({"kind": "garbage_batch", "step": 3, "rank": 0}),
        _plan({"kind": "garbage_batch", "step": 3}, 1),
    )
    for step in range(6):
        clean = make_batch(step)
        out = plan.batch(step, clean)
        assert _changed_rows(clean, out) == ([0, 1, 2, 3] if step == 3 else [])
        assert _changed_rows(clean, other.batch(step, clean)) == []
    assert clean["input_ids"].max() < VOCAB  # the loader's tensors are not modified in place


def test_garbage_is_deterministic_and_within_vocab() -> None:
    a = _plan({"kind": "garbage_batch", "step": 2, "seed": 1}).batch(2, make_batch(2))
    b = _plan({"kind": "garbage_batch", "step": 2, "seed": 1}).batch(2, make_batch(2))
    c = _plan({"kind": "garbage_batch", "step": 2, "seed": 2}).batch(2, make_batch(2))
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], c["input_ids"])
    assert int(a["input_ids"].max()) < VOCAB and int(a["labels"].min()) >= 0


def test_garbage_recurs_with_its_samples_and_stops_when_excluded() -> None:
    plan = _plan({"kind": "garbage_batch", "step": 5, "fraction": 0.5})
    first = plan.batch(5, make_batch(5))
    assert _changed_rows(make_batch(5), first) == [0, 1]
    # Replay after a rollback: the same samples come back at the same step -> the same garbage.
    for step in range(2, 5):
        plan.batch(step, make_batch(step))
    replay = plan.batch(5, make_batch(5))
    assert torch.equal(replay["input_ids"], first["input_ids"])
    # The supervisor excluded the suspect samples: the loader no longer yields them.
    excluded = make_batch(5)
    keep = [r for r, sid in enumerate(excluded["sample_ids"]) if sid not in {"s5-0", "s5-1"}]
    excluded = {**excluded, "input_ids": excluded["input_ids"][keep], "labels": excluded["labels"][keep],
                "sample_ids": [excluded["sample_ids"][r] for r in keep]}  # fmt: skip
    assert torch.equal(plan.batch(5, excluded)["input_ids"], excluded["input_ids"])


def test_garbage_raises_the_loss_of_a_trained_model() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = _plan({"kind": "garbage_batch", "step": 60})
    losses = [train_step(model, opt, plan, step, make_batch(step)).loss for step in range(61)]
    assert losses[60] > 2 * max(losses[50:60])


def test_corrupt_shard_covers_a_step_range_without_sample_ids() -> None:
    plan = _plan({"kind": "corrupt_shard", "step": 4, "steps": 3, "rank": 0})
    hit = []
    for step in range(10):
        clean = make_batch(step)
        clean.pop("sample_ids")
        hit.append(bool(_changed_rows(clean, plan.batch(step, clean))))
    assert hit == [s in (4, 5, 6) for s in range(10)]


def test_periodic_garbage_hits_its_source_at_its_period() -> None:
    plan = _plan({"kind": "periodic_garbage", "step": 10, "period": 7, "count": 3, "source": "docs"})
    hits = {}
    for step in range(40):
        clean = make_batch(step)
        rows = _changed_rows(clean, plan.batch(step, clean))
        if rows:
            hits[step] = rows
    assert hits == {10: [1, 3], 17: [1, 3], 24: [1, 3]}  # rows of source "docs" only, 3 times
    no_docs = make_batch(17)
    no_docs["sources"] = ["code"] * 4
    assert _changed_rows(no_docs, plan.batch(17, no_docs)) == []  # source excluded: nothing to corrupt


def test_a_periodic_bad_shard_lives_in_its_samples() -> None:
    """Without a source, a share of the rank's rows at each period step is a bad shard: those
    samples stay garbage wherever they come back (the same step re-run after a rollback, another
    step), and a re-run that keeps them out (the supervisor excluded them or skipped the batch) is
    clean. Keyed by step instead, the garbage came back at a rolled-back step whatever was
    excluded: sampler cell 688118:366462 rolled back over its occurrence at step 128 twice,
    excluded that step's samples and batch each time, saw the same garbage again and escalated."""
    plan = _plan({"kind": "periodic_garbage", "step": 10, "period": 20, "fraction": 0.5})
    hits = {}
    for step in range(35):
        clean = make_batch(step)
        rows = _changed_rows(clean, plan.batch(step, clean))
        if rows:
            hits[step] = rows
    assert hits == {10: [0, 1], 30: [0, 1]}
    # A rollback to 25: step 30 re-run on the same samples is the same garbage.
    for step in range(26, 30):
        assert not _changed_rows(make_batch(step), plan.batch(step, make_batch(step)))
    again = make_batch(30)
    assert _changed_rows(again, plan.batch(30, again)) == [0, 1]
    # Its samples excluded, the loader hands out others at step 30: nothing is garbage.
    other = make_batch(31)
    assert _changed_rows(other, plan.batch(30, other)) == []
    # A bad sample served at another step is garbage there too; the next period step is new data.
    late = make_batch(45)
    late["sample_ids"][2] = "s30-1"
    assert _changed_rows(late, plan.batch(45, late)) == [2]
    assert _changed_rows(make_batch(50), plan.batch(50, make_batch(50))) == [0, 1]


def test_mixture_shift_from_its_step_on() -> None:
    plan = _plan({"kind": "mixture_shift", "step": 20, "weights": {"tests": 0.7, "code": 0.3}})
    assert plan.mixture(19) is None
    assert plan.mixture(20) == plan.mixture(90) == {"tests": 0.7, "code": 0.3}
