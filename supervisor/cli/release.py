"""Release the hold a closed incident left on `latest` (`supervisor incidents release`).

An escalated incident keeps `latest` blocked at the step before its onset on purpose: a
person must look before the job's newer checkpoints count as good. Once the person has fixed
the cause (and usually relaunched the job), this lifts the block:

1. the incident must be closed (escalated, resolved or dismissed): a live supervisor owns the
   block of an incident it is still handling;
2. the event is recorded in the incident's timeline *before* the block goes (who, why, what
   held), so a failure between the two leaves the reason on record, and a rerun completes it;
3. the incident's hold is removed from the block file; other incidents' holds stay;
4. with no hold left, `latest` moves forward to the newest healthy checkpoint saved after the
   incident closed (a relaunched run's): never to one of the abandoned timeline, never back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.checkpoint import CheckpointStore
from supervisor.core.model import HealthMark
from supervisor.errors import IncidentStoreError
from supervisor.incidents.states import EventKind
from supervisor.incidents.timeline import RELEASE_HINT


def release_hint(incident_id: int) -> str:
    return RELEASE_HINT.format(id=incident_id)


def release_block(job_file: Path, db: Path | None, incident_id: int, note: str, who: str) -> dict[str, Any]:
    from supervisor.config.job import load_job
    from supervisor.incidents.paths import db_path_for_job
    from supervisor.incidents.store import IncidentStore
    from supervisor.storage import open_backend

    job = load_job(job_file)
    ckpts = CheckpointStore(
        open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region), job.name
    )
    db = db or db_path_for_job(job)
    if not db.is_file():
        raise IncidentStoreError("no incident database here", source=str(db))
    with IncidentStore(db) as store:
        inc = store.get(incident_id)  # one line naming the valid ids when unknown
        if inc.job != job.name:
            raise IncidentStoreError(f"incident {incident_id} belongs to job {inc.job!r}, not {job.name!r}",
                                     source=str(job_file), field="--job")  # fmt: skip
        if not inc.state.is_terminal:
            raise IncidentStoreError(
                f"incident {incident_id} is {inc.state.value}: the supervisor handling it releases "
                "`latest` itself; release only a closed (escalated) incident",
                source=str(db),
            )
        block = ckpts.block_state()
        holders = [h for h in block.holders if h.incident == str(incident_id)] if block else []
        if not holders:
            return {"incident": incident_id, "released": False, "latest": ckpts.latest(), "still_held_by": []}
        assert block is not None
        # 2. On record first: who, why, what the hold was.
        payload = {"released_latest": True, "by": who, "note": note, "held_since": holders[0].since,
                   "hold_reason": holders[0].reason, "latest_at_block": block.latest_at_block}  # fmt: skip
        event = store.record(incident_id, EventKind.NOTE, actor=f"person:{who}", payload=payload)
        # 3. The hold goes; 4. `latest` moves forward when nothing else holds it.
        left = ckpts.unblock(incident_id)
        before = ckpts.latest()
        after = before if left is not None else _catch_up(ckpts, inc.closed_at or event.wall_time, before)
        still = [str(h.incident) for h in left.holders] if left else []
        store.record(incident_id, EventKind.NOTE, actor=f"person:{who}",
                     payload={"latest_after_release": after, "latest_before": before,
                              "still_held_by": still})  # fmt: skip
    return {"incident": incident_id, "released": True, "by": who, "note": note, "latest_before": before,
            "latest": after, "still_held_by": still}  # fmt: skip


def _catch_up(ckpts: CheckpointStore, closed_at: float, current: int | None) -> int | None:
    """The newest healthy checkpoint saved after the incident closed, when newer than `latest`."""
    fresh = [
        m.step for m in ckpts.manifests() if m.health is HealthMark.HEALTHY and m.created_at >= closed_at
    ]
    newest = max(fresh, default=None)
    if newest is None or (current is not None and current >= newest):
        return current
    ckpts.advance_latest(newest)
    return ckpts.latest()


def closed_holds(job: Any) -> list[str]:
    """One line per hold on `latest` left by a closed incident of ``job``: said when the job is
    launched again, since the new run's checkpoints will not move `latest` until it is released."""
    from supervisor.errors import SupervisorError
    from supervisor.incidents.paths import db_path_for_job
    from supervisor.incidents.store import IncidentStore
    from supervisor.storage import open_backend

    try:
        ckpts = CheckpointStore(
            open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region), job.name
        )
        block = ckpts.block_state()
        db = db_path_for_job(job)
        if block is None or not db.is_file():
            return []
        lines = []
        with IncidentStore(db, read_only=True) as store:
            for h in block.holders:
                if h.incident is None or not h.incident.isdigit():
                    continue
                inc = store.get(int(h.incident))
                if inc.state.is_terminal:
                    lines.append(f"`latest` is held at step {block.latest_at_block} by incident {inc.id} "
                                 f"({inc.state.value}): this run's checkpoints will not move it; once the cause "
                                 f"is fixed, to release: {release_hint(inc.id)}")  # fmt: skip
        return lines
    except SupervisorError:  # a note only: storage trouble is reported where it matters, at launch
        return []
