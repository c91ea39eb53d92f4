"""The store, one behaviour per test: states, write-ahead events, series, scrubbing, transactions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from supervisor.config.job import JobSpec
from supervisor.core.model import Diagnosis
from supervisor.core.records import Record, SourceView
from supervisor.errors import IncidentStoreError
from supervisor.incidents import (
    TRANSITIONS,
    EventKind,
    EventStatus,
    IncidentState,
    IncidentStore,
    db_path_for_job,
    open_for_job,
)
from supervisor.incidents.models import dumps
from supervisor.sdk.wire import pack, unpack
from tests.incidents.builders import diagnosis


def test_terminal_states_have_one_way_out_reopening_a_resolved_incident() -> None:
    for state in IncidentState:
        assert state.is_active == (not state.is_terminal) and state.is_active <= bool(TRANSITIONS[state])
    assert {s for s in IncidentState if s.is_terminal} == {
        IncidentState.RESOLVED,
        IncidentState.ESCALATED,
        IncidentState.STOPPED,
        IncidentState.DISMISSED,
    }
    # A person decided, or there was nothing to fix: final. A resolved fault may come back.
    assert {s for s in IncidentState if s.is_final} == {
        IncidentState.ESCALATED,
        IncidentState.STOPPED,
        IncidentState.DISMISSED,
    }
    assert TRANSITIONS[IncidentState.RESOLVED] == {IncidentState.OPEN}


def test_reopen_brings_a_resolved_incident_back_with_its_attempt_and_new_onset(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis(), key=1)
    store.transition(inc.id, "acting", "fix", actor="supervisor")
    store.transition(inc.id, "resolved", "window passed", actor="supervisor")
    with pytest.raises(IncidentStoreError, match="reopened with IncidentStore.reopen"):
        store.transition(inc.id, "open", "came back", actor="supervisor")
    again = store.reopen(inc.id, diagnosis(onset_step=251, detected_step=253), reason="onset 251 near 257",
                         attempt=2, step=253, key=9)  # fmt: skip
    assert (again.state, again.onset_step, again.closed_at, again.analyzer_key) == (
        IncidentState.OPEN,
        251,
        None,
        9,
    )
    assert store.find("j", 9) == again and store.active("j") == [again]
    *_, detected, changed = store.timeline(inc.id)
    assert (detected.kind, detected.step, detected.payload["attempt"]) == (EventKind.DETECTED, 253, 2)
    assert changed.payload == {"from": "resolved", "to": "open", "reason": "onset 251 near 257",
                               "reopened": True, "attempt": 2}  # fmt: skip
    assert [d.onset_step for _, d in store.detections("j")] == [100, 251]


@pytest.mark.parametrize("final", ["escalated", "dismissed"])
def test_escalated_and_dismissed_incidents_are_never_reopened(store: IncidentStore, final: str) -> None:
    inc = store.open_incident("j", diagnosis())
    store.transition(inc.id, final, "a person decides", actor="supervisor")
    with pytest.raises(IncidentStoreError, match=f"only a resolved incident can be reopened; it is {final}"):
        store.reopen(inc.id, diagnosis(), reason="x", attempt=2)
    assert store.get(inc.id).state.value == final


def test_open_incident_records_detection_and_indexes_the_diagnosis(store: IncidentStore) -> None:
    inc = store.open_incident("job-a", Diagnosis.from_json(diagnosis()), key=7)
    assert (inc.state, inc.onset_step, inc.detected_step, inc.top_cause) == (
        IncidentState.OPEN,
        100,
        103,
        "data",
    )
    assert inc.diagnosis is not None and inc.diagnosis.first_rank == 1
    [event] = store.timeline(inc.id)
    assert (event.kind, event.status, event.step) == (EventKind.DETECTED, EventStatus.DONE, 103)
    assert store.find("job-a", 7) == inc and store.find("job-b", 7) is None


def test_transition_records_its_reason_and_closes_terminal_states(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    store.transition(inc.id, "frozen", "policy says freeze", actor="supervisor", step=103)
    done = store.transition(inc.id, IncidentState.ESCALATED, "rollback target missing", actor="supervisor")
    assert done.state.is_terminal and done.closed_at is not None
    changes = [e.payload for e in store.timeline(inc.id) if e.kind == EventKind.STATE_CHANGED]
    assert changes == [
        {"from": "open", "to": "frozen", "reason": "policy says freeze"},
        {"from": "frozen", "to": "escalated", "reason": "rollback target missing"},
    ]


def test_invalid_transition_is_refused_with_the_valid_choices(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    store.transition(inc.id, "dismissed", "metric artifact", actor="supervisor")
    with pytest.raises(
        IncidentStoreError, match=r"cannot go from dismissed to acting; valid: none \(terminal\)"
    ):
        store.transition(inc.id, "acting", "x", actor="supervisor")
    with pytest.raises(IncidentStoreError, match="unknown incident state 'paused'; valid: open, frozen"):
        store.transition(inc.id, "paused", "x", actor="supervisor")
    assert store.get(inc.id).state == IncidentState.DISMISSED


def test_write_ahead_event_is_pending_until_finished(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    ev = store.begin(
        inc.id, "rolled_back", actor="runtime", step=103, payload={"to_step": 80}, action_id="p1.a3"
    )
    assert store.pending_events(inc.id) == [ev] and store.last_done(inc.id, "rolled_back") is None
    done = store.finish(ev.id, result={"verified": True})
    assert (
        done.status == EventStatus.DONE and done.result == {"verified": True} and done.finished_at is not None
    )
    assert store.pending_events(inc.id) == []
    assert store.last_done(inc.id, EventKind.ROLLED_BACK) == done
    assert store.event_for_action(inc.id, "p1.a3") == done


def test_finishing_twice_is_refused(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    ev = store.begin(inc.id, "snapshot", actor="runtime")
    store.finish(ev.id, failed=True, result={"error": "disk full"})
    with pytest.raises(IncidentStoreError, match="already failed"):
        store.finish(ev.id)
    assert store.event(ev.id).status == EventStatus.FAILED


def test_unknown_event_kind_and_incident_are_named(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    with pytest.raises(
        IncidentStoreError, match="unknown event kind 'rebooted'; valid: detected, metric_check"
    ):
        store.record(inc.id, "rebooted", actor="x")
    with pytest.raises(IncidentStoreError, match="no incident 999"):
        store.begin(999, "froze", actor="x")


def test_list_filters_by_job_and_state_and_active_skips_terminal(store: IncidentStore) -> None:
    a = store.open_incident("a", diagnosis())
    b = store.open_incident("a", diagnosis())
    c = store.open_incident("b", diagnosis())
    store.transition(b.id, "dismissed", "benign", actor="s")
    assert [i.id for i in store.list_incidents()] == [c.id, b.id, a.id]
    assert [i.id for i in store.list_incidents(job="a", state="open")] == [a.id]
    assert [i.id for i in store.active("a")] == [a.id]


def test_series_keeps_numeric_fields_and_later_writes_replace(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    n = store.attach_series(
        inc.id,
        [
            {"step": 5, "rank": 0, "loss": 2.0, "param_norm": 10.0, "update_norm": 0.1, "samples": ["id-1"]},
            {"step": 5, "loss": 2.5, "attrs": {"note": "x"}},
            {"loss": 1.0},  # no step: unusable
        ],
    )
    assert n == 2
    store.attach_series(inc.id, [{"step": 5, "rank": 0, "loss": 9.0}])
    agg, rank0 = store.series(inc.id)
    assert agg == {"step": 5, "loss": 2.5}
    assert rank0 == {"step": 5, "rank": 0, "loss": 9.0}


def test_records_decoded_from_the_wire_store_the_rows_their_dicts_store(store: IncidentStore) -> None:
    """Records as the supervisor holds them (decoded from a packed batch: typed fields, sources a view
    over the batch's columns) are stored as the rows of the dicts they were sent as."""
    nan, inf = float("nan"), float("inf")
    sent = [
        {"step": 7, "rank": 0, "world_size": 2, "loss": 2.5, "tokens": 2048, "lr": 3e-4, "grad_norm": 1.25,
         "param_norm": 100.0, "update_norm": 0.03, "overflow": False, "nonfinite": False, "seq_len_max": 256,
         "sources": {"web": {"tokens": 1024, "loss_sum": 2560.0}, "code": {"tokens": 1024, "loss_sum": nan}},
         "samples": ["web:1", "code:2"], "events": ["checkpoint_saved", "x" * 81], "attrs": {"batch": 7}},
        {"step": 7, "rank": 1, "world_size": 2, "loss": nan, "tokens": 0, "lr": 3e-4, "grad_norm": inf,
         "param_norm": 100.0, "update_norm": 0.0, "overflow": True, "nonfinite": True, "seq_len_max": 2**40,
         "sources": {"web": {"tokens": 2048, "loss_sum": 0.0}}, "samples": [], "events": [], "attrs": {}},
    ]  # fmt: skip
    [(_, _, _, _, decoded)] = unpack(pack([(0, "link-0", None, [1, 2], sent)]))
    assert all(type(r) is Record for r in decoded) and type(decoded[0].sources) is SourceView
    a, b = store.open_incident("j", diagnosis()), store.open_incident("j", diagnosis())
    assert store.attach_series(a.id, decoded) == store.attach_series(b.id, sent) == 2
    assert dumps(store.series(a.id)) == dumps(store.series(b.id))
    first = store.series(a.id)[0]
    assert first["sources"] == {"web": {"tokens": 1024.0, "loss_sum": 2560.0}, "code": {"tokens": 1024.0}}
    assert first["update_ratio"] == pytest.approx(0.03 / 100.0) and first["events"] == ["checkpoint_saved"]


def test_text_keys_never_reach_the_database(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis(), payload={"batch": {"ids": ["a"], "text": "RAW"}})
    ev = store.record(
        inc.id, "replayed", actor="r", payload={"sample_text": "RAW", "n": 1}, result={"content": "RAW"}
    )
    assert ev.payload == {"n": 1} and ev.result == {}
    assert store.timeline(inc.id)[0].payload["batch"] == {"ids": ["a"]}


def test_a_failing_transaction_leaves_nothing_behind(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    with pytest.raises(RuntimeError), store.transaction():
        store.record(inc.id, "froze", actor="r")
        store.transition(inc.id, "frozen", "x", actor="r")
        raise RuntimeError("action crashed before commit")
    assert [e.kind for e in store.timeline(inc.id)] == [EventKind.DETECTED]
    assert store.get(inc.id).state == IncidentState.OPEN


def test_update_diagnosis_refines_and_appends(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    store.update_diagnosis(
        inc.id, diagnosis(phenotype="slow_recovery", causes=[{"cause": "optimizer", "score": 0.7}])
    )
    again = store.get(inc.id)
    assert (again.phenotype, again.top_cause) == ("slow_recovery", "optimizer")
    assert store.timeline(inc.id)[-1].kind == EventKind.DIAGNOSED


def test_nonfinite_values_round_trip(store: IncidentStore) -> None:
    d = diagnosis(
        first_anomaly={"step": 99, "metric": "grad_norm", "rank": 0, "value": float("inf"), "z": None}
    )
    inc = store.open_incident("j", d)
    stored = store.get(inc.id).diagnosis
    assert stored is not None and stored.first_anomaly is not None
    assert stored.first_anomaly.value == float("inf")
    assert inc.to_json()["diagnosis"]["first_anomaly"]["value"] == "Infinity"


def test_replayed_steps_never_overwrite_the_original_run(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    store.attach_series(inc.id, [{"step": 100, "rank": 1, "loss": 7.0}])
    store.attach_series(inc.id, [{"step": 100, "rank": 1, "loss": 2.9}], replay=1)
    assert store.series(inc.id) == [{"step": 100, "rank": 1, "loss": 7.0}]
    assert store.series(inc.id, replay=1) == [{"step": 100, "rank": 1, "loss": 2.9, "replay": 1}]
    assert [r.get("replay") for r in store.series(inc.id, replay=None)] == [None, 1]


def test_a_jobs_database_sits_in_its_local_storage_root(tmp_path: Path) -> None:
    spec = {"name": "j", "entrypoint": "m:f", "max_steps": 1, "storage": {"path": str(tmp_path / "runs")}}
    store = open_for_job(JobSpec.model_validate(spec))
    assert store.path == tmp_path / "runs" / "incidents.sqlite" and store.path.is_file()
    s3 = JobSpec.model_validate({**spec, "storage": {"path": "s3://bucket/runs"}})
    assert db_path_for_job(s3).name == "incidents.sqlite" and "spike-supervisor" in str(db_path_for_job(s3))
    explicit = JobSpec.model_validate({**spec, "incidents": {"db": str(tmp_path / "x.sqlite")}})
    assert db_path_for_job(explicit) == tmp_path / "x.sqlite"


# -- a database lost or foreign (issue 18) ----------------------------------------------------


def _cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from supervisor.cli.main import cli

    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def test_read_commands_never_create_or_change_a_database(tmp_path: Path) -> None:
    """Reported: `incidents list` on a 0-byte file printed "no incidents" and wrote a schema into it."""
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite at all\n" * 10)
    for path, needle in ((empty, "empty file, 0 bytes"), (junk, "file is not a database")):
        before = path.read_bytes()
        for args in (["incidents", "list", "--db", str(path)], ["incidents", "show", "1", "--db", str(path)]):
            code, out = _cli(*args)
            assert code == 2 and out.strip() == f"error: {path}: not an incident database ({needle})"
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name)) == [path.name]
    missing = tmp_path / "missing.sqlite"
    assert _cli("incidents", "list", "--db", str(missing))[0] == 2 and not missing.exists()
    with pytest.raises(IncidentStoreError, match="no incident database here"):
        IncidentStore(missing, read_only=True)


def test_read_only_store_refuses_old_schemas_and_writes(tmp_path: Path) -> None:
    import sqlite3

    from supervisor.incidents.schema import MIGRATIONS, _statements

    old = tmp_path / "old.sqlite"
    conn = sqlite3.connect(old)
    for statement in _statements(MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    before = old.read_bytes()
    code, out = _cli("incidents", "list", "--db", str(old))
    assert code == 2 and "schema version 1, this release reads 2" in out
    assert old.read_bytes() == before  # not migrated by a reader
    live = tmp_path / "live.sqlite"
    writer = IncidentStore(live)
    inc = writer.open_incident("job-a", diagnosis())
    reader = IncidentStore(live, read_only=True)
    assert [i.id for i in reader.list_incidents()] == [inc.id]
    with pytest.raises(IncidentStoreError, match="read-only"):
        reader.transition(inc.id, "frozen", "no", actor="cli")
    code, out = _cli("incidents", "list", "--db", str(live))
    assert code == 0 and "job-a" in out


def _exported_store(tmp_path: Path, rebuild: bool = True) -> tuple[IncidentStore, int, list]:
    from supervisor.incidents.export import export_incident, rebuild_from_exports
    from supervisor.storage import open_backend

    backend = open_backend(str(tmp_path / "storage"))
    hook = (lambda s: rebuild_from_exports(s, backend, "job-a")) if rebuild else None
    store = IncidentStore(tmp_path / "incidents.sqlite", rebuild=hook)
    first = store.open_incident("job-a", diagnosis())
    store.transition(first.id, "frozen", "policy says freeze", actor="supervisor", step=103)
    second = store.open_incident("job-a", diagnosis())
    for inc in (first, second):
        export_incident(store, inc.id, backend, "job-a")
    return store, first.id, [(e.id, e.kind, e.payload) for e in store.timeline(first.id)]


@pytest.mark.parametrize("how", ["truncated", "deleted", "replaced"])
def test_a_lost_database_is_noticed_and_rebuilt_from_the_exports(tmp_path: Path, how: str) -> None:
    """Reported: truncating the live database mid-run went unnoticed (writes went on into the WAL)."""
    store, first, timeline = _exported_store(tmp_path)
    path = tmp_path / "incidents.sqlite"
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(0)
    elif how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    else:
        other = tmp_path / "other.sqlite"
        IncidentStore(other).close()
        other.replace(path)
    store.check_intact()
    [loss] = store.rebuilt
    assert loss["restored"] == [first, first + 1] and Path(loss["remnants"]).name.startswith(
        "incidents.sqlite.lost-"
    )
    assert [(e.id, e.kind, e.payload) for e in store.timeline(first)] == timeline  # same ids, same history
    assert store.get(first).state is IncidentState.FROZEN
    third = store.open_incident("job-a", diagnosis())  # and it goes on writing to the rebuilt file
    assert third.id == first + 2 and IncidentStore(path, read_only=True).get(third.id).job == "job-a"


def test_without_exports_a_lost_database_fails_loudly(tmp_path: Path) -> None:
    store, first, _ = _exported_store(tmp_path, rebuild=False)
    with open(tmp_path / "incidents.sqlite", "r+b") as f:
        f.truncate(0)
    with pytest.raises(IncidentStoreError, match=r"incident database shrank from \d+ to 0 bytes") as err:
        store.check_intact()
    assert err.value.exit_code == 3


def test_the_supervisors_store_rebuilds_from_the_jobs_storage(tmp_path: Path) -> None:
    """The wiring the runtime uses: `open_incident_store(job)` rebuilds from `<storage>/<job>/incidents/`."""
    from supervisor.checkpoint.lifecycle import open_checkpoint_store
    from supervisor.incidents.export import export_incident
    from supervisor.incidents.paths import open_incident_store

    job = JobSpec.model_validate(
        {"name": "job-a", "entrypoint": "m:f", "storage": {"path": str(tmp_path / "store")}, "max_steps": 10}
    )
    store = open_incident_store(job)
    inc = store.open_incident("job-a", diagnosis())
    export_incident(store, inc.id, open_checkpoint_store(job).backend, job.name)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    deadline = time.monotonic() + 30
    while not store.rebuilt:  # noticed on a use at most CHECK_INTERVAL_S after the last check
        assert time.monotonic() < deadline, "the lost file was never noticed"
        listed = [i.id for i in store.list_incidents(job="job-a")]
        time.sleep(0.05)
    assert listed == [inc.id] and store.rebuilt[0]["restored"] == [inc.id]
    # Seen as gone, or -- when another thread's first connection (the exporter's) recreated an
    # empty file at the path before the check ran, as happens on a loaded machine -- as replaced.
    assert store.rebuilt[0]["problem"] in (
        "incident database vanished while the supervisor had it open",
        "incident database was replaced by another file while the supervisor had it open",
    )
