"""The native trace: one JSON object per rank per step (docs/sdk.md: the record each rank sends)."""

from __future__ import annotations

from collections.abc import Iterable

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, json_loads, lines_of


def parse_jsonl(text: str | Iterable[str]) -> TraceData:
    records: list[Record] = []
    skipped = 0
    for line in lines_of(text):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json_loads(line)  # Python's json reads NaN / Infinity, as the format requires
            records.append(Record.from_dict(obj))
        except (ValueError, TypeError, KeyError, AttributeError):
            skipped += 1
    return TraceData(records, skipped, "jsonl")


def looks_like_jsonl(line: str) -> bool:
    s = line.strip()
    return s.startswith("{") and '"step"' in s and '"loss"' in s
