"""The incident database survives damage at any moment (issue 29, 4) and its exports cost the
control loop nothing (issue 26, 6).

Reported: truncated within 2 s of a resolve, the database came back from a stale export as
"observing"; truncated 1 s after the incident opened, the supervisor loop crashed and the
incident was gone; a garbage database before `launch` read "supervisor does not answer".
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from supervisor.config.job import JobSpec
from supervisor.errors import IncidentStoreError
from supervisor.incidents import IncidentStore
from supervisor.incidents.export import IncidentExporter, read_export, rebuild_from_exports, record_key
from supervisor.incidents.states import IncidentState
from supervisor.storage import open_backend
from supervisor.storage.base import Backend
from tests.incidents.builders import diagnosis, full_incident, telemetry


def _wired(
    tmp_path: Path, full_interval_s: float = 3600.0
) -> tuple[IncidentStore, IncidentExporter, Backend]:
    """The store as the supervisor has it, with a full export far apart (so only the record is fresh)."""
    backend = open_backend(str(tmp_path / "storage"))
    store = IncidentStore(
        tmp_path / "incidents.sqlite", rebuild=lambda s: rebuild_from_exports(s, backend, "job-a")
    )
    return store, IncidentExporter(store, backend, "job-a", full_interval_s=full_interval_s), backend


def _record_state(backend: Backend, incident_id: int) -> str | None:
    try:
        return str(json.loads(backend.get_bytes(record_key("job-a", incident_id)))["incident"]["state"])
    except Exception:  # noqa: BLE001 -- not written yet
        return None


def _wait_for_record(backend: Backend, incident_id: int, state: str) -> None:
    deadline = time.monotonic() + 30
    while _record_state(backend, incident_id) != state:
        assert time.monotonic() < deadline, f"the record export never showed {state}"
        time.sleep(0.01)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(0)


def test_truncated_right_after_a_resolve_comes_back_resolved(tmp_path: Path) -> None:
    store, exporter, backend = _wired(tmp_path)
    inc = store.open_incident("job-a", diagnosis())
    store.attach_series(inc.id, telemetry(ranks=2))
    for state in ("frozen", "acting", "observing"):
        store.transition(inc.id, state, f"to {state}", actor="supervisor", step=103)
    exporter.flush()  # a full export with the series, while observing
    store.transition(inc.id, "resolved", "observation passed", actor="supervisor", step=150)
    _wait_for_record(backend, inc.id, "resolved")  # no flush: the exporter writes the record on its own
    assert read_export(backend, "job-a", inc.id)["incident"]["state"] == "observing"  # the full one is stale
    timeline = [(e.id, e.kind) for e in store.timeline(inc.id)]
    _truncate(store.path)
    store.check_intact()
    assert store.rebuilt and store.get(inc.id).state is IncidentState.RESOLVED
    assert [(e.id, e.kind) for e in store.timeline(inc.id)] == timeline
    assert len(store.series(inc.id)) == len(telemetry(ranks=2))  # the series from the full export
    exporter.close()


def test_truncated_a_moment_after_open_the_next_writes_go_on(tmp_path: Path) -> None:
    store, exporter, backend = _wired(tmp_path)
    inc = store.open_incident("job-a", diagnosis())
    _wait_for_record(backend, inc.id, "open")
    store.check_intact()  # the last check was just now: the next use would not look again for a while
    _truncate(store.path)
    # The loop's next writes, at once (no check interval waited out): none may fail.
    store.attach_series(inc.id, telemetry(first=100, last=110, ranks=1))
    store.transition(inc.id, "frozen", "policy says freeze", actor="supervisor", step=103)
    store.check_intact()
    assert store.rebuilt and store.get(inc.id).state is IncidentState.FROZEN
    exporter.close()
    assert _record_state(backend, inc.id) == "frozen"


def test_every_change_is_exported_off_the_writers_thread(tmp_path: Path) -> None:
    """A write to a slow storage must not hold up the thread that commits (the control loop)."""
    store, exporter, backend = _wired(tmp_path, full_interval_s=0.0)
    release = threading.Event()
    real_put = backend.put_bytes
    backend.put_bytes = lambda key, data: (release.wait(30), real_put(key, data))[1]  # type: ignore[method-assign]
    started = time.monotonic()
    inc = store.open_incident("job-a", diagnosis())
    store.attach_series(inc.id, telemetry(ranks=4))
    store.transition(inc.id, "frozen", "freeze", actor="supervisor", step=103)
    assert time.monotonic() - started < 10 and _record_state(backend, inc.id) is None  # nothing waited
    release.set()
    assert exporter.flush(30)
    assert _record_state(backend, inc.id) == "frozen"
    assert read_export(backend, "job-a", inc.id)["incident"]["state"] == "frozen"
    exporter.close()


def test_a_rebuild_takes_the_newest_of_the_record_and_the_full_export(tmp_path: Path) -> None:
    store, exporter, backend = _wired(tmp_path, full_interval_s=0.0)
    inc = full_incident(store, job="job-a")
    exporter.close()
    doc = read_export(backend, "job-a", inc)
    other = IncidentStore(tmp_path / "other.sqlite")
    assert rebuild_from_exports(other, backend, "job-a") == [inc]
    assert other.get(inc).state is IncidentState.RESOLVED and len(other.series(inc)) == len(doc["series"])
    backend.put_bytes(
        record_key("job-a", inc), b"[" * 100_000
    )  # a damaged record: the full export still serves
    third = IncidentStore(tmp_path / "third.sqlite")
    assert rebuild_from_exports(third, backend, "job-a") == [inc]


def test_a_new_database_beside_exports_is_rebuilt_at_once(tmp_path: Path) -> None:
    store, exporter, backend = _wired(tmp_path)
    inc = store.open_incident("job-a", diagnosis())
    exporter.close()
    store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    again = IncidentStore(store.path, rebuild=lambda s: rebuild_from_exports(s, backend, "job-a"))
    assert again.get(inc.id).job == "job-a" and again.rebuilt[0]["restored"] == [inc.id]


def test_a_garbage_database_before_launch_is_named(tmp_path: Path) -> None:
    from supervisor.incidents.paths import open_incident_store

    job = JobSpec.model_validate(
        {"name": "job-a", "entrypoint": "m:f", "storage": {"path": str(tmp_path / "store")}, "max_steps": 10}
    )
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "incidents.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(IncidentStoreError) as err:
        open_incident_store(job)
    assert err.value.exit_code == 2 and "not an incident database" in err.value.one_line()
    assert str(tmp_path / "store" / "incidents.sqlite") in err.value.one_line()


def test_launch_with_a_garbage_database_says_so_before_ray_starts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from supervisor.cli.main import cli

    store = tmp_path / "store"
    store.mkdir()
    (store / "incidents.sqlite").write_bytes(b"\x00garbage" * 1000)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: job-a\nentrypoint: m:f\nstorage: {{path: {store}}}\nmax_steps: 10\n")
    result = CliRunner().invoke(cli, ["--log-level", "error", "launch", str(job)])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert str(store / "incidents.sqlite") in errors[0] and "not an incident database" in errors[0]
