"""The full incident export (with the per-rank series) takes at most a tenth of a core: after one
that cost t seconds of CPU the next of the same incident waits 9 t, unless a flush asks for it now.
At 1,024 ranks its re-render every 2 s took about half of the supervisor's CPU under an incident."""

from __future__ import annotations

import time
from pathlib import Path

from tests.incidents.builders import diagnosis, telemetry
from tests.incidents.test_incident_survival import _wired


def test_a_costly_full_export_waits_nine_times_its_cost(tmp_path: Path) -> None:
    store, exporter, _ = _wired(tmp_path, full_interval_s=2.0)
    now = time.monotonic()
    exporter._full, exporter._last_full, exporter._cost = {7}, {7: now - 5.0}, {7: 1.0}
    assert exporter._due() == ([], [])  # 5 s after a 1 s export: not yet (9 s)
    assert 3.0 < (exporter._wait_s() or 0.0) <= 4.0
    exporter._cost[7] = 0.1  # a cheap one: the interval alone (2 s) counts
    assert exporter._due() == ([], [7])
    exporter._full, exporter._cost[7], exporter._urgent = {7}, 100.0, True
    assert exporter._due() == ([], [7])  # a flush writes it at once whatever it costs
    exporter._urgent = False
    exporter.close()
    store.close()


def test_each_full_export_notes_its_cost(tmp_path: Path) -> None:
    store, exporter, _ = _wired(tmp_path, full_interval_s=0.0)
    inc = store.open_incident("job-a", diagnosis())
    store.attach_series(inc.id, telemetry(ranks=4))
    assert exporter.flush(30)
    assert exporter._cost[inc.id] > 0.0
    exporter.close()
    store.close()
