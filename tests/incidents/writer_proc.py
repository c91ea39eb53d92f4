"""A second process writing to an incident store, driven by the concurrency tests.

python -m tests.incidents.writer_proc bulk DB INCIDENT N
    append N ``note`` events (payload {"seq": i, "writer": "proc"}), one transaction each
python -m tests.incidents.writer_proc killme DB INCIDENT
    commit 5 events and one pending event, print their ids, then open a transaction that
    writes large events and a state change, print ``inside`` and block until killed
"""

from __future__ import annotations

import json
import sys

from supervisor.incidents import IncidentStore


def main(argv: list[str]) -> None:
    mode, db, incident = argv[0], argv[1], int(argv[2])
    store = IncidentStore(db)
    if mode == "bulk":
        print("started", flush=True)
        for i in range(int(argv[3])):
            store.record(incident, "note", actor="proc", step=i, payload={"seq": i, "writer": "proc"})
        print("done", flush=True)
        return
    committed = [
        store.record(incident, "note", actor="proc", step=i, payload={"seq": i}).id for i in range(5)
    ]
    pending = store.begin(incident, "rolled_back", actor="proc", step=5, payload={"to_step": 0}).id
    print("committed", json.dumps({"events": committed, "pending": pending}), flush=True)
    with store.transaction():
        for i in range(3):
            # ~3 MB each: more than the page cache, so uncommitted pages spill into the WAL file.
            store.record(
                incident,
                "note",
                actor="proc",
                step=100 + i,
                payload={"ids": [f"id-{j:07d}" for j in range(250_000)]},
            )
        store.transition(incident, "frozen", "half-done", actor="proc")
        print("inside", flush=True)
        sys.stdin.read()  # blocks until the parent kills this process


if __name__ == "__main__":
    main(sys.argv[1:])
