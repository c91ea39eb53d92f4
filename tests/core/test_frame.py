"""A step's records as columns (core/frame.py): whatever the records, a frame decoded from a packed
batch reads as the records themselves -- the same step summary, the same aggregate, the same
records when read whole, the same rows when cut -- so the columnar path changes costs, never a
decision."""

from __future__ import annotations

import math
import random
from dataclasses import fields
from typing import Any

import pytest

from supervisor.core.frame import StepFrame
from supervisor.core.records import Record
from supervisor.core.summary import StepSummary, summarize
from supervisor.runtime.observe import aggregate
from supervisor.sdk.wire import pack, unpack, unpack_frame
from tests.sdk.test_wire import _rec, _same


def _random_step(rng: random.Random, step: int, ranks: int) -> list[dict[str, Any]]:
    """One step's records with the variety real jobs send: fields left out, NaN and Inf, AMP skips,
    a misreporting rank, collapsed tokens, checksums that disagree, sources named twice, events."""
    out = []
    drop = rng.sample(["loss_sum", "tokens", "batch_mean_loss", "lr", "grad_norm", "update_norm",
                       "param_norm", "loss_scale", "sources", "samples", "attrs", "time", "step_time"],
                      k=rng.randint(0, 4))  # fmt: skip
    scale = 2.0 ** rng.randint(4, 16) if rng.random() < 0.5 else None  # an fp16 run: every rank says it
    for r in rng.sample(range(ranks), ranks):  # any order
        loss = 2.0 + rng.random()
        rec = _rec(
            step, r, loss=loss, loss_sum=loss * 2048, grad_norm=1.0 + rng.random(), lr=3e-4 * (1 + r % 2)
        )
        for k in drop:
            rec.pop(k, None)
        if scale is not None:
            rec["loss_scale"] = scale
        roll = rng.random()
        if roll < 0.05:
            rec.update(loss=math.nan, nonfinite=True, nonfinite_at=rng.choice(["layer.1", "grad_norm", None]))
        elif roll < 0.1:
            rec.update(overflow=True, grad_norm=math.inf)
        elif roll < 0.15 and "tokens" in rec:
            rec.update(tokens=rng.choice([16, 2048]), loss_sum=loss * 1000)  # a reduction bug, or padding
        elif roll < 0.2:
            rec["param_checksum"] = rng.choice(["aa", "bb"])
        elif roll < 0.25:
            rec["events"] = rng.sample(["checkpoint_saved:40", "resumed", "lr_override"], k=rng.randint(1, 2))
        elif roll < 0.3 and "sources" in rec:
            rec["sources"] = {
                "web": {"tokens": 7.0, "loss_sum": 3.0},
                "code": {"tokens": 5.0, "loss_sum": 1.0},
            }
        for k in drop:  # a field a job does not send, no rank sends
            rec.pop(k, None)
        out.append(rec)
    return out


def _summaries_equal(a: StepSummary, b: StepSummary) -> None:
    for f in fields(StepSummary):
        if f.name == "records":
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        assert repr(va) == repr(vb), f.name  # repr: NaN equals NaN, and dict order counts


