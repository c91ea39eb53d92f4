"""Costs on the supervisor's path that must not grow with every rank of the job.

Found with ``python -m bench.scale`` (the rank emulator driving the real supervisor actor): at 256
emulated ranks the plan of a non-finite step came 1.9 s after its detection, and the freeze 5 steps
after it. The incident's per-rank series keeps at most ``MAX_RANKS`` ranks (plus the incident's
first rank), yet every record of every rank of the ring (128 steps) was converted to a dict before
that choice was made: 131,072 conversions at 1,024 ranks, on the control loop, before the plan.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from supervisor.core.frame import SEP, StepFrame
from supervisor.core.records import Record
from supervisor.incidents.scrub import series_row
from supervisor.observability import series as series_mod
from supervisor.observability.series import MAX_RANKS, IncidentSeries
from supervisor.runtime.assembler import StepAssembler
from supervisor.sdk import wire


class _Counted(Record):
    converted = 0

    def to_dict(self) -> dict[str, Any]:
        _Counted.converted += 1
        return super().to_dict()


class _Store:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def attach_series(self, incident_id: int, rows: list[Any], replay: int = 0) -> None:
        """Converts what it is given, as ``IncidentStore.attach_series`` does."""
        converted = (series_row(r.to_dict() if hasattr(r, "to_dict") else r) for r in rows)
        self.rows.extend(row for row in converted if row is not None)

    def series(self, incident_id: int, replay: int | None = 0) -> list[dict[str, Any]]:
        return []


def test_an_incidents_first_rows_convert_only_the_ranks_they_keep() -> None:
    ranks, steps, first_rank = 1024, 20, 700
    store = _Store()
    rec = IncidentSeries(store, "job")
    for step in range(1, steps + 1):
        rec.ring.append((step, [_Counted(step=step, loss=2.0, rank=r) for r in range(ranks)], None))
    _Counted.converted = 0
    rec.replay[1] = 0
    rec._write(1, list(rec.ring), first_rank)
    kept = MAX_RANKS + 1
    assert len(store.rows) == steps * kept  # what is stored is unchanged: the first 64 ranks and rank 700
    assert {r["rank"] for r in store.rows} == set(range(MAX_RANKS)) | {first_rank}
    assert _Counted.converted == steps * kept, (
        f"{_Counted.converted} records converted for {steps * kept} rows"
    )


def test_dict_records_are_chosen_by_rank_too() -> None:
    rows = series_mod._rows([{"step": 3, "loss": 1.0, "rank": r} for r in range(200)], keep_rank=150)
    assert [r["rank"] for r in rows] == [*range(MAX_RANKS), 150]


class _CountedText(str):
    """A batch's joined sample IDs that count the values each split of them makes."""

    values = 0

    def split(self, sep: Any = None, maxsplit: int = -1) -> list[str]:  # type: ignore[override]
        got = super().split(sep, maxsplit)
        _CountedText.values += len(got)
        return got


class _CountedList(list[int]):
    """A batch's per-record counts or source-name index that counts the entries each full read of
    it walks."""

    walked = 0

    def __iter__(self) -> Any:
        _CountedList.walked += len(self)
        return super().__iter__()


