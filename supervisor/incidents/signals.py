"""Which signal would have caught an incident earlier: first band crossings in the stored series.

The band of each signal is robust (median and MAD of the pre-incident baseline), the same
idea as the detector's, so "grad norm left its band 7 steps before the loss did" compares
like with like.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

#: Signals scanned, in the order reports list them when they cross at the same step.
SIGNALS = ("loss", "grad_norm", "update_ratio")
_MIN_BASELINE = 8


@dataclass(frozen=True, slots=True)
class Crossing:
    """The first step at which ``signal`` (on ``rank``; None: all ranks together) left its band."""

    signal: str
    rank: int | None
    step: int
    value: float
    baseline: float
    z: float

    @property
    def label(self) -> str:
        return self.signal if self.rank is None else f"{self.signal}[rank {self.rank}]"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["label"] = self.label
        out["value"] = self.value if math.isfinite(self.value) else str(self.value)
        out["z"] = round(self.z, 2) if math.isfinite(self.z) else str(self.z)
        return out


def aggregate(series: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per-step values over ranks: stored aggregate rows where present, else the mean of the rank rows
    (max for grad norm and update ratio, where one bad rank is the story)."""
    stored = {r["step"]: r for r in series if "rank" not in r}
    per_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in series:
        if "rank" in row:
            per_step[row["step"]].append(row)
    out: dict[int, dict[str, float]] = {}
    for step in sorted(set(stored) | set(per_step)):
        if step in stored:
            out[step] = {k: v for k, v in stored[step].items() if _is_num(v)}
            continue
        rows, agg = per_step[step], {}
        for name in ("loss", "grad_norm", "update_ratio", "lr", "time", "step_time"):
            values = [float(r[name]) for r in rows if _is_num(r.get(name))]
            if values:
                agg[name] = (
                    max(values)
                    if name in ("grad_norm", "update_ratio", "time")
                    else sum(values) / len(values)
                )
        out[step] = agg
    return out


def per_rank(series: list[dict[str, Any]], signal: str) -> dict[int, dict[int, float]]:
    """{rank: {step: value}} for rows that carry a rank."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for row in series:
        if "rank" in row and _is_num(row.get(signal)):
            out[int(row["rank"])][row["step"]] = float(row[signal])
    return dict(out)


def first_crossings(
    series: list[dict[str, Any]], reference_step: int, *, z_threshold: float = 6.0
) -> list[Crossing]:
    """First band crossing of every signal after the baseline, sorted by step.

    The baseline is the older two thirds of the rows before ``reference_step`` (the incident's
    onset or first anomaly), so a signal that started to move shortly before it is still
    found rather than absorbed into its own baseline.
    """
    found: list[Crossing] = []
    agg = aggregate(series)
    for signal in SIGNALS:
        values = {step: row[signal] for step, row in agg.items() if signal in row}
        hit = _first_crossing(values, reference_step, z_threshold)
        if hit:
            found.append(Crossing(signal, None, *hit))
        for rank, by_step in sorted(per_rank(series, signal).items()):
            hit = _first_crossing(by_step, reference_step, z_threshold)
            if hit:
                found.append(Crossing(signal, rank, *hit))
    order = {name: i for i, name in enumerate(SIGNALS)}
    return sorted(found, key=lambda c: (c.step, order[c.signal], -1 if c.rank is None else c.rank))


def _first_crossing(
    values: dict[int, float], reference_step: int, z_threshold: float
) -> tuple[int, float, float, float] | None:
    steps = sorted(values)
    before = [s for s in steps if s < reference_step]
    cut = max(_MIN_BASELINE, (2 * len(before)) // 3)
    base = [values[s] for s in before[:cut] if math.isfinite(values[s])]
    if len(base) < _MIN_BASELINE:
        return None
    med = statistics.median(base)
    mad = statistics.median(abs(v - med) for v in base)
    scale = max(1.4826 * mad, 1e-6 * abs(med), 1e-12)
    baseline_end = before[cut - 1]  # len(before) >= cut whenever the baseline is large enough
    for step in (s for s in steps if s > baseline_end):
        v = values[step]
        if not math.isfinite(v):
            return step, v, med, math.inf
        z = (v - med) / scale
        # Only upward moves: a loss or grad norm that drops is not how an incident starts.
        if z > z_threshold:
            return step, v, med, z
    return None


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