@pytest.mark.parametrize("seed", range(40))
def test_a_decoded_frame_summarizes_and_aggregates_as_its_records(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.choice([1, 2, 3, 8, 33])
    sent = _random_step(rng, 50, ranks)
    batch = pack([(rec["rank"], f"l{rec['rank']}", (1, 1), [1], [rec]) for rec in sent])
    packed = unpack_frame(batch)
    assert packed is not None, "every record here fits the columns"
    records = [rec for g in unpack(batch) for rec in g[4]]
    _summaries_equal(summarize(50, packed.frame), summarize(50, records))
    assert repr(aggregate(50, packed.frame)) == repr(aggregate(50, records))
    for got, want in zip(packed.frame, records, strict=True):
        _same(got, want)


@pytest.mark.parametrize("seed", range(10))
def test_a_cut_of_a_frame_holds_the_records_at_its_rows(seed: int) -> None:
    rng = random.Random(100 + seed)
    sent = _random_step(rng, 7, 40)
    batch = pack([(rec["rank"], None, None, None, [rec]) for rec in sent])
    packed = unpack_frame(batch)
    assert packed is not None
    records = [rec for g in unpack(batch) for rec in g[4]]
    for rows in (list(range(12)), rng.sample(range(40), 9), [], [39, 0, 5]):
        cut = packed.frame.take(rows)
        assert len(cut) == len(rows)
        assert cut.all_events() == {e for i in rows for e in records[i].events}
        for got, i in zip(cut, rows, strict=True):
            _same(got, records[i])
        _summaries_equal(summarize(7, cut), summarize(7, [records[i] for i in rows]))


def test_a_list_of_records_reads_as_a_frame() -> None:
    recs = [Record.from_dict(_rec(3, r, grad_norm=None if r == 1 else 1.5)) for r in range(3)]
    frame = StepFrame.of(recs)
    assert StepFrame.of(frame) is frame
    assert frame.col("grad_norm") == [1.5, None, 1.5]
    assert frame.col("rank") == [0, 1, 2]
    assert list(frame) == recs and frame[1] is recs[1]
    assert frame.source_totals() == {"code": [3072, sum(r.loss_sum / 2 for r in recs)], "web": [3072, 1.5]}


def test_a_field_no_record_sent_reads_as_absent_and_builds_records_with_its_default() -> None:
    frame = StepFrame(2, {"step": [4, 4], "loss": [1.0, 2.0]})
    assert frame.col("grad_norm") == [None, None]
    assert frame.col("rank") == [0, 0] and frame.col("world_size") == [1, 1]
    assert not frame.has("sources") and frame.source_totals() == {}
    assert frame.all_events() == set() and not frame.any_events()
    assert [r.to_dict() for r in frame] == [{"step": 4, "loss": 1.0, "rank": 0, "world_size": 1},
                                            {"step": 4, "loss": 2.0, "rank": 0, "world_size": 1}]  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_a_batch_of_several_steps_cuts_into_each_steps_records(seed: int) -> None:
    """A fast run's batch: every link sends the same run of steps, link by link. Each step is then
    every k-th record (``take(range)``, cut in slices, its strings cut when read); the steps, their
    heads (the incident series keeps the first ranks) and any rows of them read as the records."""
    from supervisor.runtime.assembler import StepAssembler

    rng = random.Random(300 + seed)
    ranks, steps = rng.choice([2, 5, 16]), rng.choice([2, 3, 4])
    per_step = [{rec["rank"]: rec for rec in _random_step(rng, 20 + j, ranks)} for j in range(steps)]
    sent = [rec for recs in per_step for rec in recs.values()]
    common = set.intersection(*(set(rec) for rec in sent))  # a job sends the same fields every step
    for rec in sent:
        for k in set(rec) - common - {"param_checksum", "nonfinite_at", "events"}:
            del rec[k]
    if seed % 3 == 0:  # a step of the run with no events and every record's samples: the sliced path
        for recs in per_step:
            for rec in recs.values():
                rec["events"] = []
                rec["samples"] = [f"web:doc_{rec['rank']}_{k}" for k in range(3)]
    groups = [(r, f"l{r}", (1, steps), list(range(1, steps + 1)), [per_step[j][r] for j in range(steps)])
              for r in range(ranks)]  # fmt: skip
    batch = pack(groups)
    packed = unpack_frame(batch)
    assert packed is not None
    records = [rec for g in unpack(batch) for rec in g[4]]  # link by link
    chunks = StepAssembler._by_step(packed.frame)
    assert chunks is not None and [s for s, _ in chunks] == [20 + j for j in range(steps)]
    for j, (step, cut) in enumerate(chunks):
        want = records[j::steps]
        assert len(cut) == ranks and cut.all_events() == {e for r in want for e in r.events}
        _summaries_equal(summarize(step, cut), summarize(step, want))
        head = rng.randint(0, ranks)
        for rows in (list(range(head)), rng.sample(range(ranks), min(3, ranks))):
            for got, i in zip(cut.take(rows), rows, strict=True):
                _same(got, want[i])
        for got, rec in zip(cut, want, strict=True):
            _same(got, rec)


@pytest.mark.parametrize("seed", range(6))
def test_a_few_rows_far_into_a_string_column_are_found_without_splitting_it(seed: int) -> None:
    """``Joined.cut`` of a few records reaching far into the column finds their values in its text
    (``_found``): the same values as a split of the whole column, counts uniform or not, empty values
    and records with none among them -- and nothing before them split."""
    from supervisor.core.frame import SEP, Joined, split_joined

    rng = random.Random(seed)
    n = rng.choice([300, 1024])
    k = rng.choice([None, 1, 8])  # None: each record its own count, some none
    per = [k if k is not None else rng.choice([0, 1, 3, 8, 13]) for _ in range(n)]
    values = [
        "".join(rng.choice("ab:/._0123456789") for _ in range(rng.choice([0, 1, 5, 20, 60])))
        for _ in range(sum(per))
    ]
    text = SEP.join(values)
    whole = split_joined(per, text)
    for rows in ([n - 1], [0, n - 1], rng.sample(range(n), 3), [n // 2, n - 2, 5, n - 3]):
        column = Joined(per, text)
        got = column.cut(rows)
        assert got == ([len(whole[i]) for i in rows], SEP.join(v for i in rows for v in whole[i]))
        if sum(per[: max(rows) + 1]) >= 256:
            assert column._values == [], "split the text before the rows"
