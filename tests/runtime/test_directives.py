"""DirectiveLog: ordered, idempotent by id, acknowledgements from record events."""

from __future__ import annotations

from supervisor.runtime.directives import DirectiveLog
from supervisor.sdk.directives import Freeze, RollbackInPlace


def test_append_is_idempotent_by_id_and_numbers_in_order() -> None:
    log = DirectiveLog()
    assert log.append(Freeze(id="a")) == 1
    assert log.append(RollbackInPlace(step=40, id="b")) == 2
    assert log.append(Freeze(id="a")) == 1
    assert [e["id"] for e in log.after(0)] == ["a", "b"]
    assert [e["id"] for e in log.after(1)] == ["b"]


def test_log_survives_a_round_trip_through_its_entries() -> None:
    log = DirectiveLog()
    log.append(Freeze(id="a"))
    again = DirectiveLog(log.entries)
    assert again.append(RollbackInPlace(step=1, id="b")) == 2
    assert again.has("a")


def test_acks_and_failures_are_read_from_events() -> None:
    log = DirectiveLog()
    log.note_events(0, 12, ["directive_applied:a:freeze", "checkpoint_saved"])
    log.note_events(1, 12, ["directive_failed:b:rollback"])
    assert log.acked_by("a") == {0: 12}
    assert log.failed_on("b") == {1: 12}
    assert log.acked_by("b") == {}


def test_acks_reported_by_a_worker_link_count_once() -> None:
    log = DirectiveLog()
    log.note_applied(1, {"a": "freeze"}, 30)
    log.note_applied(1, {"a": "freeze"}, 31)
    assert log.acked_by("a") == {1: 30}
