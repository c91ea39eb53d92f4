"""`supervisor drill`: inject each fault into a real run and check what the supervisor did."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from supervisor.cli.output import console, json_option, print_json


@click.command()
@click.argument("names", nargs=-1)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and fault kinds, run nothing.")
@click.option(
    "--dir",
    "scenario_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Scenario directory (default: examples/drills).",
)
@click.option(
    "--out",
    "out_dir",
    default="runs/drills",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where runs, reports and the clean-loss cache go.",
)
@json_option
def drill(
    names: tuple[str, ...], list_only: bool, scenario_dir: Path | None, out_dir: Path, as_json: bool
) -> None:
    """Run fire drills NAMES (default: all) on a local Ray; exit code 1 when any drill fails."""
    from supervisor.drills.scenario import SCENARIO_DIR, find_scenarios

    scenarios = find_scenarios(list(names), scenario_dir or SCENARIO_DIR)
    if list_only:
        _list(scenarios, as_json)
        return
    from supervisor.drills.runner import DrillResult, run_drills

    out = console()

    def progress(r: DrillResult) -> None:
        if not as_json:
            mark = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
            out.print(f"{mark} {r.name} ({r.wall_s:.0f}s)")

    if as_json:
        # Ray's driver prints cluster errors (e.g. "a worker died" in the worker_kill drill) to
        # stdout from a background thread; keep stdout for the JSON document alone.
        with contextlib.redirect_stdout(sys.stderr):
            results = run_drills(scenarios, out_dir=out_dir, on_result=progress)
    else:
        results = run_drills(scenarios, out_dir=out_dir, on_result=progress)
    if as_json:
        print_json({"passed": all(r.passed for r in results), "drills": [r.to_json() for r in results]})
    else:
        out.print(_table(results))
    sys.exit(0 if all(r.passed for r in results) else 1)


def _list(scenarios: list[Any], as_json: bool) -> None:
    from supervisor.drills.faults import describe
    from supervisor.drills.specs import FAULT_KINDS

    rows = [{"name": s.name, "faults": [describe(f) for f in s.faults], "description": s.scenario.description}
            for s in scenarios]  # fmt: skip
    kinds = [{"kind": k.name, "summary": k.summary} for k in FAULT_KINDS.values()]
    if as_json:
        print_json({"scenarios": rows, "fault_kinds": kinds})
        return
    table = Table(title="drill scenarios")
    for col in ("name", "faults", "what goes wrong"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], ", ".join(r["faults"]) or "-", r["description"])
    kinds_table = Table(title="fault kinds (job.yaml `faults:`)")
    kinds_table.add_column("kind")
    kinds_table.add_column("what it does")
    for k in kinds:
        kinds_table.add_row(k["kind"], k["summary"])
    out = console()
    out.print(table)
    out.print(kinds_table)


def _table(results: list[Any]) -> Table:
    table = Table(title="fire drills")
    for col in ("drill", "result", "time", "job", "checks", "what failed"):
        table.add_column(col)
    for r in results:
        ok = sum(1 for c in r.checks if c.ok)
        failed = [f"{c.name}: {c.detail}" for c in r.failed_checks]
        if r.error:
            failed.insert(0, r.error)
        table.add_row(
            r.name,
            "[green]pass[/green]" if r.passed else "[red]FAIL[/red]",
            f"{r.wall_s:.0f}s",
            r.phase or "-",
            f"{ok}/{len(r.checks)}",
            "\n".join(failed) or "-",
        )
    total = sum(r.wall_s for r in results)
    table.caption = f"{sum(r.passed for r in results)}/{len(results)} passed in {total:.0f}s"
    return table
