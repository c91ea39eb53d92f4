"""Read a YAML file into a pydantic model, turning every failure into a one-line ConfigError.

Shared by job.yaml and policy files: the message always names the file, the field path
and what was wrong, e.g. ``job.yaml: resources.num_workers: must be >= 1 (got 0)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from supervisor.errors import ConfigError, SupervisorError

M = TypeVar("M", bound=BaseModel)


def read_bytes(path: str | Path, *, error: type[SupervisorError], expected: str) -> bytes:
    """A file's bytes; a missing, unreadable or directory path is one line naming the file."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise error("file not found", source=str(p)) from None
    except IsADirectoryError:
        raise error(f"is a directory, expected {expected}", source=str(p)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", source=str(p)) from None


def read_yaml(path: str | Path, *, error: type[SupervisorError] = ConfigError) -> Any:
    """Parse a YAML file; syntax errors name the line and column, unreadable files say why."""
    p = Path(path)
    raw = read_bytes(p, error=error, expected="a YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", source=str(p)) from None
    if "\x00" in text:
        raise error("binary content, expected YAML text", source=str(p)) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        problem = exc.problem or "invalid YAML"
        raise error(f"YAML syntax error at {where}: {problem}", source=str(p)) from None
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML: {exc}", source=str(p)) from None


def format_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error, worded for a person."""
    err = exc.errors(include_url=False)[0]
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
        msg = f"must be {op} {bound} (got {got!r})"
    elif kind in ("literal_error", "enum"):
        msg = f"must be one of {ctx.get('expected', '?')} (got {got!r})"
    else:
        text = err["msg"]
        if text.startswith("Value error, "):
            text = text[len("Value error, ") :]
        msg = f"{text[:1].lower()}{text[1:]}"
        if got is not None and kind not in ("value_error", "assertion_error") and not isinstance(got, dict):
            msg += f" (got {_short(got)})"
    return loc, msg


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_model(
    model: type[M], path: str | Path, *, error: type[SupervisorError] = ConfigError, data: Any = None
) -> M:
    """Validate YAML ``path`` (or already-parsed ``data``) against ``model``."""
    if data is None:
        data = read_yaml(path, error=error)
    if data is None:
        raise error("file is empty", source=str(path))
    if not isinstance(data, dict):
        raise error(f"expected a mapping at the top level, got {type(data).__name__}", source=str(path))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, msg = format_validation_error(exc)
        raise error(msg, source=str(path), field=field) from None
