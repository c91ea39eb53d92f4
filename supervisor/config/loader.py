"""The one reader of files a person hands the supervisor, and YAML into pydantic models.

Every failure is a one-line error naming the file, the field path and what was wrong,
e.g. ``job.yaml: resources.num_workers: must be >= 1 (got 0)``. Hostile input stays
bounded in time and memory (limits in docs/operations.md, "Input limits"):

- only regular files are read: a FIFO, a device or a socket is refused after ``stat`` and
  before ``open`` (and opened ``O_NONBLOCK`` so a FIFO swapped in meanwhile cannot block);
- reads stream in chunks and stop past ``max_bytes`` (no ``/dev/zero`` read whole);
- gzip is decompressed as a stream, capped in size and in compression ratio (a 1 MB bomb
  is refused after a few MiB of output, not after 2 GB);
- YAML: nesting depth, node count with aliases expanded (billion laughs), recursive aliases,
  integers longer than ``MAX_INT_DIGITS`` and duplicate keys are refused before anything is
  constructed.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from supervisor.errors import ConfigError, SupervisorError

M = TypeVar("M", bound=BaseModel)

ENV_MAX_INPUT = "SUPERVISOR_MAX_INPUT_BYTES"


def _env_max_input() -> int | None:
    """$SUPERVISOR_MAX_INPUT_BYTES as a number >= 1 (default 1 GiB); None when it is not one
    (`abc` was a traceback at import; every read then says so in one line)."""
    text = os.environ.get(ENV_MAX_INPUT)
    if text is None:
        return 1 << 30
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        return None
    return value if value >= 1 else None


_ENV_LIMIT = _env_max_input()
MAX_INPUT_BYTES = _ENV_LIMIT or 1 << 30
"""Largest file (after decompression) any command reads: 1 GiB unless $SUPERVISOR_MAX_INPUT_BYTES."""
MAX_YAML_BYTES = 512 << 10
"""Largest job or policy YAML file (and ``--set`` value): 512 KiB, 30x the largest shipped policy.
PyYAML's pure-Python parser takes seconds per MiB; at 8 MiB a flat file ran past 20 s."""
MAX_DEPTH = 64
"""Deepest nesting of YAML mappings / lists (aliases expanded)."""
MAX_NODES = 200_000
"""Most YAML nodes with every alias expanded (what serialising the result would produce)."""
MAX_INT_DIGITS = 100
"""Longest integer literal in YAML (Python refuses over 4300 digits; no setting needs 100)."""
MAX_GZIP_RATIO = 200
"""Decompressed / compressed size above which gzip input is a bomb (text logs compress ~5-20x)."""
MAX_GZIP_PADDING = 1 << 16
"""Zero bytes allowed after a gzip member (tape-style block padding is at most a few KiB)."""
_GZIP_RATIO_FROM = 16 << 20  # the ratio is judged once this much output exists
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(p: Path, error: type[SupervisorError], expected: str) -> int:
    """A read-only fd of ``p``, refused unless it is a regular file (checked before and after open)."""
    try:
        before = os.stat(p)
        if not stat.S_ISREG(before.st_mode):
            raise error(f"is {_kind(before.st_mode)}, expected {expected}", source=str(p))
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error("file not found", source=str(p)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", source=str(p)) from None
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode):  # replaced between stat and open
        os.close(fd)
        raise error(f"is {_kind(after.st_mode)}, expected {expected}", source=str(p))
    return fd


def _too_big(p: Path, limit: int, error: type[SupervisorError], what: str = "") -> SupervisorError:
    hint = " (raise $SUPERVISOR_MAX_INPUT_BYTES to allow more)" if limit == MAX_INPUT_BYTES else ""
    return error(f"{what}larger than {limit:,} bytes, the input limit{hint}", source=str(p))


def _read_capped(stream: io.RawIOBase | gzip.GzipFile, limit: int, head: bytes = b"") -> bytes | None:
    """``head`` and then up to ``limit`` bytes in all, read in chunks; None when there is more."""
    buf = bytearray(head)
    while len(buf) <= limit:
        chunk = stream.read(min(_CHUNK, limit + 1 - len(buf)))
        if not chunk:
            return bytes(buf)
        buf += chunk
    return None


