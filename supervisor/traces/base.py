"""What every trace parser returns, and the shared reading of a trace file."""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass, field
from pathlib import Path

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
    raw = read_bytes(p, error=TraceError, expected="a trace file")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(f"corrupt gzip data: {exc}", source=str(p)) from None
    text = raw.decode("utf-8", errors="replace")
    if "\x00" in text[:4096]:
        raise TraceError("binary content, expected a text trace or log", source=str(p)) from None
    return text


def parse_float(text: str) -> float | None:
    """A float as logs print it (``nan``, ``inf``, ``1.2E+00``); None when it is not a number."""
    try:
        v = float(text.strip().rstrip(",;"))
    except ValueError:
        return None
    return v


def finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
