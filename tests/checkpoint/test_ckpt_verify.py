"""Verification, rollback target selection and retention, with damaged checkpoints: local and S3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.checkpoint import (
    CheckpointStore,
    collect_garbage,
    select_restart_target,
    select_rollback_target,
    verify,
)
from supervisor.checkpoint.hashing import available
from supervisor.checkpoint.store import MANIFEST, StoreSettings
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError
from supervisor.storage import open_backend
from tests.checkpoint.conftest import entry_key, make_healthy, save_plain


def _flip_byte(store: CheckpointStore, key: str, at: int = 100) -> None:
    data = bytearray(store.backend.get_bytes(key))
    data[at] ^= 0x01
    store.backend.put_bytes(key, bytes(data))


def test_clean_checkpoint_verifies_and_is_recorded(store: CheckpointStore) -> None:
    save_plain(store, 10, world_size=2)
    result = verify(store, 10, expected_world_size=2)
    assert result.ok and result.problems == []
    m = store.manifest(10)
    assert m.health == HealthMark.VERIFIED
    assert m.last_verification is not None and m.last_verification.ok
    assert m.last_verification.checks == ["files", "checksums", "components", "world_size"]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("flip", "checksum mismatch"),
        ("truncate", "truncated"),
        ("delete", "file missing"),
    ],
)
def test_damaged_shard_fails_verification_and_is_quarantined(
    store: CheckpointStore, damage: str, problem: str
) -> None:
    save_plain(store, 10)
    key = entry_key(store, 10, "optimizer")
    if damage == "flip":
        _flip_byte(store, key)
    elif damage == "truncate":
        store.backend.put_bytes(key, store.backend.get_bytes(key)[:-10])
    else:
        store.backend.delete([key])
    result = verify(store, 10)
    assert not result.ok and problem in result.problems[0]
    m = store.manifest(10)
    assert m.health == HealthMark.QUARANTINED and problem in m.history[-1].reason


def test_missing_manifest_means_no_checkpoint(store: CheckpointStore) -> None:
    save_plain(store, 10)
    store.backend.delete([store.key(10, MANIFEST)])
    with pytest.raises(CheckpointError, match="no checkpoint at step 10"):
        verify(store, 10)


def test_missing_component_and_missing_rank_fail(store: CheckpointStore) -> None:
    files = [store.write_file(3, "model", lambda f: f.write(b"m" * 10), components=["model"])]
    files.append(
        store.write_file(3, "opt", lambda f: f.write(b"o" * 10), rank=0, components=["optimizer", "rng"])
    )
    store.commit(3, world_size=2, files=files)  # rank 1's files never arrived
    result = verify(store, 3, record=False)
    assert "component 'optimizer' missing for ranks [1]" in result.problems
    assert store.manifest(3).health == HealthMark.UNVERIFIED  # record=False leaves the manifest alone


def test_world_size_mismatch_is_a_note_for_replicated_state(store: CheckpointStore) -> None:
    save_plain(store, 4, world_size=2)
    result = verify(store, 4, expected_world_size=4)
    assert result.ok and "world size 2, job has 4" in result.notes[0]


def test_rollback_target_is_newest_healthy_before_onset_minus_margin(store: CheckpointStore) -> None:
    for step in (100, 200, 300):
        make_healthy(store, step)
    save_plain(store, 350)  # unverified: never a target
    save_plain(store, 250, mark=HealthMark.DIAGNOSTIC)
    target = select_rollback_target(store, onset_step=330, margin=50, deep=False)
    assert target.step == 200 and target.rejected == []


def test_rollback_falls_back_when_reverification_fails(store: CheckpointStore) -> None:
    make_healthy(store, 100)
    make_healthy(store, 200)
    _flip_byte(store, entry_key(store, 200, "model"))  # bit rot after it was marked healthy
    target = select_rollback_target(store, onset_step=500, margin=100, deep=False)
    assert target.step == 100
    assert target.rejected[0][0] == 200 and "checksum mismatch" in target.rejected[0][1]
    assert store.manifest(200).health == HealthMark.QUARANTINED
    assert select_rollback_target(store, onset_step=500, margin=100, deep=False).step == 100


def test_no_rollback_target_is_a_clear_error(store: CheckpointStore) -> None:
    make_healthy(store, 100)
    with pytest.raises(CheckpointError, match="no healthy checkpoint at or before step 50"):
        select_rollback_target(store, onset_step=80, margin=30, deep=False)


def test_retention_keeps_k_healthy_protected_latest_and_unjudged(store: CheckpointStore) -> None:
    for step in (100, 200, 300, 400):
        make_healthy(store, step)
    save_plain(store, 450, mark=HealthMark.DIAGNOSTIC)  # snapshot of an open incident
    save_plain(store, 460, mark=HealthMark.DIAGNOSTIC)  # snapshot of a closed one
    save_plain(store, 500)  # newer than the newest healthy: not judged yet
    store.mark(100, HealthMark.VERIFIED, "window had an anomaly after all")
    report = collect_garbage(store, keep=2, protected={200, 450})
    assert report.deleted == [100, 460]
    assert store.steps() == [200, 300, 400, 450, 500]
    assert not any(o.key.startswith(store.key(100, "")) for o in store.backend.list(store.root))


def test_gc_removes_stale_uncommitted_files_of_killed_writers(store: CheckpointStore) -> None:
    save_plain(store, 100)
    store.write_file(
        200, "model", lambda f: f.write(b"half"), components=["model"]
    )  # writer died before commit
    fresh = collect_garbage(store, keep=3)
    assert fresh.orphans_deleted == 0  # may belong to a save in flight
    stale = CheckpointStore(store.backend, store.job, StoreSettings(stale_uncommitted_s=0))
    assert collect_garbage(stale, keep=3).orphans_deleted == 1
    assert list(store.step_dirs()) == [100]


def test_restart_target_is_newest_verified_never_a_broken_latest(store: CheckpointStore) -> None:
    make_healthy(store, 100)
    save_plain(store, 200)  # unverified, intact: verified on the way
    save_plain(store, 300)  # unverified, broken: quarantined on the way
    _flip_byte(store, entry_key(store, 300, "optimizer"))
    save_plain(store, 350, mark=HealthMark.DIAGNOSTIC)
    assert store.latest() == 300
    target = select_restart_target(store)
    assert target is not None and target.step == 200 and target.health == HealthMark.VERIFIED
    assert store.manifest(300).health == HealthMark.QUARANTINED
    assert select_restart_target(store, verify_unverified=False) is not None


@pytest.mark.parametrize("algorithm", ["xxh3_128", "crc32", "adler32", "sha256", "blake2b"])
def test_every_checksum_algorithm_catches_a_flipped_byte(algorithm: str, tmp_path: Path) -> None:
    if not available(algorithm):
        pytest.skip(f"{algorithm} not installed")
    writer = CheckpointStore(open_backend(str(tmp_path)), "job1", StoreSettings(checksum=algorithm))
    save_plain(writer, 1)
    assert all(f.checksum.startswith(f"{algorithm}:") for f in writer.manifest(1).files)
    reader = CheckpointStore(
        open_backend(str(tmp_path)), "job1"
    )  # another default: the file says how to check it
    assert verify(reader, 1, record=False).ok
    _flip_byte(reader, entry_key(reader, 1, "model"), at=4000)
    assert "checksum mismatch" in verify(reader, 1, record=False).problems[0]


def test_a_sharded_checkpoint_another_world_size_cannot_load_is_passed_over_never_quarantined(
    store: CheckpointStore,
) -> None:
    """Sharded state saved by 4 ranks cannot load on 2 (a group restarted on fewer ranks): that is
    this job's limit, not damage. The checkpoint is not a target now, and stays healthy for a group
    of 4 again."""
    files = [
        store.write_file(
            6, f"shard{r}", lambda f: f.write(os.urandom(64)), rank=r, components=["model", "optimizer"]
        )
        for r in range(4)
    ]
    store.commit(6, world_size=4, files=files, layout="sharded")
    assert verify(store, 6, expected_world_size=4).ok
    store.mark(6, HealthMark.HEALTHY, "the window after it was clean")
    result = verify(store, 6, expected_world_size=2)
    assert not result.ok and "sharded state cannot be resharded" in result.problems[0]
    assert store.manifest(6).health is HealthMark.HEALTHY
    assert verify(store, 6, expected_world_size=4).ok and store.manifest(6).health is HealthMark.HEALTHY
