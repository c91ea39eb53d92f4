"""The end-to-end tests' status poll (``conftest.wait_for``): a supervisor that could not answer one
``api.status`` call in time (a just placed actor on a loaded machine) is asked again until the
deadline, while one that died fails the test at once."""

from __future__ import annotations

from typing import Any

import pytest
from ray.exceptions import GetTimeoutError, RayActorError

from supervisor.errors import RuntimeBackendError
from tests.runtime.conftest import wait_for


def _no_answer(cause: Exception) -> RuntimeBackendError:
    """What ``api.status`` raises when the actor's call fails with ``cause``."""
    try:
        raise cause
    except type(cause):
        try:
            raise RuntimeBackendError(f"the supervisor does not answer: {type(cause).__name__}") from None
        except RuntimeBackendError as exc:
            return exc


def test_a_status_call_that_timed_out_is_asked_again() -> None:
    answers: list[Any] = [
        _no_answer(GetTimeoutError("10 s")),
        _no_answer(GetTimeoutError("10 s")),
        {"step": 5},
    ]

    def status() -> dict[str, Any]:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return dict(got)

    assert wait_for(status, lambda s: s["step"] >= 5, 30) == {"step": 5}
    assert answers == []


def test_a_dead_supervisor_fails_at_once() -> None:
    calls = []

    def status() -> dict[str, Any]:
        calls.append(1)
        raise _no_answer(RayActorError())

    with pytest.raises(RuntimeBackendError, match="RayActorError"):
        wait_for(status, lambda s: True, 30)
    assert len(calls) == 1


def test_a_supervisor_that_never_answers_fails_at_the_deadline() -> None:
    def status() -> dict[str, Any]:
        raise _no_answer(GetTimeoutError("10 s"))

    with pytest.raises(AssertionError, match=r"last status: no answer in time \(GetTimeoutError\)"):
        wait_for(status, lambda s: True, 0.5)
