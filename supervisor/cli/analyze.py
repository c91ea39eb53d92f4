"""`supervisor analyze TRACE...`: offline detection and diagnosis of a trace or a training log.

Read (any format in ``supervisor.traces.ALL_FORMATS``; one file, a run directory, or several
files of one run such as one per rank), analyze with the same streaming engine the supervisor
runs online, print (a table per incident, or the JSON contract), plot if asked. ``--fail-on``
turns a finding into exit code 1 (for CI and scripts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from supervisor.cli.output import console, json_option, print_json
from supervisor.core.analysis import AnalysisResult, analyze_records
from supervisor.core.detect import DetectorSettings
from supervisor.core.model import Diagnosis, Severity
from supervisor.core.records import Record
from supervisor.errors import ConfigError
from supervisor.traces import ALL_FORMATS, FieldMap, read_run

EXIT_FOUND = 1


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_option
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot here."
)
@click.option(
    "--format",
    "fmt",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", *ALL_FORMATS]),
    help="Trace format.",
)
@click.option(
    "--map",
    "maps",
    multiple=True,
    metavar="FIELD=NAME",
    help="Read a trace field from this TensorBoard tag / W&B or Lightning column (repeatable), e.g. loss=train/my_loss.",
)
@click.option(
    "--fail-on",
    type=click.Choice([s.value for s in Severity]),
    default=None,
    help="Exit 1 when an incident of this severity or higher is found (0 otherwise; 2 bad input).",
)
@click.option(
    "--min-history",
    type=click.IntRange(2, 10**12),
    default=None,
    help="Steps of history before an alarm (default 50, lowered automatically for short log excerpts).",
)
def analyze(
    traces: tuple[Path, ...],
    as_json: bool,
    plot_path: Path | None,
    fmt: str,
    min_history: int | None,
    maps: tuple[str, ...],
    fail_on: str | None,
) -> None:
    """Find and diagnose loss spikes in TRACES: one run, as a file, a directory, or one file per rank.

    Formats: JSONL/CSV traces, Megatron, nanoGPT/llm.c, modded-nanogpt, HF trainer_state.json,
    TensorBoard event files, W&B history exports (CSV/JSON), Lightning CSVLogger metrics.csv.
    """
    data = read_run(list(traces), fmt, FieldMap.parse(maps))
    settings, note = settings_for(data.records, min_history)
    result = analyze_records(data.records, settings)
    result.skipped_lines = data.skipped_lines
    if plot_path is not None:
        plot(data.records, result, plot_path)
    if as_json:
        print_json(result.to_json())
    else:
        render(result, data.format, len(data.records), [*data.notes, *([note] if note else [])])
    if fail_on is not None:
        bar = Severity(fail_on).rank
        if any(d.severity.rank >= bar for d in result.incidents):
            raise SystemExit(EXIT_FOUND)


def settings_for(records: list[Record], min_history: int | None) -> tuple[DetectorSettings, str | None]:
    """Default settings, except that a short excerpt gets a min_history it can actually satisfy.

    Logbooks paste a handful of iterations around an event; with the online default of 50 steps
    nothing could ever be flagged. A quarter of the longest unbroken run (at least 2) is used
    instead, and the output says so: robust statistics over so few steps are indicative only.
    """
    default = DetectorSettings()
    if min_history is not None:
        return DetectorSettings(min_history=min(min_history, default.window)), None
    run = longest_run(sorted({r.step for r in records}))
    if run // 4 >= default.min_history:
        return default, None
    lowered = max(2, run // 4)
    note = f"short excerpt (longest unbroken run {run} steps): min_history lowered from {default.min_history} to {lowered}"
    return DetectorSettings(min_history=lowered), note


def longest_run(steps: list[int]) -> int:
    """Length of the longest run of steps at a steady logging interval (a gap breaks the run)."""
    if not steps:
        return 0
    gaps = sorted(b - a for a, b in zip(steps, steps[1:], strict=False))
    usual = gaps[len(gaps) // 2] if gaps else 1
    best = cur = 1
    for a, b in zip(steps, steps[1:], strict=False):
        cur = cur + 1 if b - a <= 2 * usual else 1
        best = max(best, cur)
    return best


def render(result: AnalysisResult, fmt: str, n_records: int, notes: list[str]) -> None:
    out = console(full=True)
    out.print(
        f"[bold]{len(result.incidents)} incident(s)[/bold], {len(result.benign_shifts)} benign shift(s) "
        f"in {n_records} records ({fmt}); {result.skipped_lines} lines skipped"
    )
    for note in notes[:10]:
        out.print(f"[dim]note: {note}[/dim]")
    for i, d in enumerate(result.incidents, 1):
        out.print(_incident_table(i, d))
        out.print(_cause_table(d))
    for b in result.benign_shifts:
        src = f" (source `{b.source}`)" if b.source else ""
        out.print(f"[green]benign shift[/green] at step {b.step}{src}: {b.note}")


_COLOR = {"low": "cyan", "medium": "yellow", "high": "red", "critical": "bold red"}


def _incident_table(i: int, d: Diagnosis) -> Table:
    sev = d.severity.value
    t = Table(
        title=f"incident {i}: {d.phenotype.value} [{_COLOR[sev]}]{sev}[/]",
        show_header=False,
        title_justify="left",
    )
    t.add_column("field", style="bold")
    t.add_column("value")
    end = "open" if d.end_step is None else str(d.end_step)
    t.add_row("steps", f"onset {d.onset_step}, peak {d.peak_step}, end {end} (detected at {d.detected_step})")
    if d.period:
        t.add_row("period", f"{d.period} steps")
    fa = d.first_anomaly
    if fa is not None:
        where = f" on rank {fa.rank}" if fa.rank is not None else ""
        val = f" = {fa.value:.4g}" if fa.value is not None else ""
        base = f" (level {fa.baseline:.4g}, z {fa.z})" if fa.baseline is not None else ""
        t.add_row("first anomaly", f"{fa.metric}{where} at step {fa.step}{val}{base}")
    attrs = d.attributes
    if attrs:
        detail = []
        if d.nonfinite:
            detail.append(f"nonfinite at {d.nonfinite_at}")
        if d.rank_local:
            detail.append(f"rank_local (first rank {d.first_rank})")
        if d.after_resume:
            detail.append("after_resume")
        if d.source_local:
            detail.append(f"source_local ({d.source_local})")
        t.add_row("attributes", ", ".join(detail))
    if d.suspect_samples:
        more = f" (+{len(d.suspect_samples) - 5} more)" if len(d.suspect_samples) > 5 else ""
        t.add_row("suspect samples", ", ".join(d.suspect_samples[:5]) + more)
    return t


def _cause_table(d: Diagnosis) -> Table:
    t = Table(show_header=True, header_style="bold")
    t.add_column("cause")
    t.add_column("score", justify="right")
    t.add_column("evidence")
    for c in d.causes:
        t.add_row(c.cause.value, f"{c.score:.2f}", "\n".join(c.evidence))
    return t


def plot(records: list[Record], result: AnalysisResult, path: Path) -> None:
    """Loss per rank (or global) and grad norm, with onset, peak and suspect steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_rank: dict[int, tuple[list[int], list[float]]] = {}
    grad: dict[int, float] = {}
    for r in records:
        xs, ys = by_rank.setdefault(r.rank, ([], []))
        xs.append(r.step)
        ys.append(r.loss)
        if r.grad_norm is not None:
            grad[r.step] = r.grad_norm
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(11, 6.5))
    many = len(by_rank) > 16
    for rank, (xs, ys) in sorted(by_rank.items())[:64]:
        ax1.plot(xs, ys, lw=0.8, alpha=0.4 if many else 0.9, label=None if many else f"rank {rank}")
    ax1.set_ylabel("loss")
    if grad:
        steps = sorted(grad)
        ax2.plot(steps, [grad[s] for s in steps], lw=0.8, color="tab:purple")
        ax2.set_yscale("log")
    ax2.set_ylabel("grad norm")
    ax2.set_xlabel("step")
    last_step = max((r.step for r in records), default=0)
    for d in result.incidents:
        _mark(ax1, ax2, d)
        if d.period:  # the later occurrences of a periodic incident
            for k in range(1, min((last_step - d.onset_step) // d.period, 500) + 1):  # bounded: hostile steps
                ax1.axvline(d.onset_step + k * d.period, color="tab:orange", ls="--", lw=0.6, alpha=0.6)
    if not many and len(by_rank) > 1:
        ax1.legend(loc="upper right", fontsize=7)
    ax1.set_title(f"{len(result.incidents)} incident(s)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:  # an unwritable path or a value matplotlib cannot place
        raise ConfigError(
            f"cannot write the plot: {getattr(exc, 'strerror', None) or exc}", source=str(path)
        ) from None
    finally:
        plt.close(fig)


def _mark(ax1: Any, ax2: Any, d: Diagnosis) -> None:
    for ax in (ax1, ax2):
        ax.axvline(d.onset_step, color="tab:orange", ls="--", lw=1)
        ax.axvline(d.peak_step, color="tab:red", ls=":", lw=1)
    label = f"{d.phenotype.value} / {d.top_cause.value if d.top_cause else '?'}"
    ax1.annotate(
        label, (d.onset_step, 1.0), xycoords=("data", "axes fraction"), fontsize=8, va="top", color="tab:red"
    )
    if d.suspect_samples and d.first_anomaly is not None:
        ax1.annotate(
            f"suspects: {d.suspect_samples[0]}" + (" ..." if len(d.suspect_samples) > 1 else ""),
            (d.first_anomaly.step, 0.9),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="tab:gray",
        )
