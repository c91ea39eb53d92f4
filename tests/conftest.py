"""Shared fixtures. ``s3_endpoint``: a real S3 HTTP endpoint on loopback (moto's standalone server).

Use it with boto3 over HTTP exactly as production does, e.g.::

    from tests.s3support import make_bucket

    def test_x(s3_endpoint):
        uri = make_bucket(s3_endpoint)            # -> "s3://<fresh bucket>"
        backend = open_backend(uri + "/prefix", endpoint_url=s3_endpoint)

or the ``s3_uri`` fixture (a fresh bucket per test). Credentials are fake and set in the
environment for the session, so boto3's standard chain finds them.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator

import pytest

from tests.s3support import free_port, make_bucket

# A crash after the last test (at interpreter exit, in a Ray, gloo or storage-client thread) must
# print every thread's stack. pytest's own faulthandler plugin stops at pytest_unconfigure, and
# re-enables the handler afterwards only when it was on before pytest configured: this file is
# loaded before that, so it is.
if not faulthandler.is_enabled():
    faulthandler.enable(file=sys.__stderr__, all_threads=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop what tests may have left running in this process before the interpreter tears down
    (a daemon thread still inside a C extension while modules are freed can crash the exit)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    export = sys.modules.get("supervisor.incidents.export")
    if export is not None:
        export.close_all()


@pytest.fixture(autouse=True)
def _incident_exporters_closed() -> Iterator[None]:
    """An incident store opened the way the runtime opens it exports on a thread of its own, paced
    (a full export at most every few seconds). Left running, it writes -- and logs -- during a later
    test: an ``incident_exported`` line inside another command's captured JSON output. Each test's
    exporters are flushed and stopped when it ends."""
    yield
    export = sys.modules.get("supervisor.incidents.export")
    if export is not None:
        export.close_all(timeout_s=10.0)


@pytest.fixture(autouse=True)
def _process_logging_restored() -> Iterator[None]:
    """A test that runs a CLI command in this process (click's runner) makes it one of "our own"
    processes: ``supervisor.logging.configure`` routes every later line to structlog's printer on
    that command's captured stream, closed once the command returns. Later tests then see no SDK
    log line in caplog and a closed file on the next warning. Each test starts as a host process."""
    from supervisor import logging as sv_logging

    before = (sv_logging._configured, sv_logging._level)
    yield
    if (sv_logging._configured, sv_logging._level) != before:
        import structlog

        sv_logging._configured, sv_logging._level = before
        structlog.reset_defaults()


_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_PROXY": "127.0.0.1,localhost",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1 (random free port), for the whole session."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in [*_FAKE_ENV, "AWS_PROFILE"]}
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update(_FAKE_ENV)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_uri(s3_endpoint: str) -> str:
    """A fresh, empty bucket as ``s3://<name>``."""
    return make_bucket(s3_endpoint)


@pytest.fixture
def s3_fault_proxy(s3_endpoint: str) -> Iterator[object]:
    """A ``s3faults.FaultProxy`` in front of the moto server; point boto3 at ``proxy.url``."""
    from tests.s3faults import FaultProxy

    proxy = FaultProxy(s3_endpoint)
    try:
        yield proxy
    finally:
        proxy.close()