def _gunzip(raw_file: io.FileIO, p: Path, limit: int, error: type[SupervisorError]) -> bytes:
    """Every gzip member of the file, decompressed as a stream (zlib, not ``gzip.GzipFile``: that
    one skips zero padding after a member one byte per read, > 300 s for 1 GiB of it)."""
    out = bytearray()
    member: Any = None  # the decompressor of the member being read; None between members
    consumed = padding = 0
    try:
        while chunk := raw_file.read(_CHUNK):
            consumed += len(chunk)
            data: bytes = chunk
            while data:
                if member is None:
                    stripped = data.lstrip(b"\0")  # zero padding between or after members
                    padding += len(data) - len(stripped)
                    if padding > MAX_GZIP_PADDING:
                        raise error(
                            f"corrupt gzip data: more than {MAX_GZIP_PADDING:,} bytes of zero padding",
                            source=str(p),
                        )
                    data = stripped
                    if not data:
                        break
                    member, padding = zlib.decompressobj(wbits=31), 0
                out += member.decompress(data, limit + 1 - len(out))
                if len(out) > limit:
                    raise _too_big(p, limit, error, "decompressed ")
                if len(out) > _GZIP_RATIO_FROM and len(out) > MAX_GZIP_RATIO * consumed:
                    raise error(
                        f"gzip expands more than {MAX_GZIP_RATIO}x (a decompression bomb?); refused",
                        source=str(p),
                    )
                if member.eof:
                    data, member = member.unused_data, None
                else:
                    data = member.unconsumed_tail
        if member is not None:
            raise error("corrupt gzip data: the file ends inside a compressed member", source=str(p))
    except (OSError, EOFError, zlib.error) as exc:
        raise error(f"corrupt gzip data: {' '.join(str(exc).split())}", source=str(p)) from None
    return bytes(out)


def read_bytes(
    path: str | Path,
    *,
    error: type[SupervisorError],
    expected: str,
    max_bytes: int | None = None,
    decompress: bool = True,
    check_head: Callable[[bytes], None] | None = None,
) -> bytes:
    """A regular file's bytes (gzip decompressed transparently), at most ``max_bytes``.

    Missing, unreadable, special (FIFO, device, socket, directory), oversized and corrupt
    gzip files are each one ``error`` naming the file.
    """
    p = Path(path)
    if max_bytes is None and _ENV_LIMIT is None:
        raise ConfigError(f"must be a whole number of bytes >= 1 (got {os.environ.get(ENV_MAX_INPUT)!r})",
                          source=f"${ENV_MAX_INPUT}")  # fmt: skip
    limit = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    fd = _open_regular(p, error, expected)
    with io.FileIO(fd, "rb", closefd=True) as raw_file:
        try:
            head = raw_file.read(2)
            if decompress and head == _GZIP_MAGIC:
                raw_file.seek(0)
                return _gunzip(raw_file, p, limit, error)
            size = os.fstat(fd).st_size
            if size > limit:  # refused before reading (a 2 GB file took 1 GB and seconds)
                raise _too_big(p, limit, error)
            if check_head is not None:  # e.g. "binary content", judged before the whole file is read
                check_head(head + raw_file.read(4094))
            # One read of the size fstat gave: one buffer of the file's size, never a copy of it.
            raw_file.seek(0)
            data = raw_file.read(size + 1)
            if len(data) > size:  # it grew meanwhile: the rest in chunks, still capped
                data = _read_capped(raw_file, limit, data)
        except OSError as exc:
            raise error(f"cannot read: {exc.strerror or exc}", source=str(p)) from None
    if data is None:
        raise _too_big(p, limit, error)
    return data  # one copy of the file in memory at the end, two for a moment (no `head + rest`)


