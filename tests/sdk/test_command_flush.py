"""A command entrypoint's process (torchrun, a framework script) sends its buffered records to its
rank's worker every ``runtime.flush_interval_s`` of job.yaml; the setting was documented but read
nowhere, and the process always flushed every 0.05 s."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from supervisor.sdk import context
from supervisor.sdk.local_link import SOCKET_ENV
from tests.runtime.conftest import make_job


@pytest.mark.parametrize(("runtime", "interval"), [({}, 0.05), ({"flush_interval_s": 0.3}, 0.3)])
def test_a_command_entrypoints_records_flush_at_the_jobs_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: dict[str, float], interval: float
) -> None:
    path = Path("/tmp") / f"sv-flush-{tmp_path.name[-20:]}.sock"  # a socket path fits 107 bytes
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    job = make_job(tmp_path, "flush", runtime=runtime)
    monkeypatch.setenv(SOCKET_ENV, str(path))
    monkeypatch.setenv(context.JOB_ENV, job.model_dump_json())
    monkeypatch.setattr(context, "_env_ctx", None)
    ctx = context.from_env()
    try:
        assert ctx is not None
        assert ctx.transport._interval == interval
    finally:
        if ctx is not None:
            ctx.transport.close(timeout_s=1.0)
        server.close()
        path.unlink(missing_ok=True)
