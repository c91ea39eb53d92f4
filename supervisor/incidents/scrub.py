"""Keep raw sample text out of the incident store.

Records hold sample IDs only (docs/sdk.md), but the store is the one place that
outlives a run and gets shared with people, so it defends itself: telemetry windows keep a
whitelist of numeric fields, and payloads lose any key that names text content.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from supervisor.core.records import Record, SourceView

#: Fields of a telemetry record kept in an incident's series (all numeric or flags).
SERIES_FIELDS = (
    "step", "rank", "world_size", "time", "loss", "loss_sum", "tokens", "batch_mean_loss", "lr",
    "grad_norm", "param_norm", "update_norm", "update_ratio", "loss_scale", "overflow", "nonfinite",
    "seq_len_max", "seq_len_mean", "step_time", "tokens_per_s",
)  # fmt: skip

#: Payload keys that would hold raw text; dropped wherever they appear.
TEXT_KEYS = frozenset(
    {
        "text",
        "sample_text",
        "raw_text",
        "raw",
        "content",
        "prompt",
        "completion",
        "document",
        "decoded",
        "input_text",
    }
)

_MAX_LABEL = 80


def _whole(value: Any) -> int | None:
    """A whole number in SQLite's 64-bit range (an integral float counts), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    whole = int(value)
    return whole if -(2**63) <= whole < 2**63 else None


_WHOLES = frozenset(("rank", "world_size", "tokens", "seq_len_max"))


def series_row(record: Mapping[str, Any] | Record) -> dict[str, Any] | None:
    """The storable part of one record (a record dict, an aggregate row, or a ``Record``, read
    field by field without building its dict); None when it has no usable step."""
    get = record.get
    step = _whole(get("step"))
    if step is None:  # missing, 1e400, "x", 2**70: no row (SQLite keys are 64-bit)
        return None
    out: dict[str, Any] = {"step": step}
    for name in SERIES_FIELDS[1:]:
        value = get(name)
        if value is None:
            continue
        # A float outside the whole-number fields (the common case) is kept as float(value) gives it.
        if (type(value) is float and name not in _WHOLES) or isinstance(value, bool):
            out[name] = value
        elif name in _WHOLES:
            if type(value) is int and -(2**63) <= value < 2**63:
                out[name] = value
            elif (whole := _whole(value)) is not None:
                out[name] = whole
        elif isinstance(value, int | float):
            try:
                out[name] = float(value)
            except OverflowError:  # an int past float's range
                continue
    if "update_ratio" not in out and "update_norm" in out and "param_norm" in out:
        out["update_ratio"] = out["update_norm"] / (out["param_norm"] + 1e-12)
    sources = get("sources")
    if isinstance(sources, dict | SourceView):  # a decoded record's sources: a view of the same dict
        out["sources"] = {
            str(name)[:_MAX_LABEL]: {
                k: float(v) for k, v in split.items() if k in ("tokens", "loss_sum") and _num(v)
            }
            for name, split in sources.items()
            if isinstance(split, dict)
        }
    events = record.get("events")
    if isinstance(events, list):
        out["events"] = [e for e in events if isinstance(e, str) and len(e) <= _MAX_LABEL]
    return out


def payload(obj: Any, dropped: list[str] | None = None, path: str = "") -> Any:
    """A copy of ``obj`` without text-content keys; their dotted paths are appended to ``dropped``."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key).lower() in TEXT_KEYS:
                if dropped is not None:
                    dropped.append(where)
                continue
            out[str(key)] = payload(value, dropped, where)
        return out
    if isinstance(obj, list | tuple):
        return [payload(v, dropped, f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
