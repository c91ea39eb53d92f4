"""`supervisor checkpoints list | verify | mark`.

JOB_OR_PATH is either a job.yaml (storage and job name come from it) or a storage location
(a directory or ``s3://bucket/prefix``) with ``--job NAME``; without ``--job`` the storage
must hold exactly one job. Failures (no such checkpoint, a corrupt shard, an unreachable
bucket) are one-line errors with exit code 2; nothing stored is overwritten except the
manifest's verification record and health mark, which is what `verify` and `mark` are for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from supervisor.checkpoint import CheckpointStore, Manifest, collect_garbage, verify
from supervisor.checkpoint.store import save_id
from supervisor.cli.output import STEP, JobName, console, json_option, print_json
from supervisor.core.model import HealthMark
from supervisor.errors import EXIT_FAILED, CheckpointError, ConfigError
from supervisor.incidents.timeline import RELEASE_HINT
from supervisor.storage import Backend, open_backend
from supervisor.storage.local import LocalBackend

MAX_REASON_CHARS = 4000
"""Longest `--reason` (it is stored in the manifest and printed back; 100 kB took a minute)."""


def _open(job_or_path: str, job: str | None, endpoint_url: str | None, region: str | None) -> CheckpointStore:
    if job_or_path.endswith((".yaml", ".yml")) and Path(job_or_path).is_file():
        from supervisor.config.job import load_job

        spec = load_job(job_or_path)
        backend = open_backend(
            spec.storage.path, endpoint_url or spec.storage.endpoint_url, region or spec.storage.region
        )
        return CheckpointStore(backend, job or spec.name)
    if not job_or_path.startswith("s3://") and not Path(job_or_path).is_dir():
        raise ConfigError("neither a job.yaml nor an existing storage directory", source=job_or_path)
    backend = open_backend(job_or_path, endpoint_url, region)
    return CheckpointStore(backend, job or _only_job(backend))


def _only_job(backend: Backend) -> str:
    if isinstance(backend, LocalBackend):
        # Look one level down only: `checkpoints list /` walked the whole file system (and died
        # on the first unreadable folder).
        try:
            jobs = sorted(d.name for d in backend.root.iterdir() if (d / "checkpoints").is_dir())
        except OSError as exc:
            raise ConfigError(f"cannot list: {exc.strerror or exc}", source=backend.uri) from None
    else:
        jobs = sorted({o.key.split("/")[0] for o in backend.list("") if "/checkpoints/" in o.key})
    if len(jobs) == 1:
        return jobs[0]
    found = f"jobs found: {', '.join(jobs)}" if jobs else "no job with checkpoints found"
    raise ConfigError(f"pass --job NAME ({found})", source=backend.uri)


def _target(f: Any) -> Any:
    f = click.option("--region", default=None, help="S3 region (default: the standard boto3 chain).")(f)
    f = click.option("--endpoint-url", default=None, help="S3 endpoint for MinIO / Ceph-style servers.")(f)
    f = click.option("--job", type=JobName(), default=None, help="Job name under a storage path.")(f)
    return click.argument("job_or_path")(f)


def _row(m: Manifest, latest: int | None, kept: list[Manifest] | None = None) -> dict[str, Any]:
    last = m.last_verification
    return {
        "step": m.step,
        "health": m.health.value,
        "latest": m.step == latest,
        "world_size": m.world_size,
        "files": len(m.files),
        "bytes": sum(f.size for f in m.files),
        "components": m.components,
        "created_at": m.created_at,
        "verified_at": last.time if last else None,
        "verified_ok": last.ok if last else None,
        "metrics": m.metrics,
        "reason": m.history[-1].reason if m.history else None,
        "replaced": [_replaced(k) for k in kept or []],
    }


def _replaced(m: Manifest) -> dict[str, Any]:
    """An earlier save of the step that a re-save replaced (kept as history)."""
    return {
        "save_id": save_id(m),
        "health": m.health.value,
        "created_at": m.created_at,
        "reason": m.history[-1].reason if m.history else None,
    }


@click.group()
def checkpoints() -> None:
    """Inspect, verify and mark the checkpoints of a job."""


@checkpoints.command("list")
@_target
@json_option
def list_cmd(
    job_or_path: str, job: str | None, endpoint_url: str | None, region: str | None, as_json: bool
) -> None:
    """List committed checkpoints with their health, size and last verification."""
    store = _open(job_or_path, job, endpoint_url, region)
    problems = store.problems()  # unreadable manifests, an unreadable or dangling `latest`
    try:
        latest = store.latest()
    except CheckpointError:
        latest = None  # named in problems
    block = store.block_state()
    rows = [_row(m, latest, store.history(m.step)) for m in store.manifests()]
    if as_json:
        holders = [h.model_dump() for h in block.holders] if block else []
        print_json(
            {
                "job": store.job,
                "storage": store.uri,
                "latest": latest,
                "blocked_by": holders,
                "checkpoints": rows,
                "problems": problems,
            }
        )
        return
    out = console()
    out.print(
        f"{store.uri}  latest: {latest}"
        + (f"  [red]blocked[/red] by {[h.incident for h in block.holders]}" if block else ""),
        highlight=False,
    )
    for problem in problems:
        out.print(f"  [red]problem[/red]: {escape(problem)}", highlight=False)
    for r in rows:
        mark = " <- latest" if r["latest"] else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_at"]))
        out.print(
            f"  step {r['step']:>9}  {r['health']:<11} ws={r['world_size']}  {r['bytes'] / 2**20:9.1f} MiB  {when}{mark}"
        )
        for k in r["replaced"]:
            out.print(f"      replaced save {k['save_id']}: {k['health']} ({k['reason']})")
    if not rows:
        out.print("  no committed checkpoints")
    for h in block.holders if block else []:
        if h.incident is not None:  # an escalated incident's hold stays until a person releases it
            hint = RELEASE_HINT.format(id=h.incident)
            out.print(
                f"  held by incident {h.incident} ({h.reason}); once it is closed and dealt with: {hint}"
            )


@checkpoints.command("verify")
@_target
@click.argument("step", type=STEP, required=False)
@click.option("--deep", is_flag=True, help="Also open every file with torch (downloads from S3).")
@click.option(
    "--world-size",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Check compatibility with this world size.",
)
@click.option("--no-record", is_flag=True, help="Do not write the result into the manifest.")
@json_option
def verify_cmd(
    job_or_path: str,
    job: str | None,
    endpoint_url: str | None,
    region: str | None,
    step: int | None,
    deep: bool,
    world_size: int | None,
    no_record: bool,
    as_json: bool,
) -> None:
    """Verify one checkpoint (STEP) or all; a failed one is quarantined and the command exits 1."""
    store = _open(job_or_path, job, endpoint_url, region)
    steps = [step] if step is not None else store.steps()
    results = [
        verify(store, s, deep=deep, expected_world_size=world_size, by="cli", record=not no_record)
        for s in steps
    ]
    if as_json:
        print_json([r.to_json() for r in results])
    else:
        out = console()
        for r in results:
            status = "[green]ok[/green]" if r.ok else f"[red]FAILED[/red] {'; '.join(r.problems)}"
            out.print(f"step {r.step}: {status}" + "".join(f"\n  note: {n}" for n in r.notes))
    failed = [r for r in results if not r.ok]
    if failed:
        first = failed[0]
        raise CheckpointError(
            f"step {first.step}: {first.problems[0]}"
            + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""),
            source=store.uri,
            exit_code=EXIT_FAILED,
        )


@checkpoints.command("mark")
@_target
@click.argument("step", type=STEP)
@click.argument("state", type=click.Choice([m.value for m in HealthMark]))
@click.option("--reason", required=True, help="Why (recorded in the manifest's health history).")
@json_option
def mark_cmd(
    job_or_path: str,
    job: str | None,
    endpoint_url: str | None,
    region: str | None,
    step: int,
    state: str,
    reason: str,
    as_json: bool,
) -> None:
    """Move checkpoint STEP to STATE (e.g. healthy, quarantined), recording the reason."""
    if len(reason) > MAX_REASON_CHARS:
        raise ConfigError(f"longer than {MAX_REASON_CHARS:,} characters ({len(reason):,})", field="--reason")
    store = _open(job_or_path, job, endpoint_url, region)
    m = store.mark(step, HealthMark(state), reason)
    if as_json:
        try:
            latest = store.latest()
        except CheckpointError:
            latest = None
        print_json(_row(m, latest))
    else:
        console().print(f"step {step}: {m.health.value} ({reason})", markup=False, highlight=False)


@checkpoints.command("gc")
@_target
@click.option(
    "--keep",
    type=click.IntRange(1, 1_000_000),  # job.yaml's checkpoint.keep; -1 deleted more than the default
    default=None,
    help="Healthy checkpoints to keep (default: checkpoint.keep of the job, else 3).",
)
@click.option("--protect", type=STEP, multiple=True, help="A step an open incident references (repeatable).")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@json_option
def gc_cmd(
    job_or_path: str,
    job: str | None,
    endpoint_url: str | None,
    region: str | None,
    keep: int | None,
    protect: tuple[int, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Apply retention: keep the newest K healthy, protected steps, `latest`, and unjudged newer ones."""
    store = _open(job_or_path, job, endpoint_url, region)
    if keep is None:
        keep = _job_keep(job_or_path)
    report = collect_garbage(store, keep, protect, dry_run=dry_run)
    if as_json:
        done = "would_delete" if dry_run else "deleted"  # a dry run never reports anything as deleted
        print_json(
            {
                done: report.deleted,
                "kept": report.kept,
                f"orphans_{done}": report.orphans_deleted,
                "uploads_aborted": report.uploads_aborted,
                "dry_run": dry_run,
            }
        )
        return
    verb = "would delete" if dry_run else "deleted"
    console().print(f"{verb} {report.deleted or 'nothing'}; kept {report.kept}")


def _job_keep(job_or_path: str) -> int:
    if job_or_path.endswith((".yaml", ".yml")) and Path(job_or_path).is_file():
        from supervisor.config.job import load_job

        return load_job(job_or_path).checkpoint.keep
    return 3
