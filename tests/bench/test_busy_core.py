"""The busy-core process of the matrix and the sampler (``bench.matrix.run.BusyCore``) dies with
the bench that started it, even one killed before it could clean up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_spinner_exits_when_its_bench_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom bench.matrix.run import BusyCore\nb = BusyCore().__enter__()\n"
         "print(b.proc.pid, flush=True)\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert parent.stdout is not None
    spinner = int(parent.stdout.readline())
    try:
        assert _alive(spinner)
        os.kill(parent.pid, signal.SIGKILL)  # no __exit__: the bench died
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(spinner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(spinner)
    finally:
        if _alive(spinner):
            os.kill(spinner, signal.SIGKILL)  # by PID: only the process this test started
