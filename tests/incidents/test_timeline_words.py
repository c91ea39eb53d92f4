"""The timeline says what happened in words: the time an incident cost, noted at the end of a run,
read "Note: time lost {'downtime_s': 18.69, 'retrain_s': 0.05, 'rollbacks': [[101, 100]], ...}"."""

from __future__ import annotations

from supervisor.incidents import EventKind, EventStatus
from supervisor.incidents.models import Event
from supervisor.incidents.timeline import describe


def _note(payload: dict[str, object]) -> Event:
    return Event(id=1, incident_id=1, kind=EventKind.NOTE, wall_time=0.0, step=300, actor="supervisor",
                 payload=payload, status=EventStatus.DONE, result=None, finished_at=None, action_id=None)  # fmt: skip


def test_the_time_an_incident_cost_is_said_in_words() -> None:
    lost = {"downtime_s": 18.69, "retrain_s": 0.05, "rollbacks": [[101, 100]], "steps_retrained": 1}
    text = describe(_note({"time_lost": lost}))
    assert text == "Time lost to this incident: 1 step(s) re-trained in 0.1 s; training stood still 18.7 s."
    assert "{" not in describe(_note({"time_lost": {"downtime_s": 7300}}))
