"""What every trace parser returns, and the shared reading of a trace file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config.loader import read_bytes
from supervisor.core.records import Record
from supervisor.errors import TraceError


@dataclass(slots=True)
class TraceData:
    """Records in trace order, how many non-blank lines carried no usable record, and the format read."""

    records: list[Record]
    skipped_lines: int
    format: str
    notes: list[str] = field(default_factory=list)


def read_text(path: str | Path) -> str:
    """The file's text (``.gz`` transparently); one-line TraceError when it cannot be read as text."""
    p = Path(path)

    def text_only(head: bytes) -> None:  # judged on the first 4 KiB: a 1 GiB binary file is never read whole
        if b"\x00" in head[:4096]:
            raise TraceError("binary content, expected a text trace or log", source=str(p))

    raw = read_bytes(p, error=TraceError, expected="a trace file", check_head=text_only)  # gzip: decompressed
    if raw[:2] == b"\x1f\x8b":  # gzip inside gzip: a trace is never that
        raise TraceError("gzip inside gzip, expected a text trace or log", source=str(p))
    text_only(raw)
    return raw.decode("utf-8", errors="replace")


def json_loads(text: str) -> Any:
    """``json.loads`` whose too-deep nesting (``[[[[...`` a few thousand levels, a RecursionError
    from the C decoder) is a ValueError like any other malformed JSON: the line or file is skipped."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_float(text: str) -> float | None:
    """A float as logs print it (``nan``, ``inf``, ``1.2E+00``); None when it is not a number."""
    try:
        v = float(text.strip().rstrip(",;"))
    except ValueError:
        return None
    return v


def finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
