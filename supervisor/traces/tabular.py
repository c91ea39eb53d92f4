"""CSV traces: a header row with the record's field names; empty cells are absent fields.

``samples`` and ``events`` may be JSON lists or ``;``-separated; ``sources`` and ``attrs`` are
JSON objects.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, json_loads, lines_of

_LISTS = ("samples", "events")
_OBJECTS = ("sources", "attrs")


def _cell(name: str, value: str) -> Any:
    value = value.strip()
    if name in _LISTS:
        if value.startswith("["):
            return json_loads(value)
        return [v for v in value.split(";") if v]
    if name in _OBJECTS:
        return json_loads(value)
    return value


def parse_csv(text: str | Iterable[str]) -> TraceData:
    reader = csv.DictReader(_rows(text))
    records: list[Record] = []
    skipped = 0
    if not reader.fieldnames or "step" not in reader.fieldnames or "loss" not in reader.fieldnames:
        lines = sum(1 for line in lines_of(text) if line.strip())
        return TraceData([], lines, "csv", ["no header with `step` and `loss` columns"])
    for row in reader:
        try:
            d = {k: _cell(k, v) for k, v in row.items() if k and v is not None and v.strip() != ""}
            records.append(Record.from_dict(d))
        except (ValueError, TypeError, KeyError, AttributeError):
            skipped += 1
    return TraceData(records, skipped, "csv")


def _rows(text: str | Iterable[str]) -> Iterable[str]:
    """What ``csv`` reads: the text, or the streamed lines with their ends (a quoted cell may span lines)."""
    return io.StringIO(text) if isinstance(text, str) else (line + "\n" for line in text)


def looks_like_csv(line: str) -> bool:
    cols = [c.strip() for c in line.split(",")]
    return "step" in cols and "loss" in cols
