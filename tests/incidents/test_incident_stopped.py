"""Issue 29 point 6: an incident stopped mid-plan (`supervisor stop` while frozen or observing) is
recorded in its own terminal state, ``stopped``, and every reader knows it: the store (closed,
final), the JSON export and a rebuild from it, the reports, `incidents list --state stopped`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import EventKind, IncidentState, IncidentStore
from supervisor.incidents.export import export_incident, import_incident, read_export
from supervisor.incidents.render import render_report
from supervisor.storage import open_backend
from tests.incidents.builders import diagnosis


def stopped_incident(store: IncidentStore) -> int:
    inc = store.open_incident("j", diagnosis())
    store.transition(inc.id, IncidentState.FROZEN, "froze", actor="supervisor", step=105)
    why = "stopped on request (`supervisor stop`) during the plan: done alert, freeze; not done apply, observe, resume"
    store.transition(inc.id, IncidentState.STOPPED, why, actor="supervisor", step=105)
    store.record(inc.id, EventKind.NOTE, actor="supervisor", step=105,
                 payload={"stopped": {"reason": "`supervisor stop`", "done": ["alert", "freeze"],
                                      "not_done": ["apply", "observe", "resume"], "why": "stopped"}})  # fmt: skip
    return inc.id


def test_a_stopped_incident_is_closed_final_and_known_to_every_reader(tmp_path: Path) -> None:
    path = tmp_path / "incidents.sqlite"
    store = IncidentStore(path)
    iid = stopped_incident(store)
    inc = store.get(iid)
    assert inc.state is IncidentState.STOPPED and inc.closed_at is not None
    assert not store.active("j") and inc.state.is_final

    backend = open_backend(str(tmp_path / "storage"))
    export_incident(store, iid, backend, "j")
    doc = read_export(backend, "j", iid)
    assert doc["incident"]["state"] == "stopped"
    rebuilt = IncidentStore(tmp_path / "rebuilt.sqlite")
    again = rebuilt.get(import_incident(rebuilt, doc))
    assert again.state is IncidentState.STOPPED and again.closed_at is not None

    md = render_report(store, iid, "md")
    assert "stopped" in md and "not done apply, observe, resume" in md
    assert (
        "Stopped on request (`supervisor stop`): done alert, freeze; not done apply, observe, resume." in md
    )
    assert "supervisor incidents release" in md  # `latest` stays held, as for an escalation
    assert "resolved" not in md.lower().split("timeline")[0]
    store.close()

    res = CliRunner().invoke(cli, ["incidents", "list", "--db", str(path), "--state", "stopped", "--json"])
    assert res.exit_code == 0, res.output
    assert [row["state"] for row in json.loads(res.output)] == ["stopped"]
