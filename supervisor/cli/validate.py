"""`supervisor validate` and `supervisor schema`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from supervisor.cli.jobcheck import check_job
from supervisor.cli.output import console, json_option, print_json
from supervisor.config.job import JobSpec
from supervisor.errors import EXIT_BAD_INPUT

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a job.yaml field before validation, e.g. --set resources.num_workers=2 (repeatable; "
    "VALUE is YAML).",
)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@set_option
@json_option
def validate(files: tuple[Path, ...], overrides: tuple[str, ...], as_json: bool) -> None:
    """Validate job files (job.yaml): schema, policy file and drill faults.

    Every problem of every file is one line (`error: FILE: FIELD: what`); exit code 2 when any.
    """
    results: list[dict[str, Any]] = []
    for path in files:
        job, problems = check_job(path, overrides)
        row: dict[str, Any] = {"file": str(path), "ok": job is not None}
        if job is not None:
            row.update(name=job.name, max_steps=job.max_steps)
        else:
            row["errors"] = [p.one_line() for p in problems]
        results.append(row)
    if as_json:
        print_json(results)
    else:
        out = console()
        for r in results:
            if r["ok"]:
                out.print(f"[green]ok[/green] {r['file']}: job {r['name']!r}, {r['max_steps']} steps")
            for line in r.get("errors", []):
                click.echo(f"error: {line}", err=True)
    if not all(r["ok"] for r in results):
        sys.exit(EXIT_BAD_INPUT)


@click.command()
@click.argument("kind", type=click.Choice(["job", "policy"]))
def schema(kind: str) -> None:
    """Print the JSON schema of a job.yaml (`job`) or a policy file (`policy`)."""
    if kind == "job":
        print_json(JobSpec.model_json_schema())
    else:
        from supervisor.core.policy.schema import policy_schema

        print_json(policy_schema())
