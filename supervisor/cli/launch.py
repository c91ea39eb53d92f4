"""`supervisor launch`, `supervisor status`, `supervisor stop`: the supervisor on Ray.

Exit codes of `launch` (foreground): 0 the job finished healthy, 1 it was escalated, failed
or stopped, 2 bad input (an unreadable job.yaml), 3 Ray or the supervisor failed (no Ray to
connect to, the supervisor actor died).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from supervisor.cli.jobcheck import load_checked_job
from supervisor.cli.outcome import print_outcome
from supervisor.cli.output import FiniteFloat, JobName, RayAddress, console, json_option, print_json
from supervisor.cli.validate import set_option
from supervisor.config.job import JobSpec
from supervisor.errors import ConfigError


def _job(job_file: Path | None, attach_job: str | None, overrides: tuple[str, ...]) -> JobSpec:
    from supervisor.client import api

    if job_file is not None:
        job = load_checked_job(job_file, overrides)
        if attach_job and attach_job != job.name:
            raise ConfigError(
                f"--attach {attach_job!r} but the file describes job {job.name!r}", source=str(job_file)
            )
        return job
    if attach_job is None:
        raise click.UsageError("give a job file, or --attach JOB")
    found = api.job_of_running(attach_job)
    if found is None:
        raise ConfigError(
            f"job {attach_job!r} has no workers or supervisor on this cluster; pass its job.yaml too"
        )
    return found


@click.command()
@click.argument("job_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--detach", is_flag=True, help="Leave the supervisor running as a detached Ray actor and return."
)
@click.option(
    "--attach",
    "attach_job",
    type=JobName(),
    metavar="JOB",
    help="Resume supervising JOB (after its supervisor died).",
)
@click.option(
    "--address", type=RayAddress(), help="Ray address for --attach (default: the job's, else `auto`)."
)
@click.option("--no-faults", is_flag=True, help="Ignore the job's `faults:` list (run a drill job clean).")
@set_option
def launch(
    job_file: Path | None,
    detach: bool,
    attach_job: str | None,
    address: str | None,
    no_faults: bool,
    overrides: tuple[str, ...],
) -> None:
    """Launch JOB_FILE on Ray under the supervisor (or --attach to a running job).

    The first line says which Ray it runs on: a fresh local instance (no `ray.address`, or
    `local`) or the cluster it joined. Exit code 0 finished, 1 failed/escalated/stopped,
    2 bad input, 3 Ray or the supervisor failed.
    """
    from supervisor.cli import display
    from supervisor.client import api, cluster
    from supervisor.config.runtime import settings_for
    from supervisor.incidents.paths import open_incident_store

    job = load_checked_job(job_file, overrides) if job_file is not None else None
    checked = _check_incident_db(job) if job is not None else None  # before Ray starts
    if attach_job:
        named = job.ray.address if job is not None and job.ray.address != "local" else None
        cluster.connect_existing(address or named)
        console().print(cluster.describe(joined=True))
    elif job is None:
        raise click.UsageError("give a job file, or --attach JOB")
    else:
        console().print(cluster.connect(job, persistent=detach))
        if api.job_of_running(job.name) is not None:  # its workers outlived their supervisor
            console().print(f"job {job.name!r} is already running on this cluster: attaching to it")
            attach_job = job.name
    job = _job(job_file, attach_job, overrides)
    if no_faults:
        job = job.model_copy(update={"faults": []})
    started = 0.0 if attach_job else time.time()  # attached: the whole job's incidents
    settings = settings_for(job)
    if checked is None:
        _check_incident_db(job)
    if not attach_job:
        from supervisor.cli.release import closed_holds

        for line in closed_holds(job):  # a relaunch after an escalation: say how `latest` is released
            console().print(f"[yellow]note:[/] {line}")
    start = api.attach if attach_job else api.launch
    handle = start(job, settings, detached=detach)
    if detach:
        console().print(
            f"supervisor:{job.name} running (detached). `supervisor status {job.name}` to follow it."
        )
        return
    try:
        final = api.follow(handle, job, display.follow)
    except KeyboardInterrupt:
        api.stop(handle, "interrupted (Ctrl-C)")
        final = api.follow(handle, job, display.follow)
    print_outcome(job, open_incident_store(job), final, started, console())
    sys.exit(int(final.get("exit_code") or 0))


def _check_incident_db(job: Any) -> bool:
    """Open (create, migrate) the job's incident database here: a damaged one is named in one line
    (exit 2) instead of surfacing as "the supervisor does not answer" from the actor that failed."""
    from supervisor.incidents.paths import open_incident_store

    open_incident_store(job).close()
    return True


@click.command()
@click.argument("job_name", required=False, type=JobName())
@click.option("--address", type=RayAddress(), help="Ray address (default: `auto`).")
@json_option
def status(job_name: str | None, address: str | None, as_json: bool) -> None:
    """Show a supervised job (or every job on the cluster)."""
    from supervisor.cli import display
    from supervisor.client import api, cluster

    cluster.connect_existing(address)
    names = [job_name] if job_name else api.list_jobs()
    results = [api.status(api.find(n)) for n in names]
    if as_json:
        print_json(results[0] if job_name else results)
        return
    out = console()
    if not results:
        out.print("no supervised jobs on this cluster")
    for st in results:
        out.print(f"step {st['step']}/{st['max_steps']}")
        out.print(display.render_table(st))


@click.command()
@click.argument("job_name", type=JobName())
@click.option("--address", type=RayAddress(), help="Ray address (default: `auto`).")
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(0, 7 * 86400),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the workers.",
)
def stop(job_name: str, address: str | None, timeout_s: float) -> None:
    """Stop JOB at its next step boundary, then remove its supervisor."""
    import ray

    from supervisor.client import api, cluster

    cluster.connect_existing(address)
    handle = api.find(job_name)
    api.stop(handle, "`supervisor stop`")
    final = api.wait(handle, timeout_s)
    ray.kill(handle, no_restart=True)
    console().print(f"{job_name}: {final['phase']} at step {final['step']} ({final.get('reason', '')})")
