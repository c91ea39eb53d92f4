"""Metric names -> trace fields, for logs that store named scalars (TensorBoard, W&B, Lightning).

Every logger names the same quantity differently (``train/loss``, ``train_loss_step``,
``lm loss``, ``loss_metrics/global_avg_loss``...). ``FieldMap`` holds, per trace field, the
names it answers to in order of preference; ``--map FIELD=NAME`` puts a name of the user's in
front. Names are compared normalized (lower case; ``-``, ``.``, blanks and ``/`` treated alike),
so ``Train/Loss`` matches ``train_loss``. When no listed name fits the loss, the training-looking
column that ends in ``loss`` is taken (never a val/eval/test one), and the note says so.

``rows_to_records`` merges rows that share a step (loggers write one row per ``log`` call:
a Lightning row may hold only ``val_loss``) and keeps steps that have a finite-or-not loss.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.core.records import Record
from supervisor.errors import TraceError

#: Per field, the metric names it answers to, most specific first (documented in docs/detection.md).
DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "loss": (
        "train/loss",
        "train_loss_step",
        "train_loss",
        "train/loss_step",
        "loss/train",
        "training_loss",
        "train/ce_loss",
        "train/ce loss",
        "lm loss",
        "lm_loss",
        "loss_metrics/global_avg_loss",
        "loss",
    ),
    "grad_norm": (
        "train/grad_norm",
        "grad_norm",
        "grad-norm",
        "gradient_norm",
        "optim/total grad norm",
        "grad_norm/total",
        "train/gradient_norm",
        "grad_norm_step",
    ),
    "lr": (
        "train/learning_rate",
        "learning_rate",
        "learning-rate",
        "lr",
        "train/lr",
        "optim/lr (group 0)",
        "lr-adamw",
        "lr-adam",
        "lr-sgd",
        "lr/group0",
        "lr_0",
    ),
    "loss_scale": ("loss-scale", "loss_scale", "train/loss_scale", "grad_scale"),
    "tokens": ("tokens", "train/tokens", "num_tokens", "ntokens"),
    "update_norm": ("update_norm", "train/update_norm"),
    "param_norm": ("param_norm", "train/param_norm", "weight_norm"),
    "step_time": ("iteration-time", "step_time", "train/step_time", "time/step", "batch_time"),
    "tokens_per_s": ("tokens_per_s", "throughput/tokens_per_s", "train/tokens_per_second", "tps"),
}

#: Step columns, most specific first.
STEP_NAMES = ("trainer/global_step", "global_step", "_step", "step", "iteration", "iter")

_NOT_TRAIN = re.compile(r"(^|[/_ ])(val|valid|validation|eval|test|dev)([/_ ]|$)")


def norm(name: str) -> str:
    return re.sub(r"[-./ ]+", "/", name.strip().lower()).replace("_", "/")


@dataclass(slots=True)
class FieldMap:
    """Which column/tag feeds which trace field; ``overrides`` (field -> name) win."""

    overrides: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, pairs: Iterable[str], source: str = "--map") -> FieldMap:
        """``["loss=my/loss", ...]``; an unknown field or a missing ``=`` is a TraceError."""
        out: dict[str, str] = {}
        for p in pairs:
            key, sep, name = p.partition("=")
            key = key.strip()
            if not sep or not name.strip():
                raise TraceError(f"expected FIELD=NAME, got {p!r}", source=source)
            if key not in DEFAULT_NAMES:
                raise TraceError(f"unknown field {key!r}; valid: {', '.join(DEFAULT_NAMES)}", source=source)
            out[key] = name.strip()
        return cls(out)

    def resolve(self, columns: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """(field -> column, notes). Raises nothing: a missing loss is the caller's to report."""
        cols = list(dict.fromkeys(columns))
        by_norm: dict[str, str] = {}
        for c in cols:
            by_norm.setdefault(norm(c), c)
        chosen: dict[str, str] = {}
        notes: list[str] = []
        for fld, names in DEFAULT_NAMES.items():
            want = [self.overrides[fld]] if fld in self.overrides else list(names)
            hit = next((by_norm[norm(n)] for n in want if norm(n) in by_norm), None)
            if hit is None and fld in self.overrides:
                notes.append(f"--map {fld}={self.overrides[fld]}: no such column/tag")
            if hit is not None:
                chosen[fld] = hit
        if "loss" not in chosen and "loss" not in self.overrides:
            guess = _guess_loss(cols)
            if guess is not None:
                chosen["loss"] = guess
                notes.append(
                    f"loss read from {guess!r} (no standard loss name; override with --map loss=NAME)"
                )
        return chosen, notes


def _guess_loss(cols: list[str]) -> str | None:
    cands = [c for c in cols if norm(c).endswith("loss") and not _NOT_TRAIN.search(c.lower())]
    cands.sort(key=lambda c: (0 if "train" in c.lower() else 1, len(c)))
    return cands[0] if cands else None


def rows_to_records(
    rows: Iterable[tuple[int, Mapping[str, float]]], chosen: Mapping[str, str], rank: int = 0
) -> list[Record]:
    """Merge rows by step (later values win) into records; steps without a loss are dropped."""
    merged: dict[int, dict[str, float]] = {}
    for step, vals in rows:
        slot = merged.setdefault(step, {})
        for fld, col in chosen.items():
            v = vals.get(col)
            if v is not None:
                slot[fld] = v
    out: list[Record] = []
    for step in sorted(merged):
        vals = merged[step]
        if "loss" not in vals:
            continue
        rec = Record(step=step, loss=vals["loss"], rank=rank)
        for fld, v in vals.items():
            if fld == "loss":
                continue
            if fld == "tokens":
                rec.tokens = int(v) if math.isfinite(v) else None
            else:
                setattr(rec, fld, v)
        out.append(rec)
    return out


def to_float(value: object) -> float | None:
    """A cell as a float (``NaN``/``inf`` included); None for empty cells, text and booleans."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        try:
            return float(s)
        except ValueError:
            return None
    return None
