"""`supervisor logs JOB`: the output of a command entrypoint's training processes, per rank.

The rank's worker actor keeps what its process prints in the job's storage
(``<job>/logs/gen<G>/rank<R>.log``, bounded: see ``supervisor.ranks.process_logs``), so the
logs outlive the workers, the supervisor and the machine they ran on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from supervisor.cli.output import FiniteFloat, JobName
from supervisor.errors import ConfigError
from supervisor.ranks.process_logs import generations, read_segments
from supervisor.storage import Backend, open_backend


def _open(job_or_path: str, job: str | None) -> tuple[Backend, str]:
    if job_or_path.endswith((".yaml", ".yml")) and Path(job_or_path).is_file():
        from supervisor.config.job import load_job

        spec = load_job(job_or_path)
        return open_backend(
            spec.storage.path, spec.storage.endpoint_url, spec.storage.region
        ), job or spec.name
    if job is None:
        raise ConfigError("pass a job.yaml, or a storage path with --job NAME", source=job_or_path)
    if not job_or_path.startswith("s3://") and not Path(job_or_path).is_dir():
        raise ConfigError("neither a job.yaml nor an existing storage directory", source=job_or_path)
    return open_backend(job_or_path), job


@click.command()
@click.argument("job_or_path")
@click.option("--job", type=JobName(), default=None, help="Job name, when JOB_OR_PATH is a storage path.")
@click.option(
    "--rank",
    type=click.IntRange(0, 1 << 20),
    default=None,
    help="Only this rank (default: every rank, prefixed).",
)
@click.option(
    "--generation",
    type=click.IntRange(0, 10**9),
    default=None,
    help="Worker-group generation (default: the newest).",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until interrupted.")
@click.option(
    "--interval",
    type=FiniteFloat(0.05, 3600),
    default=1.0,
    show_default=True,
    help="Seconds between --follow polls.",
)
def logs(
    job_or_path: str, job: str | None, rank: int | None, generation: int | None, follow: bool, interval: float
) -> None:
    """Print what a job's training processes wrote (stdout and stderr, as they interleaved)."""
    backend, name = _open(job_or_path, job)
    gens = generations(backend, name)
    if not gens and not follow:
        raise ConfigError(f"no process output kept for job {name!r} (only command entrypoints have one)",
                          source=backend.uri)  # fmt: skip
    gen = generation if generation is not None else (max(gens) if gens else 0)
    if gens and gen not in gens:
        raise ConfigError(f"no generation {gen}; kept: {sorted(gens)}", field="--generation")
    shown: dict[int, int] = {}
    while True:
        ranks = gens.get(gen, []) if rank is None else [rank]
        if rank is not None and gens and rank not in gens.get(gen, []) and not follow:
            raise ConfigError(
                f"no output of rank {rank} in generation {gen}; ranks: {gens[gen]}", field="--rank"
            )
        for r in ranks:
            older, live = read_segments(backend, name, gen, r)
            if r not in shown:
                new = older + live
            elif len(live) >= shown[r]:
                new = live[shown[r] :]
            else:  # the live segment rotated: the rest of the one we were reading, then the new one
                new = older[shown[r] :] + live
            _write(new, prefix=f"[rank {r}] " if rank is None else "")
            shown[r] = len(live)
        if not follow:
            return
        time.sleep(interval)
        newer = generations(backend, name)
        if generation is None and newer and max(newer) != gen:
            gen, shown = max(newer), {}
            click.echo(f"--- worker group restarted: generation {gen} ---", err=True)
        gens = newer


def _write(data: bytes, prefix: str) -> None:
    if not data:
        return
    text = data.decode("utf-8", "replace")
    if prefix:
        text = "".join(prefix + line for line in text.splitlines(keepends=True))
    sys.stdout.write(text)
    sys.stdout.flush()
