"""The telemetry record: one per rank per step (docs/sdk.md: the record each rank sends).

Only ``step`` and ``loss`` are required; every other field is optional and the analysis
uses what is there. Records travel as plain dicts (JSON objects); this module gives them a
typed, slotted form for the core and converts both ways.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

_FLOATS = ("time", "loss", "loss_sum", "batch_mean_loss", "lr", "grad_norm", "param_norm",
           "update_norm", "loss_scale", "seq_len_mean", "step_time", "tokens_per_s")  # fmt: skip
MAX_STEP = 10**12
"""Largest step a record may carry (a job's `max_steps` bound); beyond it the record is unusable."""
_INTS = ("tokens", "seq_len_max")


@dataclass(slots=True)
class Record:
    step: int
    loss: float
    rank: int = 0
    world_size: int = 1
    time: float | None = None
    loss_sum: float | None = None
    tokens: int | None = None
    batch_mean_loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    param_norm: float | None = None
    update_norm: float | None = None
    loss_scale: float | None = None
    overflow: bool | None = None
    nonfinite: bool | None = None
    nonfinite_at: str | None = None
    sources: Mapping[str, Mapping[str, float]] | None = None
    """{source: {"tokens", "loss_sum"}}: a dict, or a :class:`SourceView` when decoded from the wire."""
    samples: list[str] | None = None
    seq_len_max: int | None = None
    seq_len_mean: float | None = None
    step_time: float | None = None
    tokens_per_s: float | None = None
    param_checksum: str | None = None
    events: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def update_ratio(self) -> float | None:
        if self.update_norm is None or self.param_norm is None:
            return None
        return self.update_norm / (self.param_norm + 1e-12)

    @property
    def is_nonfinite(self) -> bool:
        """NaN/Inf flagged by the probe, or visible in loss / grad norm."""
        finite_grad = self.grad_norm is None or math.isfinite(self.grad_norm)
        return bool(self.nonfinite) or not math.isfinite(self.loss) or not finite_grad

    def get(self, name: str, default: Any = None) -> Any:
        """A field by its record-table name, read as ``dict.get`` reads a record dict: the runtime's
        bookkeeping reads records decoded from the wire (``sdk/wire.py``) and record dicts alike."""
        return getattr(self, name, default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        """Build from a JSON object; raises ValueError/TypeError/KeyError on unusable input."""
        try:
            return cls._from_dict(d)
        except OverflowError as exc:  # int(inf), float(10**400): unusable like any other bad value
            raise ValueError(str(exc)) from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> Record:
        kw: dict[str, Any] = {"step": int(d["step"]), "loss": float(d["loss"])}
        if not -MAX_STEP <= kw["step"] <= MAX_STEP:  # 1e30 is no step; it would size ranges downstream
            raise ValueError(f"step {kw['step']} is out of range")
        for name in _FLOATS:
            v = d.get(name)
            if v is not None and name not in kw:
                kw[name] = float(v)
        for name in (*_INTS, "rank", "world_size"):
            v = d.get(name)
            if v is not None:
                kw[name] = int(v)
        for name in ("overflow", "nonfinite"):
            v = d.get(name)
            if v is not None:
                kw[name] = _as_bool(v)
        for name in ("nonfinite_at", "param_checksum"):
            v = d.get(name)
            if v is not None and v != "":
                kw[name] = str(v)
        if isinstance(d.get("sources"), dict):
            # Only numbers survive: a hostile `"tokens": "many"` must not reach the summaries.
            kw["sources"] = {
                str(k): {kk: float(vv) for kk, vv in v.items() if _is_number(vv)}
                for k, v in d["sources"].items()
                if isinstance(v, dict)
            }
        if isinstance(d.get("samples"), list):
            kw["samples"] = [str(s) for s in d["samples"]]
        if isinstance(d.get("events"), list):
            kw["events"] = [str(e) for e in d["events"]]
        if isinstance(d.get("attrs"), dict):
            kw["attrs"] = dict(d["attrs"])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict without absent (None / empty) fields."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        out = {k: v for k, v in values if v is not None and (v or k not in ("events", "attrs"))}
        if type(out.get("sources")) is SourceView:
            out["sources"] = out["sources"].as_dict()
        return out


class SourceView(Mapping[str, Mapping[str, float]]):
    """One record's sources read from a decoded batch's shared columns (``sdk/wire.py``), so that a
    batch of a thousand records builds no dict per record and per source: a mapping equal to the
    ``{source: {"tokens": t, "loss_sum": s}}`` dict the record was sent with, whose values are built
    when read. :func:`add_sources` sums a step's views straight from the columns."""

    __slots__ = ("_names", "_index", "_tokens", "_loss_sum", "_start", "_end")

    def __init__(self, names: Sequence[str], index: Sequence[int], tokens: Sequence[float],
                 loss_sum: Sequence[float], start: int, end: int) -> None:  # fmt: skip
        self._names, self._index, self._tokens, self._loss_sum = names, index, tokens, loss_sum
        self._start, self._end = start, end

    def __getitem__(self, name: str) -> Mapping[str, float]:
        for i in reversed(range(self._start, self._end)):  # a name twice: the last counts, as in a dict
            if self._names[self._index[i]] == name:
                return {"tokens": self._tokens[i], "loss_sum": self._loss_sum[i]}
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        names, index = self._names, self._index
        return (names[index[i]] for i in range(self._start, self._end))

    def __len__(self) -> int:
        return self._end - self._start

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The plain dict the record was sent with."""
        return {name: dict(part) for name, part in self.items()}

    def __repr__(self) -> str:
        return repr(self.as_dict())


def add_sources(acc: dict[str, list[float]], sources: Mapping[str, Mapping[str, float]]) -> None:
    """Add one record's per-source tokens and loss sums into ``acc`` ({name: [tokens, loss_sum]}),
    names in the record's order; a missing or empty value counts 0."""
    if type(sources) is SourceView:
        names, index, tokens, loss_sum = sources._names, sources._index, sources._tokens, sources._loss_sum
        for i in range(sources._start, sources._end):
            name = names[index[i]]
            a = acc.get(name)
            if a is None:
                a = acc[name] = [0.0, 0.0]
            a[0] += tokens[i] or 0.0
            a[1] += loss_sum[i] or 0.0
        return
    for name, part in sources.items():
        a = acc.get(name)
        if a is None:
            a = acc[name] = [0.0, 0.0]
        a[0] += part.get("tokens") or 0.0
        a[1] += part.get("loss_sum") or 0.0


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, float) or (isinstance(v, int) and abs(v) < 2**63)


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "y", "t")
    return bool(v)