@pytest.mark.parametrize(
    "lagging", [False, True], ids=["every link the same steps", "one link a step behind"]
)
def test_a_batch_of_many_steps_is_cut_into_steps_and_heads_in_one_pass_over_its_flat_columns(
    lagging: bool,
) -> None:
    """A supervisor behind its ranks takes a batch of many steps (each link's run of them). Each
    step is cut from it -- every k-th record when every link sent the same steps, else by rows --
    and the incident series keeps each step's first ``MAX_RANKS`` ranks. Found at 1,024 emulated
    ranks (``python -m bench.scale``, free steps): 37% of the control loop's samples re-split the
    batch's sample IDs up to a step's 64th rank, and re-checked the whole batch's source names, once
    per step -- a cost that grew with the square of the steps a batch held. Cut by rows (a link a step
    behind its peers, as real ranks' records reach a relay), each step split and walked the whole
    batch, and cut every rank's sample IDs that only an incident reads."""
    ranks, steps, ids = 512, 16, 4
    order = [
        (r, 100 + j)
        for r in range(ranks)
        for j in range(steps)
        if not (lagging and r == 0 and j == steps - 1)
    ]
    n = len(order)  # link by link: each rank's run of steps
    at = {rs: i for i, rs in enumerate(order)}
    cols = {"step": [s for _, s in order], "rank": [r for r, _ in order], "loss": [2.0] * n}
    text = _CountedText(SEP.join(f"web:doc_{i}_{q}" for i in range(n) for q in range(ids)))
    per, index = _CountedList([2] * n), _CountedList([0, 1] * n)
    flat = (["web", "code"], per, index, [7.0] * (2 * n), [3.0] * (2 * n))
    frame = StepFrame(n, cols, flat_sources=flat, strings={"samples": (_CountedList([ids] * n), text)})
    _CountedText.values = _CountedList.walked = 0

    chunks = StepAssembler._by_step(frame)
    assert chunks is not None and [s for s, _ in chunks] == [100 + j for j in range(steps)]
    for step, chunk in chunks:
        head = series_mod._rows(chunk, keep_rank=None)
        first = 1 if lagging and step == 100 + steps - 1 else 0
        assert head.col("rank") == list(range(first, MAX_RANKS))  # the series keeps ranks below MAX_RANKS
        i = at[(first + 1, step)]
        assert head.col("samples")[1] == [f"web:doc_{i}_{q}" for q in range(ids)]
        had = ranks - first
        assert chunk.source_totals() == {"web": [7.0 * had, 3.0 * had], "code": [7.0 * had, 3.0 * had]}

    reach = MAX_RANKS * steps * ids  # the sample IDs up to the last step's 64th rank
    assert _CountedText.values <= 3 * reach, f"{_CountedText.values} values split for {reach} the cuts reach"
    assert _CountedList.walked <= 3 * (len(index) + len(per) + n), f"{_CountedList.walked} entries walked"


def test_a_batch_of_many_steps_is_decoded_with_no_object_per_value_and_each_step_reads_its_own() -> None:
    """A fast run, or a supervisor catching up, takes batches of many steps (each link's run of them).
    Decoding one made every numeric value of every record a Python object at once (a list per
    column), and the steps, analysed one by one after it, read them back long out of the cache: at
    1,024 ranks and 40 steps a batch the decode cost 2.2x a one-step batch's per step, and the loop
    1.2x (``python -m bench.scale.path --batch-steps 40``). The wire's typed columns now stay as they
    came until a step cut from them is read."""
    ranks, steps = 256, 40
    n = ranks * steps  # link by link: each rank's run of steps
    groups = [(r, f"link-{r}", None, list(range(1, steps + 1)), steps) for r in range(ranks)]
    cols: dict[str, list[Any]] = {
        "step": [100 + j for _ in range(ranks) for j in range(steps)],
        "rank": [r for r in range(ranks) for _ in range(steps)],
        "loss": [2.0 + 1e-4 * i for i in range(n)], "grad_norm": [1.5] * n, "update_norm": [0.01] * n,
        "param_norm": [100.0] * n, "lr": [3e-4] * n, "tokens": [4096] * n, "loss_sum": [8192.0] * n,
        "time": [1.7e9 + i for i in range(n)], "nonfinite": [i == 7 for i in range(n)], "overflow": [False] * n,
    }  # fmt: skip
    batch = wire.pack_columns(groups, cols)
    tracemalloc.start()
    try:
        packed = wire.unpack_frame(batch)
        decoded = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert packed is not None
    # A list per column held a pointer and a float or int object per value: >= 32 bytes a value,
    # 12 columns. What is left is the records' numbers within their links (a list per batch).
    assert decoded < 24 * n, f"{decoded} bytes allocated decoding {n} records"
    for j in range(steps):
        step = packed.frame.take(range(j, n, steps))
        assert step.col("step") == [100 + j] * ranks
        assert step.col("loss") == [cols["loss"][r * steps + j] for r in range(ranks)]
        assert step.col("nonfinite") == [r * steps + j == 7 for r in range(ranks)]  # flags read as bools
        assert all(type(v) is bool for v in step.col("overflow"))
        assert step[3] == Record(**{k: v[3 * steps + j] for k, v in cols.items()})
