"""Plots of the telemetry around an incident, as PNG bytes (matplotlib, headless Agg backend).

Each panel marks the incident's landmarks the same way: onset (red), first abnormal step
(orange, dotted), detection (purple), rollback target (green), excluded data (grey band),
observation window (blue band), non-finite steps (black ticks).
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # never a GUI backend: the supervisor runs headless
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from supervisor.incidents.postmortem import Markers, Postmortem  # noqa: E402
from supervisor.incidents.signals import aggregate, per_rank  # noqa: E402

PANELS = (
    ("loss", "Loss per rank", False),
    ("grad_norm", "Grad norm (before clipping)", True),
    ("update_ratio", "Update ratio ‖Δθ‖ / ‖θ‖", True),
    ("lr", "Learning rate", False),
)


def plot_panels(pm: Postmortem, *, dpi: int = 90) -> list[tuple[str, bytes]]:
    """(title, PNG) for every panel that has data; an incident without a series gets none."""
    out = []
    for signal, title, log_scale in PANELS:
        png = _panel(pm.series, pm.replayed, signal, title, log_scale, pm.markers, dpi)
        if png is not None:
            out.append((title, png))
    return out


def _panel(
    series: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    signal: str,
    title: str,
    log_scale: bool,
    m: Markers,
    dpi: int,
) -> bytes | None:
    ranks = per_rank(series, signal)
    agg = {s: row[signal] for s, row in aggregate(series).items() if signal in row}
    if not ranks and not agg:
        return None
    fig, ax = plt.subplots(figsize=(11, 3.2), dpi=dpi)
    try:
        if ranks and signal != "lr":
            for rank, values in sorted(ranks.items()):
                first = rank == m.first_rank
                _line(
                    ax, values, label=f"rank {rank}" + (" (first)" if first else ""), lw=2.2 if first else 1.0
                )
        else:
            _line(ax, agg, label="all ranks", lw=1.4)
        for replay in sorted({r["replay"] for r in replayed}):
            rows = [r for r in replayed if r["replay"] == replay]
            again = {s: row[signal] for s, row in aggregate(rows).items() if signal in row}
            if again:
                _line(ax, again, label=f"after rollback {replay}", lw=1.2, style="--", color="black")
        positive = [v for vals in (list(ranks.values()) or [agg]) for v in vals.values() if math.isfinite(v)]
        if log_scale and positive and min(positive) > 0:
            ax.set_yscale("log")
        _mark(
            ax,
            m,
            [s for vals in (list(ranks.values()) or [agg]) for s, v in vals.items() if not math.isfinite(v)],
        )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _line(
    ax: Axes, values: dict[int, float], *, label: str, lw: float, style: str = "-", color: str | None = None
) -> None:
    steps = sorted(values)
    ys = [values[s] if math.isfinite(values[s]) else math.nan for s in steps]
    ax.plot(steps, ys, style, label=label, lw=lw, color=color)


def _mark(ax: Axes, m: Markers, nonfinite_steps: list[int]) -> None:
    if m.onset_step is not None:
        ax.axvline(m.onset_step, color="red", lw=1.2, label=f"onset {m.onset_step}")
    if m.first_step is not None and m.first_step != m.onset_step:
        ax.axvline(m.first_step, color="orange", ls=":", lw=1.2, label=f"first anomaly {m.first_step}")
    if m.detected_step is not None:
        ax.axvline(m.detected_step, color="purple", ls="--", lw=1.0, label=f"detected {m.detected_step}")
    if m.rollback_to is not None:
        ax.axvline(m.rollback_to, color="green", lw=1.2, label=f"rollback target {m.rollback_to}")
    for i, (a, b) in enumerate(m.excluded):
        ax.axvspan(a, b, color="grey", alpha=0.25, label="excluded data" if i == 0 else None)
    if m.observation is not None:
        ax.axvspan(*m.observation, color="tab:blue", alpha=0.12, label="observation window")
    for i, step in enumerate(sorted(set(nonfinite_steps))):
        ax.axvline(step, color="black", lw=0.6, ymax=0.08, label="non-finite" if i == 0 else None)
