"""What every trace parser returns, and the shared reading of a trace file."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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


#: The start of a trace file read to recognise its format (formats are told apart in a few lines).
HEAD_BYTES = 1 << 20
MAX_LINE_CHARS = 1 << 20
"""A line of a line-based trace or log longer than this (1 MiB of UTF-8 between two newlines) is
skipped and counted: a record is a few KiB, and regexes and ``json.loads`` over a 1 GB line would
take minutes and gigabytes."""
_SKIP_CHUNK = 1 << 20


class TraceLines:
    """A trace file's lines, streamed: what a line-based parser iterates instead of the whole text.

    The file is checked as ``read_text`` checks it (a regular file, within the input limit by its
    size before anything is read, text not binary, no gzip inside gzip); ``head`` is its first
    ``HEAD_BYTES`` as text, for recognising the format. Iterating reads it again from the start, a
    line at a time (one line in memory, never the text, its decoded copy and a list of its lines at
    once): lines longer than ``MAX_LINE_CHARS`` bytes are skipped without being built, and counted in
    ``long_lines``. A gzip file is decompressed whole (bounded by the same limit) and streamed from
    its bytes.
    """

    def __init__(self, path: str | Path) -> None:
        from supervisor.config import loader

        self.path = Path(path)
        self.source = str(self.path)
        self.long_lines = 0
        limit = loader.MAX_INPUT_BYTES
        fd = loader._open_regular(self.path, TraceError, "a trace file")
        raw = io.FileIO(fd, "rb", closefd=True)
        try:
            magic = raw.read(2)
            if magic == loader._GZIP_MAGIC or loader._ENV_LIMIT is None:
                raw.close()  # read_bytes decompresses with its bounds (and names a bad limit)
                self._stream: BinaryIO = io.BytesIO(
                    read_bytes(self.path, error=TraceError, expected="a trace file")
                )
            else:
                if os.fstat(fd).st_size > limit:  # refused by its size, before anything is read
                    raise loader._too_big(self.path, limit, TraceError)
                raw.seek(0)
                self._stream = io.BufferedReader(raw, 1 << 20)
            head = self._stream.read(HEAD_BYTES)
        except OSError as exc:
            raw.close()
            raise TraceError(f"cannot read: {exc.strerror or exc}", source=self.source) from None
        except BaseException:  # refused (too big, a bad gzip): the file is closed, not left open
            raw.close()
            raise
        if b"\x00" in head[:4096]:
            self.close()
            raise TraceError("binary content, expected a text trace or log", source=self.source)
        if head[:2] == b"\x1f\x8b":
            self.close()
            raise TraceError("gzip inside gzip, expected a text trace or log", source=self.source)
        self.head_cut = len(head) == HEAD_BYTES
        """The file goes on past ``head``, which ends at its last complete line (nothing: none)."""
        if self.head_cut:
            head = head[: head.rfind(b"\n") + 1]
        self.head = head.decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[str]:
        stream = self._stream
        stream.seek(0)
        while raw := stream.readline(MAX_LINE_CHARS + 1):
            if len(raw) > MAX_LINE_CHARS and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the long line, never kept
                    raw = stream.readline(_SKIP_CHUNK)
                self.long_lines += 1
                continue
            yield from raw.decode("utf-8", errors="replace").splitlines()

    def text(self) -> str:
        """The whole text (a format that is one JSON document needs it); bounded by the input limit."""
        self._stream.seek(0)
        return self._stream.read().decode("utf-8", errors="replace")

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> TraceLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lines_of(text: str | Iterable[str]) -> Iterable[str]:
    """The lines a parser reads: of a text, or as a ``TraceLines`` streams them."""
    return text.splitlines() if isinstance(text, str) else text


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
