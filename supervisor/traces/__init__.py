"""Trace and log readers: pure parsers from text to ``Record`` lists (no torch, Ray or boto3).

    data = read_trace("run.jsonl")                 # format="auto" sniffs the content
    data = read_trace("chronicles.md", "megatron")  # or force one of FORMATS
    data = read_run(["rank0.jsonl", "rank1.jsonl"]) # one run split over files, or a directory
    data = read_trace("runs/exp1")                  # a TensorBoard run directory

A file that cannot be read, or has no parsable line at all, raises ``TraceError``. Lines that
match nothing are skipped and counted (``TraceData.skipped_lines``). Readers of named metrics
(TensorBoard, W&B, Lightning) take a ``FieldMap`` (``--map FIELD=NAME``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from supervisor.errors import TraceError
from supervisor.traces.base import MAX_LINE_CHARS, TraceData, TraceLines
from supervisor.traces.hf_trainer import looks_like_hf_trainer, parse_hf_trainer
from supervisor.traces.jsonl import looks_like_jsonl, parse_jsonl
from supervisor.traces.loggers import looks_like_lightning, looks_like_wandb, parse_lightning, parse_wandb
from supervisor.traces.megatron import looks_like_megatron, parse_megatron
from supervisor.traces.metrics import FieldMap
from supervisor.traces.modded_nanogpt import looks_like_modded_nanogpt, parse_modded_nanogpt
from supervisor.traces.nanogpt import looks_like_nanogpt, parse_nanogpt
from supervisor.traces.runs import merge_files
from supervisor.traces.tabular import looks_like_csv, parse_csv
from supervisor.traces.tensorboard import is_event_file, read_tensorboard, walk_files

#: Parser registry: format name -> (text, field map) -> TraceData. ``--format`` choices are these
#: plus the file-based ``tensorboard``.
FORMATS: dict[str, Callable[[str, FieldMap], TraceData]] = {
    "jsonl": lambda text, fmap: parse_jsonl(text),
    "csv": lambda text, fmap: parse_csv(text),
    "megatron": lambda text, fmap: parse_megatron(text),
    "nanogpt": lambda text, fmap: parse_nanogpt(text),
    "modded_nanogpt": lambda text, fmap: parse_modded_nanogpt(text),
    "hf_trainer": lambda text, fmap: parse_hf_trainer(text),
    "wandb": parse_wandb,
    "lightning": parse_lightning,
}
ALL_FORMATS = (*FORMATS, "tensorboard")

_LINE_SNIFFERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("jsonl", looks_like_jsonl),
    ("megatron", looks_like_megatron),
    ("modded_nanogpt", looks_like_modded_nanogpt),
    ("nanogpt", looks_like_nanogpt),
)

#: Files a directory of one run may hold (anything else in it is ignored).
_TRACE_SUFFIXES = (".jsonl", ".json", ".csv", ".log", ".txt", ".md", ".out")

__all__ = [
    "ALL_FORMATS", "FORMATS", "MAX_LINE_CHARS", "FieldMap", "TraceData", "detect_format", "parse_file", "parse_text",
    "read_run", "read_trace",
]  # fmt: skip


#: Formats whose file is one JSON document (a minified one may be a single long line).
_DOCUMENT_FORMATS = ("hf_trainer", "wandb")


def _lines(text: str, limit: int) -> list[str]:
    """Up to ``limit`` non-blank lines from the start of ``text`` no longer than ``MAX_LINE_CHARS``,
    looking at most 5,000 lines ahead; never splits the whole text."""
    out: list[str] = []
    start, seen = 0, 0
    while start < len(text) and seen < 5000 and len(out) < limit:
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if end - start <= MAX_LINE_CHARS and text[start:end].strip():
            out.append(text[start:end])
        start, seen = end + 1, seen + 1
    return out


def _drop_long_lines(text: str) -> tuple[str, int]:
    """``text`` with each line longer than ``MAX_LINE_CHARS`` emptied, and how many there were."""
    if len(text) <= MAX_LINE_CHARS:
        return text, 0
    pieces: list[str] = []
    start, keep_from, dropped = 0, 0, 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if end - start > MAX_LINE_CHARS:
            pieces.append(text[keep_from:start])
            keep_from, dropped = end, dropped + 1
        start = end + 1
    if not dropped:
        return text, 0
    pieces.append(text[keep_from:])
    return "".join(pieces), dropped


def detect_format(text: str, name: str = "") -> str | None:
    """The format whose lines are most common in the first 2,000 non-blank lines (None: no idea)."""
    if looks_like_hf_trainer(text) or name.endswith("trainer_state.json"):
        return "hf_trainer"
    if looks_like_wandb(text):
        return "wandb"
    lines = _lines(text, 2000)
    if lines and looks_like_lightning(lines[0]):
        return "lightning"
    if lines and looks_like_csv(lines[0]):
        return "csv"
    counts = {fmt: sum(1 for line in lines if sniff(line)) for fmt, sniff in _LINE_SNIFFERS}
    best = max(counts, key=counts.__getitem__)
    return best if counts[best] else None


def parse_text(
    text: str, format: str = "auto", source: str = "<text>", fmap: FieldMap | None = None
) -> TraceData:
    if format == "auto":
        detected = detect_format(text, source)
        if detected is None:
            longest = (
                ""
                if len(text) <= MAX_LINE_CHARS or _lines(text, 1)
                else (f"; lines longer than {MAX_LINE_CHARS:,} characters are skipped")
            )
            raise TraceError(f"no parsable line (tried {', '.join(ALL_FORMATS)}){longest}", source=source)
        format = detected
    parser = FORMATS.get(format)
    if parser is None:
        raise TraceError(f"unknown format {format!r}; valid: auto, {', '.join(ALL_FORMATS)}", source=source)
    long_lines = 0
    if format not in _DOCUMENT_FORMATS:
        text, long_lines = _drop_long_lines(text)
    return _checked(parser(text, fmap or FieldMap()), format, source, long_lines)


def _checked(data: TraceData, format: str, source: str, long_lines: int) -> TraceData:
    """``data`` with its skipped long lines counted and noted; no record at all is a TraceError."""
    if long_lines:
        data.skipped_lines += long_lines
        data.notes.append(f"{long_lines} line(s) longer than {MAX_LINE_CHARS:,} characters skipped")
    if not data.records:
        why = f"; {data.notes[-1]}" if data.notes else ""
        raise TraceError(
            f"no parsable line as {format} ({data.skipped_lines} lines skipped){why}", source=source
        )
    return data


def parse_file(path: str | Path, format: str = "auto", fmap: FieldMap | None = None) -> TraceData:
    """One trace or log file, streamed (``TraceLines``): its format recognised from its start, a
    line-based one parsed a line at a time, so memory holds the records, never the whole text and
    its copies; a format that is one JSON document (``hf_trainer``, ``wandb``) is read whole.
    Over the input limit it is refused by its size before anything is read."""
    source = str(path)
    with TraceLines(path) as lines:
        head = lines.head
        if format == "auto":
            detected = detect_format(head, source)
            if detected is None:
                longest = (
                    ""
                    if not (lines.head_cut or len(head) > MAX_LINE_CHARS) or _lines(head, 1)
                    else (f"; lines longer than {MAX_LINE_CHARS:,} characters are skipped")
                )
                raise TraceError(f"no parsable line (tried {', '.join(ALL_FORMATS)}){longest}", source=source)
            format = detected
        if format in _DOCUMENT_FORMATS or format not in FORMATS:
            return parse_text(lines.text(), format, source, fmap)
        data = FORMATS[format](lines, fmap or FieldMap())  # type: ignore[arg-type]
        long_lines = lines.long_lines
    return _checked(data, format, source, long_lines)


def read_trace(path: str | Path, format: str = "auto", fmap: FieldMap | None = None) -> TraceData:
    """Read a trace or training log (a file, or a directory of one run); ``format`` is ``auto`` or
    one of ``ALL_FORMATS``."""
    return read_run([Path(path)], format, fmap)


def read_run(paths: list[Path], format: str = "auto", fmap: FieldMap | None = None) -> TraceData:
    """One run from files and directories: TensorBoard event files, or trace/log files (one per rank,
    or one run in pieces) merged step by step. Files of a directory that do not parse are noted."""
    source = ", ".join(map(str, paths))
    if format != "auto" and format not in ALL_FORMATS:
        raise TraceError(f"unknown format {format!r}; valid: auto, {', '.join(ALL_FORMATS)}", source=source)
    paths = [Path(p) for p in paths]
    for p in paths:
        try:
            p.stat()
        except FileNotFoundError:
            raise TraceError("file not found", source=str(p)) from None
        except OSError as exc:  # a symlink loop, a name too long, a folder without permission
            raise TraceError(f"cannot read: {exc.strerror or exc}", source=str(p)) from None
    tb = [p for p in paths if is_event_file(p) or (p.is_dir() and _holds_event_file(p))]
    if format == "tensorboard" or (format == "auto" and tb and len(tb) == len(paths)):
        return read_tensorboard(paths, fmap)
    files: list[tuple[Path, bool]] = []  # (file, named explicitly)
    for p in paths:
        if p.is_dir():
            inside = sorted(f for f in p.iterdir() if f.is_file() and _trace_like(f.name))
            if not inside:
                raise TraceError(
                    f"no trace or log files in the directory ({', '.join(_TRACE_SUFFIXES)})", source=str(p)
                )
            files += [(f, False) for f in inside]
        else:
            files.append((p, True))
    if len(files) == 1:
        return parse_file(files[0][0], format, fmap)
    parsed: list[tuple[Path, TraceData]] = []
    notes: list[str] = []
    for f, explicit in files:
        try:
            parsed.append((f, parse_file(f, format, fmap)))
        except TraceError as exc:
            if explicit:
                raise
            notes.append(f"{f.name}: not read ({exc.message})")
    if not parsed:
        raise TraceError("no file of the directory holds a parsable trace", source=source)
    data = merge_files(parsed)
    data.notes[:0] = notes
    return data


def _holds_event_file(folder: Path) -> bool:
    return any("tfevents" in f.name for f in walk_files(folder))


def _trace_like(name: str) -> bool:
    base = name[:-3] if name.endswith(".gz") else name
    return not name.startswith(".") and base.lower().endswith(_TRACE_SUFFIXES)
