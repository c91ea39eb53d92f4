"""The live terminal view of a supervised job (what `supervisor launch` shows in the foreground)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from supervisor.observability.time_lost import run_words

_PHASE_STYLE = {"running": "green", "incident": "bold yellow", "restarting": "yellow", "finished": "bold green",
                "escalated": "bold red", "failed": "bold red", "stopped": "magenta", "starting": "cyan"}  # fmt: skip


def _num(v: Any, fmt: str = ".4g") -> str:
    return "-" if v is None else format(v, fmt)


def render_table(st: dict[str, Any]) -> Table:
    """One status snapshot as a two-column table."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    phase = st.get("phase", "?")
    t.add_row("job", f"{st.get('job')}  [{_PHASE_STYLE.get(phase, 'white')}]{phase}[/]  ({st.get('mode')})")
    t.add_row("loss", _num(st.get("loss")))
    t.add_row("grad norm", _num(st.get("grad_norm")))
    t.add_row("tokens/s", _num(st.get("tokens_per_s"), ",.0f"))
    t.add_row("lr", _num(st.get("lr"), ".3g"))
    ranks, full = st.get("world_size"), st.get("num_workers")
    fewer = (
        f", {ranks} of {full} ranks"
        if isinstance(ranks, int) and isinstance(full, int) and ranks < full
        else ""
    )
    t.add_row("workers", f"generation {st.get('generation')}, restarts {st.get('group_restarts')}{fewer}"
                         + ("  [yellow]frozen[/]" if st.get("frozen") else ""))  # fmt: skip
    inc = st.get("incident")
    if inc:
        t.add_row("incident", f"[yellow]#{inc['id']}[/] {inc.get('phenotype')} (rule {inc.get('rule')}): "
                              f"action [bold]{inc.get('action')}[/] {inc.get('progress')}")  # fmt: skip
    else:
        t.add_row("incident", f"none open ({st.get('incidents_total', 0)} so far)")
    lost = run_words(st.get("time_lost"))
    if lost:
        t.add_row("time lost", lost)
    if st.get("reason"):
        t.add_row("outcome", str(st["reason"]))
    return t


def follow(
    poll: Callable[[], dict[str, Any]], console: Console | None = None, interval_s: float = 0.5
) -> dict[str, Any]:
    """Show the job live until it reaches a terminal phase; returns the last status."""
    console = console or Console()
    progress = Progress(
        TextColumn("step"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )
    st = poll()
    task = progress.add_task("train", total=st.get("max_steps") or 1)
    with Live(Group(progress, render_table(st)), console=console, refresh_per_second=4) as live:
        while True:
            progress.update(task, completed=st.get("step") or 0)
            live.update(Group(progress, render_table(st)))
            if st.get("terminal"):
                return st
            time.sleep(interval_s)
            st = poll()
