"""A CheckpointStore on a local directory and on S3 over HTTP; the same tests run on both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.checkpoint import CheckpointStore, Manifest
from supervisor.core.model import HealthMark
from supervisor.storage import open_backend
from tests.s3support import fast_s3_settings


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    if request.param == "local":
        return CheckpointStore(open_backend(str(tmp_path / "storage")), "job1")
    endpoint = request.getfixturevalue("s3_endpoint")
    uri = request.getfixturevalue("s3_uri")
    backend = open_backend(
        f"{uri}/runs", settings=fast_s3_settings(endpoint, spool_dir=str(tmp_path / "spool"))
    )
    return CheckpointStore(backend, "job1")


def save_plain(
    store: CheckpointStore,
    step: int,
    *,
    world_size: int = 1,
    size: int = 4096,
    mark: HealthMark = HealthMark.UNVERIFIED,
) -> Manifest:
    """A checkpoint of random bytes: a shared model file and per-rank optimizer + rng files."""
    files = [store.write_file(step, "model", lambda f: f.write(os.urandom(size)), components=["model"])]
    for rank in range(world_size):
        files.append(
            store.write_file(
                step,
                f"optimizer.rank{rank}",
                lambda f: f.write(os.urandom(size)),
                rank=rank,
                components=["optimizer"],
            )
        )
        files.append(
            store.write_file(
                step, f"state.rank{rank}", lambda f: f.write(os.urandom(64)), rank=rank, components=["rng"]
            )
        )
    return store.commit(step, world_size=world_size, files=files, metrics={"loss": 2.5}, mark=mark)


def make_healthy(store: CheckpointStore, step: int) -> Manifest:
    from supervisor.checkpoint import verify

    save_plain(store, step)
    assert verify(store, step).ok
    return store.mark(step, HealthMark.HEALTHY, "window clean")


def entry_key(store: CheckpointStore, step: int, component: str) -> str:
    manifest = store.manifest(step)
    name = next(f.name for f in manifest.files if component in f.components)
    return store.key(step, name)
