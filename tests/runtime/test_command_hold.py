"""A command entrypoint's own process holds at its last step like an in-process one: the SDK in
the script waits at the boundary after its last step, applies what the supervisor sends, and
ends only on ``Finish`` (issue 14: "the end of training is not the end of an incident").

The worker actor's side is the real socket server (``ranks.process_link.LinkServer``) over a
stand-in for the rank's ``SupervisorLink``; the script is a real process running the SDK."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.job import JobSpec
from supervisor.ranks.process_link import LinkServer
from supervisor.sdk.directives import ApplyOverrides, Finish

SCRIPT = """
import torch
from supervisor import sdk

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
probe = sdk.watch(model, optimizer, max_steps=3)
while probe.proceed():  # the boundary after step 3 is where the rank holds
    loss = model(torch.ones(4, 2)).pow(2).mean()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    optimizer.step()
    optimizer.zero_grad()
    probe.record(loss, grad_norm=grad_norm, tokens=4)
probe.close()
print("done", probe.step_count, flush=True)
"""


class Link:
    """The rank's SupervisorLink as the socket server sees it: a sink and a directive queue."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.directives: deque[dict[str, Any]] = deque()
        self.lock = threading.Lock()

    def sink(self, batch: list[dict[str, Any]]) -> None:
        with self.lock:
            self.records.extend(batch)

    def take_directives(self) -> list[dict[str, Any]]:
        out = list(self.directives)
        self.directives.clear()
        return out

    def events(self) -> list[str]:
        with self.lock:
            return [e for r in self.records for e in r.get("events") or ()]


def wait(pred: Any, proc: subprocess.Popen[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"not reached; exit {proc.poll()}")
        time.sleep(0.05)


@pytest.mark.slow
def test_the_script_holds_at_its_last_step_applies_the_fix_and_ends_on_finish(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = JobSpec.model_validate({"name": "held", "entrypoint": f"python {script}", "max_steps": 3,
                                  "storage": {"path": str(tmp_path / "store")}})  # fmt: skip
    link = Link()
    server = LinkServer(link, poll_interval_s=0.02)
    env = {**os.environ, "SUPERVISOR_SOCKET": server.path, "SUPERVISOR_JOB": job.model_dump_json(),
           "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": os.getcwd()}  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait(lambda: "end_reached:3" in link.events(), proc)
        assert proc.poll() is None  # held, not ended
        link.directives.append(ApplyOverrides(grad_clip=0.5, id="fix").to_dict())
        wait(lambda: "directive_applied:fix:apply" in link.events(), proc)
        assert proc.poll() is None  # a fix does not release the hold
        link.directives.append(Finish(reason="no incident is left to handle", id="finish-s3").to_dict())
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == 0 and "done 3" in out
    assert "directive_applied:finish-s3:finish" in link.events()
