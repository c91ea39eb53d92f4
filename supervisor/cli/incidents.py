"""`supervisor incidents list|show|report|release`: review what the supervisor recorded.

The database is found in this order: ``--db PATH``; ``--job job.yaml`` (its ``incidents.db``,
else ``<storage>/incidents.sqlite``, see ``supervisor.incidents.paths``); ``$SUPERVISOR_INCIDENT_DB``.
Read commands never create a database. ``release`` is the one command that writes: it lifts
the hold a closed (escalated) incident left on `latest`, and records who did it and why in
that incident's timeline.
"""

from __future__ import annotations

import errno
import getpass
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from supervisor.cli.output import console, json_option, print_json
from supervisor.errors import IncidentStoreError
from supervisor.incidents.states import IncidentState
from supervisor.incidents.store import IncidentStore

if TYPE_CHECKING:
    from supervisor.incidents.postmortem import Postmortem

ENV_DB = "SUPERVISOR_INCIDENT_DB"
_SQLITE_INT = click.IntRange(0, 2**63 - 1)  # what SQLite stores: 10**40 raised OverflowError
_SQLITE_MAGIC = b"SQLite format 3\x00"

_db_option = click.option(
    "--db", type=click.Path(dir_okay=False, path_type=Path), help="The incident database file."
)
_job_option = click.option(
    "--job",
    "job_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A job.yaml; its storage locates the database.",
)


def _open(db: Path | None, job_file: Path | None) -> tuple[IncidentStore, str | None]:
    """The store to read and, when a job.yaml was given, its job name."""
    job_name = None
    if db is None and job_file is not None:
        from supervisor.config.job import load_job
        from supervisor.incidents.paths import db_path_for_job

        job = load_job(job_file)
        db, job_name = db_path_for_job(job), job.name
    if db is None and os.environ.get(ENV_DB):
        db = Path(os.environ[ENV_DB])
    if db is None:
        raise IncidentStoreError(
            f"no incident database given: pass --db PATH or --job job.yaml (or set ${ENV_DB})"
        )
    if db.is_dir():  # $SUPERVISOR_INCIDENT_DB or a job's storage (--db is checked by click)
        raise IncidentStoreError("is a directory, expected an incident database file", source=str(db))
    return IncidentStore(db, read_only=True), job_name  # refuses what is not an incident database


@click.group()
def incidents() -> None:
    """Review incidents: list them, show a timeline, render a postmortem report."""


