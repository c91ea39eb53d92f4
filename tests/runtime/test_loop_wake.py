"""An idle supervisor loop waits for work, not for its clock.

The real controller's own loop (``Controller.run`` in a thread) with fake workers
(tests/runtime/harness.py) and an idle wait of a minute (``runtime.loop_interval_s``): records that
arrive, a stop a person asks for, and the workers' last records are each taken at once, so an idle
supervisor need not wake many times a second to react within one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.config.runtime import RuntimeSettings
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers

IDLE_WAIT_S = 60.0
"""The loop's idle wait here: far longer than any deadline below, so only a wake-up can meet one."""
DEADLINE_S = 20.0


def _until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S}s: {what}"
        time.sleep(0.01)


def test_records_a_stop_and_the_last_records_each_wake_the_idle_loop_at_once(tmp_path: Path) -> None:
    ranks = FakeRanks(2, 100)
    settings = RuntimeSettings.model_validate({**FAST.model_dump(), "loop_interval_s": IDLE_WAIT_S})
    ctl = Controller(make_job(tmp_path, "wake", max_steps=100), settings, workers=FakeWorkers(ranks))
    ended: list[JobPhase] = []
    loop = threading.Thread(target=lambda: ended.append(ctl.run()), name="test-loop", daemon=True)
    loop.start()
    try:
        _until(lambda: ctl.phase is JobPhase.RUNNING, "the group started")
        for step in range(1, 4):
            for rank in range(
                ranks.world_size
            ):  # every rank's record of the step, as an actor thread takes it
                ranks.send(ctl, rank, [ranks.record(step, rank)])
            ranks.step = step
            _until(lambda s=step: ctl.assembler.watermark == s, f"step {step} analysed")
        ctl.request_stop("asked by the test")
        _until(lambda: any(d["kind"] == "stop" for d in ctl.directives.after(0)), "the stop sent")
        ranks.boundary(ctl)  # the ranks take the stop and end (no controller pass of their own)
        ranks.control(ctl, ["stopped"])  # their last records
        loop.join(DEADLINE_S)
        assert not loop.is_alive(), "the loop did not end after the workers did"
        assert ended == [JobPhase.STOPPED], ctl.status()
    finally:
        if loop.is_alive():  # leave no loop behind a failed assert
            ctl.state.phase = JobPhase.FAILED
            ctl.request_stop("test over")
            loop.join(DEADLINE_S)