# -- YAML ---------------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting while composing and over-long integers while constructing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            if self._nodes > MAX_NODES:  # counted while composing, not after
                raise _Refused(f"more than {MAX_NODES:,} values", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise _Refused(f"integer with {digits} digits (at most {MAX_INT_DIGITS})", node.start_mark)
        value: int = super().construct_yaml_int(node)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
# YAML 1.2 floats: PyYAML (YAML 1.1) reads `3e-4` and `1e12` as strings, which then fail a
# number field with a puzzling message; read them as the numbers a person meant.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _expanded_size(root: yaml.Node) -> int:
    """Nodes of ``root`` with aliases expanded; refuses cycles, depth and size over the limits.

    Memoised per node, so a billion-laughs document costs one visit per distinct node."""
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded height)
    active: set[int] = set()

    def visit(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise _Refused("recursive alias (a node that contains itself)", node.start_mark)
        if key not in memo:
            active.add(key)
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            size, height = 1, 0
            for child in children:
                s, h = visit(child, depth + 1)
                size, height = size + s, max(height, h + 1)
                if size > MAX_NODES:
                    raise _Refused(
                        f"more than {MAX_NODES:,} values once aliases are expanded", node.start_mark
                    )
            active.discard(key)
            memo[key] = (size, height)
        size, height = memo[key]
        if depth + height > MAX_DEPTH:
            raise _Refused(
                f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", node.start_mark
            )
        return size, height

    return visit(root, 1)[0]


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _no_duplicate_keys(root: yaml.Node) -> None:
    """Refuses a mapping that names one key twice (PyYAML silently keeps the last).

    A key set by a merge (``<<: *base``) may still be overridden: only the mapping's own keys
    count. Each distinct node is visited once (aliases are shared), so this is as bounded as
    ``_expanded_size``; the error names the dotted path of the first place the key was found."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], Any] = {}
            for key, value in node.value:
                if key.tag == _MERGE_TAG:
                    stack.append((value, path))
                    continue
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                here = f"{path}.{name}" if path else name
                if isinstance(key, yaml.ScalarNode):
                    ident = (key.tag, key.value)
                    if ident in first:
                        raise _Refused(
                            f"{here}: duplicate key{_where(key.start_mark)}"
                            f" (already set at line {first[ident].line + 1}; each key may appear once)"
                        )
                    first[ident] = key.start_mark
                stack.append((value, here))


def parse_yaml(text: str, *, source: str, error: type[SupervisorError] = ConfigError) -> Any:
    """Parse YAML text within the limits above; every failure is one ``error`` line."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"larger than {MAX_YAML_BYTES:,} characters of YAML, the input limit", source=source)
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the reader already refuses control characters
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        _no_duplicate_keys(node)
        return loader.construct_document(node)
    except _Refused as exc:
        raise error(f"{exc}{_where(exc.mark)}", source=source) from None
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or "invalid YAML"
        raise error(
            f"YAML syntax error{_where(exc.problem_mark) or ' at unknown position'}: {problem}", source=source
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise error(f"invalid YAML: {' '.join(str(exc).split())[:200]}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(mark: Any) -> str:
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def read_yaml(path: str | Path, *, error: type[SupervisorError] = ConfigError) -> Any:
    """Parse a YAML file; syntax errors name the line and column, unreadable files say why."""
    p = Path(path)
    raw = read_bytes(p, error=error, expected="a YAML file", max_bytes=MAX_YAML_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", source=str(p)) from None
    if "\x00" in text:
        raise error("binary content, expected YAML text", source=str(p)) from None
    return parse_yaml(text, source=str(p), error=error)


# -- --set key=value ----------------------------------------------------------------------------


def apply_overrides(
    data: Any, overrides: Sequence[str], *, error: type[SupervisorError] = ConfigError
) -> Any:
    """``data`` with each ``dotted.key=value`` of ``overrides`` set (value parsed as YAML)."""
    if not overrides:
        return data
    if data is None:
        data = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise error(
                f"expected KEY=VALUE with a dotted KEY such as resources.num_workers=2 (got {item!r})",
                source="--set",
            )
        value = parse_yaml(text, source=f"--set {key}", error=error)
        _set_path(data, [p.strip() for p in parts], value, key, error)
    return data


def _set_path(data: Any, parts: list[str], value: Any, key: str, error: type[SupervisorError]) -> None:
    node = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
                return
            node = node.setdefault(part, {})
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            if last:
                node[int(part)] = value
                return
            node = node[int(part)]
        else:
            where = ".".join(parts[:i]) or "(top level)"
            raise error(
                f"cannot set {key}: {where} is not a mapping (or {part!r} is no list index)", source="--set"
            )


# -- pydantic ------------------------------------------------------------------------------------


def format_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error, worded for a person."""
    return format_validation_errors(exc)[0]


def format_validation_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """(field path, message) of every error, worded for a person (one per field)."""
    out: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        loc, msg = _describe(err)
        out.setdefault(loc, msg)
    return list(out.items())


def _describe(err: Any) -> tuple[str, str]:
    loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "required field is missing"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values())) if ctx else "?"
        msg = f"must be {op} {bound} (got {_short(got)})"
    elif kind in ("literal_error", "enum"):
        msg = f"must be one of {ctx.get('expected', '?')} (got {_short(got)})"
    else:
        text = err["msg"]
        if text.startswith("Value error, "):
            text = text[len("Value error, ") :]
        msg = f"{text[:1].lower()}{text[1:]}"
        if got is not None and kind not in ("value_error", "assertion_error") and not isinstance(got, dict):
            msg += f" (got {_short(got)})"
    return loc, msg


def _short(value: Any) -> str:
    if isinstance(value, list | tuple | dict) and len(value) > 20:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(data: Any, path: str | Path, error: type[SupervisorError]) -> dict[str, Any]:
    if data is None:
        raise error("file is empty", source=str(path))
    if not isinstance(data, dict):
        raise error(f"expected a mapping at the top level, got {type(data).__name__}", source=str(path))
    return data


def load_model(
    model: type[M],
    path: str | Path,
    *,
    error: type[SupervisorError] = ConfigError,
    data: Any = None,
    overrides: Sequence[str] = (),
) -> M:
    """Validate YAML ``path`` (or already-parsed ``data``) against ``model``; raises the first error."""
    found, problems = check_model(model, path, error=error, data=data, overrides=overrides)
    if found is None:
        raise problems[0]
    return found


def check_model(
    model: type[M],
    path: str | Path,
    *,
    error: type[SupervisorError] = ConfigError,
    data: Any = None,
    overrides: Sequence[str] = (),
) -> tuple[M | None, list[SupervisorError]]:
    """(the model, []) or (None, every problem found), each problem one line naming file and field."""
    try:
        if data is None:
            data = read_yaml(path, error=error)
        data = apply_overrides(_mapping(data, path, error), overrides, error=error)
        return model.model_validate(data), []
    except SupervisorError as exc:
        return None, [exc]
    except ValidationError as exc:
        return None, [
            error(msg, source=str(path), field=field) for field, msg in format_validation_errors(exc)
        ]
