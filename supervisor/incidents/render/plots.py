"""Plots of the telemetry around an incident, as PNG bytes (matplotlib, headless Agg backend).

Each panel marks the incident's landmarks the same way: onset (red), first abnormal step
(orange, dotted), detection (purple), rollback target (green), excluded data (grey band),
observation window (blue band), non-finite steps (black ticks). After a rollback the steps
past the target are drawn dashed and faded (the abandoned timeline) under the new timeline
the run trained instead, and each observation criterion is drawn as a dash-dot line over the
window (green: passed, red: failed). A rank-local incident gets a line per rank, its first
rank in bold red.
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # never a GUI backend: the supervisor runs headless
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from supervisor.incidents.postmortem import Markers, Postmortem  # noqa: E402
from supervisor.incidents.signals import aggregate, per_rank  # noqa: E402

PANELS = (
    ("loss", "Loss", False),
    ("grad_norm", "Grad norm (before clipping)", True),
    ("update_ratio", "Update ratio ‖Δθ‖ / ‖θ‖", True),
    ("lr", "Learning rate", False),
)
#: Ranks drawn one by one for a rank-local incident (the first rank always among them).
MAX_RANK_LINES = 8
_NEW = ("tab:blue", "tab:green", "tab:purple")


def plot_panels(pm: Postmortem, *, dpi: int = 90) -> list[tuple[str, bytes]]:
    """(title, PNG) for every panel that has data; an incident without a series gets none."""
    out = []
    for signal, title, log_scale in PANELS:
        fig = panel_figure(pm, signal, title, log_scale, dpi=dpi)
        if fig is None:
            continue
        try:
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            out.append((title, buf.getvalue()))
        finally:
            plt.close(fig)
    return out


def panel_figure(pm: Postmortem, signal: str, title: str, log_scale: bool, *, dpi: int = 90) -> Figure | None:
    """One panel as a matplotlib figure (the caller closes it); None when the signal has no data."""
    return _panel(pm.series, pm.replayed, signal, title, log_scale, pm.markers, dpi)


PLOT_LIMIT = 1e100
"""Values beyond +-1e100 are drawn as off-scale markers, like NaN: a 1e308 point made
matplotlib's axis transform singular (LinAlgError), and it would flatten every other point."""


def _plottable(v: float) -> bool:
    return math.isfinite(v) and abs(v) <= PLOT_LIMIT


def _values(rows: list[dict[str, Any]], signal: str) -> dict[int, float]:
    return {s: row[signal] for s, row in aggregate(rows).items() if signal in row}


def _split(values: dict[int, float], cut: int | None) -> tuple[dict[int, float], dict[int, float]]:
    """(kept, abandoned): steps after a rollback target were trained again on a new timeline."""
    if cut is None:
        return values, {}
    return {s: v for s, v in values.items() if s <= cut}, {s: v for s, v in values.items() if s >= cut}


def _rank_lines(series: list[dict[str, Any]], signal: str, m: Markers) -> dict[int, dict[int, float]]:
    """Per-rank lines for a rank-local incident: the first rank and a few others."""
    if not m.rank_local or signal == "lr":
        return {}
    ranks = per_rank(series, signal)
    if len(ranks) < 2:
        return {}
    chosen = sorted(ranks)[: MAX_RANK_LINES - 1]
    if m.first_rank is not None and m.first_rank in ranks and m.first_rank not in chosen:
        chosen.append(m.first_rank)
    return {r: ranks[r] for r in sorted(chosen)}


def _panel(
    series: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    signal: str,
    title: str,
    log_scale: bool,
    m: Markers,
    dpi: int,
) -> Figure | None:
    agg = _values(series, signal)
    ranks = _rank_lines(series, signal, m)
    if not ranks and not agg:
        return None
    cut = m.rollback_to if replayed or m.rollback_to is not None else None
    fig, ax = plt.subplots(figsize=(11, 3.4), dpi=dpi)
    try:
        drawn: list[dict[int, float]] = []
        if ranks:
            abandoned_label: str | None = "abandoned timeline (dashed)"
            for rank, values in ranks.items():
                first = rank == m.first_rank
                kept, gone = _split(values, cut)
                label = f"rank {rank}" + (" (first)" if first else "")
                color = _line(
                    ax, kept, label=label, lw=2.0 if first else 0.9, color="tab:red" if first else None
                )
                _line(
                    ax,
                    gone,
                    label=abandoned_label if gone else None,
                    lw=0.9,
                    style="--",
                    color=color,
                    alpha=0.45,
                )
                abandoned_label = None if gone else abandoned_label
                drawn.append(values)
        else:
            kept, gone = _split(agg, cut)
            _line(ax, kept, label="all ranks", lw=1.4, color="tab:gray" if gone else None)
            _line(
                ax,
                gone,
                label="abandoned timeline" if gone else None,
                lw=1.2,
                style="--",
                color="tab:gray",
                alpha=0.6,
            )
            drawn.append(agg)
        for i, replay in enumerate(sorted({r["replay"] for r in replayed})):
            rows = [r for r in replayed if r["replay"] == replay]
            again = _values(rows, signal)
            if again:
                label = "new timeline" + (
                    f" (after rollback {replay})" if replay > 1 else " (after the rollback)"
                )
                _line(ax, again, label=label, lw=1.6, color=_NEW[i % len(_NEW)])
                drawn.append(again)
        positive = [v for vals in drawn for v in vals.values() if _plottable(v)]
        if log_scale and positive and min(positive) > 0:
            ax.set_yscale("log")
        _mark(ax, m, [s for vals in drawn for s, v in vals.items() if not _plottable(v)], bool(replayed))
        threshold = m.thresholds.get(signal)
        if threshold is not None and m.observation is not None:
            color = "tab:green" if threshold.ok else "tab:red"
            verdict = "passed" if threshold.ok else "FAILED"
            ax.hlines(threshold.value, *m.observation, colors=color, linestyles="-.", lw=1.4,
                      label=f"{threshold.label}: {verdict}")  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
        return fig
    except BaseException:
        plt.close(fig)
        raise


def _line(
    ax: Axes,
    values: dict[int, float],
    *,
    label: str | None,
    lw: float,
    style: str = "-",
    color: str | None = None,
    alpha: float = 1.0,
) -> str | None:
    """Draw a line (non-finite values leave gaps); returns its color."""
    if not values:
        return color
    steps = sorted(values)
    ys = [values[s] if _plottable(values[s]) else math.nan for s in steps]
    (line,) = ax.plot(steps, ys, style, label=label, lw=lw, color=color, alpha=alpha)
    return str(to_hex(line.get_color()))


def _mark(ax: Axes, m: Markers, nonfinite_steps: list[int], new_timeline: bool) -> None:
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
        where = " (new timeline)" if new_timeline else ""
        ax.axvspan(*m.observation, color="tab:blue", alpha=0.10, label=f"observation window{where}")
    for i, step in enumerate(sorted(set(nonfinite_steps))):
        ax.axvline(step, color="black", lw=0.6, ymax=0.08, label="non-finite" if i == 0 else None)
