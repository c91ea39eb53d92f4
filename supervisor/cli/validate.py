"""`supervisor validate` and `supervisor schema`."""

from __future__ import annotations

from pathlib import Path

import click

from supervisor.cli.output import console, json_option, print_json
from supervisor.config.job import JobSpec, load_job


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@json_option
def validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Validate job files (job.yaml). Exit code 2 with a one-line error on the first bad one."""
    results = []
    for path in files:
        job = load_job(path)
        results.append({"file": str(path), "name": job.name, "max_steps": job.max_steps, "ok": True})
    if as_json:
        print_json(results)
        return
    out = console()
    for r in results:
        out.print(f"[green]ok[/green] {r['file']}: job {r['name']!r}, {r['max_steps']} steps")


@click.command()
@click.argument("kind", type=click.Choice(["job", "policy"]))
def schema(kind: str) -> None:
    """Print the JSON schema of a job.yaml (`job`) or a policy file (`policy`)."""
    if kind == "job":
        print_json(JobSpec.model_json_schema())
    else:
        from supervisor.core.policy.schema import policy_schema

        print_json(policy_schema())