@incidents.command("list")
@_db_option
@_job_option
@click.option("--job-name", help="Only this job's incidents (default with --job: that job).")
@click.option(
    "--state", type=click.Choice([s.value for s in IncidentState]), help="Only incidents in this state."
)
@click.option("--limit", type=_SQLITE_INT, default=None, help="At most this many, newest first.")
@json_option
def list_cmd(
    db: Path | None,
    job_file: Path | None,
    job_name: str | None,
    state: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Incidents, newest first."""
    store, default_job = _open(db, job_file)
    with store:
        found = store.list_incidents(job=job_name or default_job, state=state, limit=limit)
    if as_json:
        print_json([inc.to_json() for inc in found])
        return
    from supervisor.incidents.render.terminal import incidents_table

    console(full=True).print(incidents_table(found) if found else "no incidents")


@incidents.command()
@click.argument("incident_id", type=_SQLITE_INT)
@_db_option
@_job_option
@json_option
def show(incident_id: int, db: Path | None, job_file: Path | None, as_json: bool) -> None:
    """One incident: summary and its timeline (pending events are actions that never finished)."""
    from supervisor.incidents.postmortem import build_postmortem

    store, _ = _open(db, job_file)
    with store:
        pm = build_postmortem(store, incident_id)
    if as_json:
        print_json({"incident": pm.incident.to_json(), "summary": pm.summary,
                    "timeline": [{**e.to_json(), "summary": text} for e, text in pm.timeline]})  # fmt: skip
        return
    from supervisor.incidents.render.terminal import print_postmortem

    print_postmortem(pm, console(), full=False)


@incidents.command()
@click.argument("incident_id", type=_SQLITE_INT)
@_db_option
@_job_option
@click.option(
    "--format", "fmt", type=click.Choice(["text", "md", "html", "json"]), default="text", show_default=True,
    help="text: the terminal; md, html (self-contained, with plots), json: for files and programs.",
)  # fmt: skip
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout."
)
def report(incident_id: int, db: Path | None, job_file: Path | None, fmt: str, output: Path | None) -> None:
    """The postmortem of one incident: timeline, root cause, impact, detection gap, measures."""
    from supervisor.incidents.postmortem import build_postmortem
    from supervisor.incidents.render import render_postmortem

    store, _ = _open(db, job_file)
    if output is not None:
        _refuse_overwriting_inputs(output, [store.path, job_file])
    with store:
        pm = build_postmortem(store, incident_id)
    if fmt == "text" and output is None:
        from supervisor.incidents.render.terminal import print_postmortem

        print_postmortem(pm, console())
        return
    text = _plain_text(pm) if fmt == "text" else render_postmortem(pm, fmt)
    if output is None:
        click.echo(text, nl=False)
        return
    _write_whole(output, text)
    click.echo(f"wrote {output}", err=True)


def _refuse_overwriting_inputs(output: Path, inputs: list[Path | None]) -> None:
    """``-o`` must not name the database (or its journal files), the job file or any SQLite
    file: `report 1 -o incidents.sqlite` replaced the database with the report."""
    for given in inputs:
        if given is None:
            continue
        family = [given] + [given.with_name(given.name + s) for s in ("-wal", "-shm", "-journal")]
        for f in family:
            try:
                same = output.exists() and f.exists() and os.path.samefile(output, f)
            except OSError:
                same = False
            if same or output.absolute() == f.absolute():
                raise IncidentStoreError("names a file this command reads (the database or the job file); refusing to overwrite it",
                                         source=str(output), field="--output")  # fmt: skip
    try:  # a regular file only: opening a FIFO to read it would wait for a writer
        is_db = False
        if output.is_file():
            with open(output, "rb") as existing:
                is_db = existing.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        is_db = False
    if is_db:
        raise IncidentStoreError("is a SQLite database; refusing to overwrite it", source=str(output),
                                 field="--output")  # fmt: skip


def _write_whole(output: Path, text: str) -> None:
    """Write through a temporary file and rename, so a failed write leaves an older report whole;
    a device or FIFO (``-o /dev/stdout``) is written directly."""
    try:
        if output.exists() and not output.is_file():
            # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of waiting forever;
            # once open, the write itself blocks as any pipe write does.
            try:
                fd = os.open(output, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                raise IncidentStoreError("is a FIFO nobody reads; refusing to wait for a reader",
                                         source=str(output), field="--output") from None  # fmt: skip
            os.set_blocking(fd, True)
            with open(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            return
        tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, output)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise IncidentStoreError(f"cannot write report: {exc.strerror or exc}", source=str(output)) from None


def _plain_text(pm: Postmortem) -> str:
    from rich.console import Console

    from supervisor.incidents.render.terminal import print_postmortem

    buf = io.StringIO()
    print_postmortem(pm, Console(file=buf, width=140, no_color=True))
    return buf.getvalue()


@incidents.command()
@click.argument("incident_id", type=_SQLITE_INT)
@click.option(
    "--job",
    "job_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The job.yaml: its storage holds `latest` and the block.",
)
@_db_option
@click.option("--note", required=True, help="Why the block can go (recorded in the incident's timeline).")
@click.option("--by", "who", default=None, help="Who releases it (default: the login name).")
@json_option
def release(
    incident_id: int, job_file: Path, db: Path | None, note: str, who: str | None, as_json: bool
) -> None:
    """Release the hold a closed incident left on `latest` (after an escalation was dealt with).

    `latest` then moves forward to the newest healthy checkpoint saved after the incident closed
    (a relaunched run's), unless another incident still holds it."""
    from supervisor.cli.release import release_block

    if not note.strip():
        raise IncidentStoreError("must say why the block can go", field="--note")
    done = release_block(job_file, db, incident_id, note.strip(), who or _login())
    if as_json:
        print_json(done)
        return
    out = console()
    if not done["released"]:
        out.print(
            f"incident {incident_id} holds no block on `latest` (latest: {done['latest']}); nothing recorded"
        )
        return
    held = done["still_held_by"]
    where = f"still held by incident {', '.join(held)}" if held else f"`latest` is step {done['latest']}"
    out.print(f"released incident {incident_id}'s hold on `latest` ({where}); recorded in its timeline")


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in a container without a passwd entry
        return "unknown"
