"""The kill points of the kill-anywhere drills that need no Ray (issue 29): the first second of an
action of the plan (an effect boundary: the action before it was just recorded done), in
``detach`` or ``foreground`` mode; the scenario checks its fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from supervisor.drills.kill import reached
from supervisor.drills.scenario import Kill


def status(action: str | None, began: float | None) -> dict:
    return {"step": 150, "frozen": False, "incident": {"action": action, "action_began": began}}


def test_action_began_is_the_first_second_of_that_action() -> None:
    kill = Kill(at="action_began", action="observe")
    assert reached(kill, status("observe", 100.0), now=100.3)
    assert not reached(kill, status("observe", 100.0), now=101.2)  # too late: not the first second
    assert not reached(kill, status("apply", 100.0), now=100.3)
    assert not reached(kill, status("observe", None), now=100.3)  # a supervisor that does not say when
    assert not reached(kill, {"step": 150}, now=100.3)


def test_kill_fields_are_checked() -> None:
    assert Kill(at="action_began", action="apply", mode="foreground", delay_s=1).mode == "foreground"
    for bad in ({"at": "action_began"}, {"at": "observing", "action": "observe"},
                {"at": "action_began", "action": "nap"}, {"at": "observing", "mode": "sideways"}):  # fmt: skip
        with pytest.raises(ValidationError):
            Kill(**bad)
