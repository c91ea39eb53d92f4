"""The packed record batch (sdk/wire.py): what goes in comes out, as the supervisor reads it, and
anything that is no such batch is refused with a WireError naming the part, never another error."""

from __future__ import annotations

import copy
import json
import math
import pickle
import random
from array import array
from typing import Any

import pytest

from supervisor.core.records import Record, SourceView, add_sources
from supervisor.sdk.wire import WireError, pack, unpack, unpack_frame


def _rec(step: int, rank: int, **extra: Any) -> dict[str, Any]:
    loss = 2.5 + rank * 1e-3
    rec = {"step": step, "rank": rank, "world_size": 4, "time": 1.7e9 + step, "loss": loss,
           "loss_sum": loss * 2048, "tokens": 2048, "batch_mean_loss": loss * 1.001, "lr": 3e-4,
           "grad_norm": 1.0, "param_norm": 100.0, "update_norm": 0.03, "overflow": False, "nonfinite": False,
           "sources": {"code": {"tokens": 1024, "loss_sum": loss * 1024}, "web": {"tokens": 1024, "loss_sum": 0.5}},
           "samples": [f"code:lib/m_{rank}_{k}.py:{k * 64}" for k in range(4)], "seq_len_max": 256,
           "seq_len_mean": 201.5, "step_time": 0.5, "tokens_per_s": 4096.0, "attrs": {"batch": step}, "events": []}  # fmt: skip
    rec.update(extra)
    return rec


def _same(a: Record, b: Record) -> None:
    da, db = a.to_dict(), b.to_dict()
    assert da.keys() == db.keys()
    for k, va in da.items():
        vb = db[k]
        assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), k
        assert type(va) is type(vb), k


def _groups() -> list[tuple[Any, ...]]:
    ranks = []
    for r in range(4):
        recs = [_rec(10, r), _rec(11, r, param_checksum="c0ffee" if r else None)]
        ranks.append((r, f"link{r}", (1, 2), [1, 2], recs))
    return ranks


def test_records_come_out_as_record_from_dict_reads_them() -> None:
    groups = _groups()
    groups[2][4][1].update(loss=math.nan, grad_norm=math.inf, nonfinite=True, nonfinite_at="layer.3")
    out = unpack(pickle.loads(pickle.dumps(pack(groups), protocol=5)))
    assert [g[:4] for g in out] == [g[:4] for g in groups]
    for sent, got in zip(groups, out, strict=True):
        for raw, rec in zip(sent[4], got[4], strict=True):
            assert type(rec) is Record
            _same(Record.from_dict(raw), rec)


def test_sources_are_views_over_the_batch_that_read_and_sum_as_the_dicts_sent() -> None:
    groups = _groups()
    groups[1][4][0]["sources"] = {"web": {"tokens": 7.0, "loss_sum": 3.5}}  # other names, other order
    sent = [Record.from_dict(r) for g in groups for r in g[4]]
    got = [r for g in unpack(pack(groups)) for r in g[4]]
    assert all(type(r.sources) is SourceView for r in got)
    assert [r.sources for r in got] == [r.sources for r in sent]
    assert [dict(r.sources) for r in got] == [r.sources for r in sent]  # type: ignore[union-attr]
    assert json.loads(json.dumps(got[0].to_dict()))["sources"] == sent[0].sources
    acc_sent: dict[str, list[float]] = {}
    acc_got: dict[str, list[float]] = {}
    for a, b in zip(sent, got, strict=True):
        add_sources(acc_sent, a.sources or {})
        add_sources(acc_got, b.sources or {})
    assert list(acc_got.items()) == list(acc_sent.items())  # the same names, order and sums


def test_a_source_named_twice_in_one_record_counts_once_with_its_last_value_as_a_dict_would() -> None:
    batch = pack([(0, "l0", (1, 2), [1, 2], [_rec(5, 0), _rec(6, 0)])])
    names, _per, _idx, tokens, loss_sum = batch["sources"]
    batch["sources"] = (names, array("q", [2, 2]), array("q", [0, 0, 0, 1]), tokens, loss_sum)
    first, second = (r.sources for r in unpack(batch)[0][4])
    assert first == {"code": {"tokens": tokens[1], "loss_sum": loss_sum[1]}}
    assert second == {"code": {"tokens": tokens[2], "loss_sum": loss_sum[2]},
                      "web": {"tokens": tokens[3], "loss_sum": loss_sum[3]}}  # fmt: skip
    acc: dict[str, list[float]] = {}
    add_sources(acc, first or {})
    assert acc == {"code": [tokens[1], loss_sum[1]]}


