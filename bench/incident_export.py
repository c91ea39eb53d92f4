"""What an incident export costs the control loop, at 2 to 16 ranks (issue 26, point 6).

Before: the controller wrote ``<job>/incidents/<id>.json`` (postmortem + series, ~200 KB per
rank) itself, inside the loop, after each change. After: the store's ``IncidentExporter`` does
it on its own thread, and the loop's thread only commits and marks. Both are measured side by
side in one run, as CPU seconds of the calling thread per change (``time.thread_time``).

    python -m bench.incident_export [--ranks 2,4,8,16] [--changes 10]

Last line: ``incident_export: ranks R, in-loop before X ms/change, after Y ms/change, export Z KB``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from supervisor.incidents import IncidentStore
from supervisor.incidents.export import IncidentExporter, export_incident, export_key
from supervisor.storage import open_backend


def _series(ranks: int, steps: int = 400) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [
        {
            "step": s,
            "rank": r,
            "loss": 3.0 - s / 1000 + rng.gauss(0, 0.02),
            "grad_norm": 1.0 + rng.random(),
            "update_norm": 0.01,
            "param_norm": 50.0,
            "lr": 1e-3,
            "time": 1000.0 + s,
            "step_time": 0.5,
            "tokens": 4096,
            "loss_scale": 65536.0,
        }  # fmt: skip
        for s in range(steps)
        for r in range(ranks)
    ]


def _diagnosis() -> dict[str, Any]:
    return {"onset_step": 200, "peak_step": 202, "end_step": 206, "phenotype": "transient", "rank_local": False,
            "first_rank": None, "source_local": None, "suspect_samples": [], "severity": "high",
            "causes": [{"cause": "optimizer", "score": 0.8, "evidence": ["update ratio rose 38x"]}],
            "first_anomaly": {"step": 200, "metric": "loss", "rank": 0, "value": 6.8, "baseline": 2.9, "z": 41.0},
            "detected_step": 202}  # fmt: skip


def _changes(store: IncidentStore, incident_id: int, n: int) -> None:
    for i in range(n):
        store.record(incident_id, "metric_check", actor="bench", step=200 + i, result={"i": i})


def measure(ranks: int, changes: int, root: Path) -> tuple[float, float, int]:
    backend = open_backend(str(root / f"storage-{ranks}"))
    series = _series(ranks)
    # before: the export written on the loop's thread after every change
    store = IncidentStore(root / f"before-{ranks}.sqlite")
    inc = store.open_incident("bench", _diagnosis())
    store.attach_series(inc.id, series)
    t0 = time.thread_time()
    for _ in range(changes):
        _changes(store, inc.id, 1)
        export_incident(store, inc.id, backend, "bench")
    before = (time.thread_time() - t0) / changes
    size = len(backend.get_bytes(export_key("bench", inc.id)))
    # after: the exporter's thread writes; the loop's thread commits and marks
    store2 = IncidentStore(root / f"after-{ranks}.sqlite")
    exporter = IncidentExporter(store2, backend, "bench-after", full_interval_s=2.0)
    inc2 = store2.open_incident("bench-after", _diagnosis())
    store2.attach_series(inc2.id, series)
    exporter.flush()
    t0 = time.thread_time()
    for _ in range(changes):
        _changes(store2, inc2.id, 1)
    after = (time.thread_time() - t0) / changes
    exporter.close()
    return before, after, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4,8,16")
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="seconds: 2 ranks, 2 changes (tests/bench)")
    args = parser.parse_args()
    if args.smoke:
        args.ranks, args.changes = "2", 2
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (int(r) for r in args.ranks.split(",")):
            before, after, size = measure(ranks, args.changes, Path(tmp))
            print(f"incident_export: ranks {ranks}, in-loop before {before * 1e3:.1f} ms/change, "
                  f"after {after * 1e3:.2f} ms/change, export {size / 1024:.0f} KB "
                  f"({before / max(after, 1e-9):.0f}x less)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
