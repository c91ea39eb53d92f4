"""`supervisor incidents release`: an escalated incident's hold on `latest` goes only when a person
says so, on record in the incident's timeline (who, why), and `latest` then catches up with the
relaunched run -- never with the abandoned timeline."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.checkpoint import CheckpointStore
from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from supervisor.incidents.postmortem import build_postmortem
from supervisor.storage import open_backend
from tests.checkpoint.conftest import make_healthy
from tests.incidents.builders import diagnosis


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, ["--log-level", "error", *args])
    return res.exit_code, res.stdout, res.stderr


def _escalated_job(tmp_path: Path) -> tuple[Path, CheckpointStore, IncidentStore, int]:
    """Healthy 100, incident 1 blocks `latest` at 100 and escalates; the relaunched run saves
    healthy 150 and 200, which the block keeps from becoming `latest`."""
    storage = tmp_path / "storage"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: job1\nentrypoint: examples.tinylm.train:main\nmax_steps: 300\nstorage: {{path: {storage}}}\n"
    )
    ckpts = CheckpointStore(open_backend(str(storage)), "job1")
    make_healthy(ckpts, 100)
    store = IncidentStore(storage / "incidents.sqlite")
    inc = store.open_incident("job1", diagnosis(onset_step=120), key=1).id
    ckpts.block("incident open", incident=inc)
    make_healthy(ckpts, 120)  # the abandoned timeline: saved before the incident closed
    store.record(inc, "escalated", actor="runtime", step=125, result={"reason": "attempts exhausted"})
    store.transition(inc, "escalated", "plan ended with escalate", actor="supervisor", step=125)
    make_healthy(ckpts, 150)
    make_healthy(ckpts, 200)
    assert ckpts.latest() == 100 and ckpts.block_state() is not None
    return job, ckpts, store, inc


def test_escalation_message_names_the_release_command(tmp_path: Path) -> None:
    _, _, store, inc = _escalated_job(tmp_path)
    text = " ".join(t for _, t in build_postmortem(store, inc).timeline)
    assert "`latest` stays held until a person releases it." in text
    assert (
        text.count(
            f"To release `latest` once fixed: supervisor incidents release {inc} --job <job.yaml> --note"
        )
        == 1
    )


def test_checkpoints_list_names_the_release_command(tmp_path: Path) -> None:
    job, _, _, inc = _escalated_job(tmp_path)
    code, out, _ = _run("checkpoints", "list", str(job))
    assert code == 0 and f"supervisor incidents release {inc} --job <job.yaml>" in " ".join(out.split())


def test_release_lifts_the_hold_records_who_and_why_and_latest_catches_up(tmp_path: Path) -> None:
    job, ckpts, store, inc = _escalated_job(tmp_path)
    code, out, err = _run("incidents", "release", str(inc), "--job", str(job), "--note", "fixed the LR schedule",
                          "--by", "alice", "--json")  # fmt: skip
    assert code == 0, err
    done = json.loads(out)
    assert (done["released"], done["latest_before"], done["latest"], done["still_held_by"]) == (
        True,
        100,
        200,
        [],
    )
    assert ckpts.block_state() is None and ckpts.latest() == 200  # never 120: the abandoned timeline
    events = store.timeline(inc)
    released = next(e for e in events if e.payload.get("released_latest"))
    assert (released.actor, released.payload["by"], released.payload["note"]) == (
        "person:alice", "alice", "fixed the LR schedule")  # fmt: skip
    text = " ".join(t for _, t in build_postmortem(store, inc).timeline)
    assert "alice released `latest` (held at step 100): fixed the LR schedule." in text
    assert "`latest` moved forward from step 100 to step 200." in text
    # Again: nothing left to release, nothing recorded twice.
    code, out, _ = _run("incidents", "release", str(inc), "--job", str(job), "--note", "again")
    assert code == 0 and "holds no block" in out
    assert sum(1 for e in store.timeline(inc) if e.payload.get("released_latest")) == 1


def test_another_incidents_hold_stays(tmp_path: Path) -> None:
    job, ckpts, store, inc = _escalated_job(tmp_path)
    ckpts.block("incident open", incident=99)
    code, out, err = _run("incidents", "release", str(inc), "--job", str(job), "--note", "ok", "--json")
    assert code == 0, err
    assert json.loads(out)["still_held_by"] == ["99"] and ckpts.latest() == 100
    assert [h.incident for h in ckpts.block_state().holders] == ["99"]  # type: ignore[union-attr]


def test_refuses_an_incident_still_being_handled_and_an_empty_note(tmp_path: Path) -> None:
    job, ckpts, store, _ = _escalated_job(tmp_path)
    live = store.open_incident("job1", diagnosis(onset_step=210), key=2).id
    ckpts.block("incident open", incident=live)
    code, _, err = _run("incidents", "release", str(live), "--job", str(job), "--note", "x")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is open" in err
    assert ckpts.block_state() is not None
    code, _, err = _run("incidents", "release", "1", "--job", str(job), "--note", "  ")
    assert code == 2 and "--note" in err
    code, _, err = _run("incidents", "release", "77", "--job", str(job), "--note", "x")
    assert code == 2 and "no incident 77" in err


def test_a_relaunch_is_told_that_latest_is_held_and_how_to_release_it(tmp_path: Path) -> None:
    from supervisor.cli.release import closed_holds
    from supervisor.config.job import load_job

    job_file, ckpts, store, inc = _escalated_job(tmp_path)
    job = load_job(job_file)
    [line] = closed_holds(job)
    assert f"held at step 100 by incident {inc} (escalated)" in line
    assert f"supervisor incidents release {inc} --job <job.yaml>" in line
    live = store.open_incident("job1", diagnosis(onset_step=210), key=2).id
    ckpts.block("incident open", incident=live)
    assert len(closed_holds(job)) == 1  # an open incident's hold is its supervisor's business
    _run("incidents", "release", str(inc), "--job", str(job_file), "--note", "fixed")
    assert closed_holds(job) == []
