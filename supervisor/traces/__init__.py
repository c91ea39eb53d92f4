"""Trace and log readers: pure parsers from text to ``Record`` lists (no torch, Ray or boto3).

    data = read_trace("run.jsonl")                 # format="auto" sniffs the content
    data = read_trace("chronicles.md", "megatron")  # or force one of FORMATS

A file that cannot be read, or has no parsable line at all, raises ``TraceError``. Lines that
match nothing are skipped and counted (``TraceData.skipped_lines``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from supervisor.errors import TraceError
from supervisor.traces.base import TraceData, read_text
from supervisor.traces.hf_trainer import looks_like_hf_trainer, parse_hf_trainer
from supervisor.traces.jsonl import looks_like_jsonl, parse_jsonl
from supervisor.traces.megatron import looks_like_megatron, parse_megatron
from supervisor.traces.nanogpt import looks_like_nanogpt, parse_nanogpt
from supervisor.traces.tabular import looks_like_csv, parse_csv

#: Parser registry: format name -> text -> TraceData. ``--format`` choices come from here.
FORMATS: dict[str, Callable[[str], TraceData]] = {
    "jsonl": parse_jsonl,
    "csv": parse_csv,
    "megatron": parse_megatron,
    "nanogpt": parse_nanogpt,
    "hf_trainer": parse_hf_trainer,
}

_LINE_SNIFFERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("jsonl", looks_like_jsonl),
    ("megatron", looks_like_megatron),
    ("nanogpt", looks_like_nanogpt),
)

__all__ = ["FORMATS", "TraceData", "detect_format", "parse_text", "read_trace"]


def detect_format(text: str, name: str = "") -> str | None:
    """The format whose lines are most common in the first 2,000 non-blank lines (None: no idea)."""
    if looks_like_hf_trainer(text) or name.endswith("trainer_state.json"):
        return "hf_trainer"
    lines = [line for line in text.splitlines()[:5000] if line.strip()][:2000]
    if lines and looks_like_csv(lines[0]):
        return "csv"
    counts = {fmt: sum(1 for line in lines if sniff(line)) for fmt, sniff in _LINE_SNIFFERS}
    best = max(counts, key=counts.__getitem__)
    return best if counts[best] else None


def parse_text(text: str, format: str = "auto", source: str = "<text>") -> TraceData:
    if format == "auto":
        detected = detect_format(text, source)
        if detected is None:
            raise TraceError(f"no parsable line (tried {', '.join(FORMATS)})", source=source)
        format = detected
    parser = FORMATS.get(format)
    if parser is None:
        raise TraceError(f"unknown format {format!r}; valid: auto, {', '.join(FORMATS)}", source=source)
    data = parser(text)
    if not data.records:
        raise TraceError(f"no parsable line as {format} ({data.skipped_lines} lines skipped)", source=source)
    return data


def read_trace(path: str | Path, format: str = "auto") -> TraceData:
    """Read a trace or training log; ``format`` is ``auto`` or one of ``FORMATS``."""
    if format != "auto" and format not in FORMATS:
        raise TraceError(f"unknown format {format!r}; valid: auto, {', '.join(FORMATS)}", source=str(path))
    return parse_text(read_text(path), format, str(path))
