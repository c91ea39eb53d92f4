"""The same backend contract, run against a local directory and a real S3 endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.storage import Backend, open_backend
from tests.s3support import fast_s3_settings


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return open_backend(str(tmp_path / "store"))
    endpoint = request.getfixturevalue("s3_endpoint")
    uri = request.getfixturevalue("s3_uri")
    return open_backend(
        f"{uri}/pre/fix", settings=fast_s3_settings(endpoint, spool_dir=str(tmp_path / "spool"))
    )
