"""Fixtures of the incident tests: a store, a realistic incident, a headless browser, an S3 server."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.incidents import IncidentStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    s = IncidentStore(tmp_path / "incidents.sqlite")
    yield s
    s.close()


# -- a headless browser -----------------------------------------------------------------------


def _install_chromium() -> str | None:
    found = shutil.which("chromium")
    if found or shutil.which("apt-get") is None or os.geteuid() != 0:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "install", "-y", "chromium"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "chromium"],
    ):
        subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
        if shutil.which("chromium"):
            break
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium() -> str:
    path = _install_chromium()
    if path is None:
        pytest.skip("chromium is not installed and `apt-get install -y chromium` was not possible here")
    return path


# -- S3 (moto's server over HTTP on 127.0.0.1) -------------------------------------------------


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An endpoint URL of a fresh moto S3 server with bucket ``incidents-test``."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="incidents-test")
    yield url
    server.stop()
