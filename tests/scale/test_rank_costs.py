"""Costs on the supervisor's path that must not grow with every rank of the job.

Found with ``python -m bench.scale`` (the rank emulator driving the real supervisor actor): at 256
emulated ranks the plan of a non-finite step came 1.9 s after its detection, and the freeze 5 steps
after it. The incident's per-rank series keeps at most ``MAX_RANKS`` ranks (plus the incident's
first rank), yet every record of every rank of the ring (128 steps) was converted to a dict before
that choice was made: 131,072 conversions at 1,024 ranks, on the control loop, before the plan.
"""

from __future__ import annotations

from typing import Any

from supervisor.core.records import Record
from supervisor.incidents.scrub import series_row
from supervisor.observability import series as series_mod
from supervisor.observability.series import MAX_RANKS, IncidentSeries


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
