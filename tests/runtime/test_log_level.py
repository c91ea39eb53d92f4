"""`--log-level` reaches the actors: the supervisor and every worker log at the launching CLI's level."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import logging as slog
from supervisor.config.runtime import RuntimeSettings
from supervisor.ranks.worker import TrainWorker
from tests.runtime.conftest import make_job


@pytest.fixture(autouse=True)
def restore_level() -> Iterator[None]:
    yield
    slog.configure("info")


def test_settings_carry_the_level_the_cli_configured() -> None:
    slog.configure("warning", json_output=True)
    assert RuntimeSettings.model_validate({}).log_level == "warning"
    slog.configure("debug", json_output=True)
    assert RuntimeSettings.model_validate({}).log_level == "debug"
    # What travels to an actor is the value, not the factory: the actor's own default does not win.
    slog.configure("info", json_output=True)
    assert RuntimeSettings.model_validate({"log_level": "error"}).log_level == "error"


def test_a_worker_logs_at_the_level_in_its_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slog.configure("debug", json_output=True)  # the worker process's own default, before the actor starts
    settings = RuntimeSettings.model_validate({"log_level": "error"}).model_dump()
    worker = TrainWorker(make_job(tmp_path, "quiet").model_dump(mode="json"), 0, 1, 0, settings)
    capsys.readouterr()
    worker.log.warning("below the level")
    worker.log.error("at the level")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["event"], e["level"], e["rank"]) for e in lines] == [("at the level", "error", 0)]