def test_a_record_without_rank_is_its_links() -> None:
    rec = _rec(3, 0)
    del rec["rank"]
    ((_, _, _, _, [got]),) = unpack(pack([(7, "l", None, [1], [rec])]))
    assert got.rank == 7


def test_records_that_do_not_fit_keep_their_place() -> None:
    control = {"step": 11, "rank": 1, "control": True, "events": ["directive_applied:d1:freeze"]}
    odd = _rec(12, 1, extra_field=1)  # a field outside the record's table travels as itself
    empty_event = _rec(13, 1, events=[""])
    recs = [_rec(10, 1), control, _rec(11, 1), odd, empty_event]
    ((_, _, _, seqs, got),) = unpack(pack([(1, "l1", (1, 5), [1, 2, 3, 4, 5], recs)]))
    assert seqs == [1, 2, 3, 4, 5]
    assert got[1] == control and got[3] == odd and got[4] == empty_event
    assert [type(r) for r in got] == [Record, dict, Record, dict, dict]


def test_a_column_of_mixed_values_goes_as_dicts_the_supervisor_then_checks() -> None:
    recs = [
        _rec(1, 0, tokens=2048.0),
        _rec(2, 0, lr=None),
        _rec(3, 0, loss="3.5"),
        _rec(4, 0, overflow="yes"),
    ]
    ((_, _, _, _, got),) = unpack(pack([(0, "l", None, [1, 2, 3, 4], recs)]))
    for raw, d in zip(recs, got, strict=True):
        assert type(d) is dict
        _same(Record.from_dict(raw), Record.from_dict(d))


def test_a_column_of_wrong_ranks_never_reaches_the_bookkeeping_as_a_rank() -> None:
    batch = pack([(0, "l", None, [1, 2], [_rec(1, 0), _rec(2, 0)])])
    batch["cols"]["rank"] = ["x", None]
    ((_, _, _, _, got),) = unpack(batch)
    assert all(type(d) is dict and "rank" not in d for d in got)


def test_as_dicts_gives_what_was_sent() -> None:
    groups = _groups()
    for sent, got in zip(groups, unpack(pack(groups), as_dicts=True), strict=True):
        for raw, d in zip(sent[4], got[4], strict=True):
            assert d == {k: v for k, v in raw.items() if v is not None and v != []}


def test_empty_groups_and_unnumbered_links() -> None:
    out = unpack(pack([(0, "a", (3, 5), [], []), (1, None, None, None, [_rec(1, 1)])]))
    assert out[0][:4] == (0, "a", (3, 5), None) and out[0][4] == []
    assert out[1][:2] == (1, None) and out[1][3] is None and out[1][4][0].step == 1


@pytest.mark.parametrize(
    ("mutate", "names"),
    [
        (lambda b: "not a batch", "wire version"),
        (lambda b: b.update(wire=99), "wire version"),
        (lambda b: b.update(m=3), "m:"),
        (lambda b: b.update(seq=array("q", [1])), "seq"),
        (lambda b: b["cols"].update(bogus=[1] * 8), "cols"),
        (lambda b: b["cols"].update(loss=array("q", [1] * 8)), "cols.loss"),
        (lambda b: b["cols"].update(step=array("q", [10**15] * 8)), "cols.step"),
        (lambda b: b.update(sources=(["x"], *b["sources"][1:])), "sources"),
        (lambda b: b.update(samples=(b["samples"][0], "a\x1fb")), "samples"),
        (lambda b: b.update(rows=[(5, {}), (2, {})], m=6), "rows[1]"),
        (lambda b: b.update(groups=(b["groups"][0], [1, 2], *b["groups"][2:])), "groups"),
        (lambda b: b.update(attrs={"a": 1}), "attrs"),
    ],
)
def test_a_malformed_batch_is_refused_naming_the_part(mutate: Any, names: str) -> None:
    batch = pack(_groups())
    replaced = mutate(batch)
    for decode in (unpack, unpack_frame):
        with pytest.raises(WireError, match=names.replace("[", r"\[").replace("]", r"\]")):
            decode(replaced if replaced is not None else batch)


