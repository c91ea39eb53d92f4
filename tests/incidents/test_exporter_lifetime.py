"""An incident store opened as the runtime opens it exports on a thread of its own. A test that
leaves it running lets it write (and log an ``incident_exported`` line) during a later test, into
that test's captured command output: tests/conftest.py stops each test's exporters when it ends.
The two tests below run in this order; the second fails when the first one's thread outlives it."""

from __future__ import annotations

import threading
from pathlib import Path

from supervisor.config.job import JobSpec
from supervisor.incidents.paths import open_incident_store
from tests.incidents.builders import diagnosis


def _exporting() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "incident-export" and t.is_alive()]


def test_a_runtime_store_exports_on_a_thread_of_its_own(tmp_path: Path) -> None:
    job = JobSpec.model_validate(
        {"name": "job-a", "entrypoint": "m:f", "storage": {"path": str(tmp_path / "store")}, "max_steps": 10}
    )
    store = open_incident_store(job)
    store.open_incident("job-a", diagnosis())
    assert _exporting(), "the change did not start the exporter's thread"


def test_no_exporter_thread_outlives_the_test_that_started_it() -> None:
    assert not _exporting()