def _mutations(batch: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One random damage anywhere in a packed batch (a value replaced, a list cut, a type changed)."""
    hostile = [
        None,
        -1,
        10**20,
        1.5,
        math.nan,
        "x",
        "",
        [],
        {},
        (),
        [None],
        array("d", [1.0]),
        array("q", [-5]),
    ]
    b = copy.deepcopy(batch)
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in list(items):
            paths.append((node, k))
            if isinstance(v, dict | list):
                walk(v)
            elif isinstance(v, tuple):
                node[k] = list(v)
                walk(node[k])

    walk(b)
    node, key = rng.choice(paths)
    value = node[key]
    if isinstance(value, list | array) and value and rng.random() < 0.4:
        node[key] = value[: rng.randrange(len(value))]
    else:
        node[key] = rng.choice(hostile)
    return b


def test_random_damage_is_a_wire_error_or_a_batch_never_another_error() -> None:
    rng = random.Random(26)
    batch = pack(_groups() + [(9, "ctl", None, [1], [{"step": 1, "control": True, "events": ["x"]}])])
    refused = 0
    for _ in range(3000):
        try:
            out = unpack(_mutations(batch, rng))
        except WireError:
            refused += 1
            continue
        for rank, link, held, seqs, recs in out:  # what passes is what the control loop can read
            assert type(rank) is int and (link is None or type(link) is str)
            assert held is None or all(type(x) is int for x in held)
            assert seqs is None or (len(seqs) == len(recs) and all(type(s) is int for s in seqs))
            for r in recs:
                assert type(r) in (Record, dict)
                if type(r) is dict:
                    assert type(r.get("events", [])) is list and type(r.get("attrs", {})) is dict
                    assert type(r.get("rank", 0)) is int
    assert refused > 1000


def test_random_damage_to_a_clean_batch_is_a_wire_error_or_a_frame_the_loop_can_read() -> None:
    rng = random.Random(27)
    batch = pack(_groups())
    refused = framed = 0
    for _ in range(3000):
        damaged = _mutations(batch, rng)
        try:
            packed = unpack_frame(damaged)
        except WireError:
            refused += 1
            continue
        if packed is None:  # not all in the clean columns: the record path reads it, as it must
            unpack(damaged)
            continue
        framed += 1
        n, frame = len(packed.frame), packed.frame
        assert len(packed.links) == len(packed.ranks) == len(packed.counts) == len(packed.held) // 2
        assert sum(packed.counts) == n and (packed.seqs is None or len(packed.seqs) == n)
        assert all(type(x) is int for x in frame.col("rank") + frame.col("step"))
        assert all(type(a) is dict for a in frame.col("attrs")) and all(
            type(e) is list for e in frame.col("events")
        )
        assert len(list(frame)) == n and all(type(r) is Record for r in frame)
        assert isinstance(frame.source_totals(), dict) and isinstance(frame.all_events(), set)
    assert refused > 1000 and framed > 500


def test_a_batch_outside_the_clean_columns_is_no_frame() -> None:
    with_row = pack(_groups() + [(9, "ctl", None, [1], [{"step": 1, "control": True, "events": ["x"]}])])
    mixed = _groups()
    mixed[0][4][0]["tokens"] = "many"  # a column of mixed types: the records are checked one by one
    assert unpack_frame(with_row) is None and unpack_frame(pack(mixed)) is None
    packed = unpack_frame(pack(_groups()))
    assert packed is not None and packed.held_of(0) == (1, 2) and packed.links[3] == "link3"


def test_a_batch_packed_from_columns_is_the_batch_pack_makes_of_the_records() -> None:
    from supervisor.sdk.wire import pack_columns

    groups = _groups()
    recs = [rec for g in groups for rec in g[4]]
    scalars = ("step", "rank", "world_size", "time", "loss", "loss_sum", "tokens", "batch_mean_loss", "lr",
               "grad_norm", "param_norm", "update_norm", "overflow", "nonfinite", "seq_len_max", "seq_len_mean",
               "step_time", "tokens_per_s", "param_checksum")  # fmt: skip
    cols = {f: [r.get(f) for r in recs] for f in reversed(scalars)}  # any order: packed in the table's
    names = ["code", "web"]
    sources = (names, [2] * len(recs), [0, 1] * len(recs),
               [r["sources"][n]["tokens"] for r in recs for n in names],
               [r["sources"][n]["loss_sum"] for r in recs for n in names])  # fmt: skip
    built = pack_columns([(*g[:4], len(g[4])) for g in groups], cols, sources=sources,
                         samples=[r["samples"] for r in recs], events=[r["events"] for r in recs],
                         attrs=[r["attrs"] for r in recs])  # fmt: skip
    assert pickle.dumps(built) == pickle.dumps(pack(groups))
    with pytest.raises(ValueError, match="not scalar fields"):
        pack_columns([(0, "l", None, [1], 1)], {"rank": [0], "sources": [{}]})
