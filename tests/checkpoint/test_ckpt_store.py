"""Commit protocol, manifests, health marks and the blockable `latest`: local and S3."""

from __future__ import annotations

import pytest

from supervisor.checkpoint import CheckpointStore
from supervisor.checkpoint.store import MANIFEST, archived_name, step_dir
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError
from tests.checkpoint.conftest import save_plain


def test_commit_writes_manifest_with_files_checksums_components(store: CheckpointStore) -> None:
    m = save_plain(store, 1200, world_size=2)
    assert store.steps() == [1200]
    assert m.world_size == 2 and m.health == HealthMark.UNVERIFIED
    assert m.components == ["model", "optimizer", "rng"]
    assert {f.rank for f in m.files} == {None, 0, 1}
    assert all(":" in f.checksum and f.size > 0 for f in m.files)
    assert store.manifest(1200) == m
    assert any(o.key.endswith(f"{step_dir(1200)}/{MANIFEST}") for o in store.backend.list(store.root))
    assert store.latest() == 1200


def test_files_without_manifest_do_not_exist_for_readers(store: CheckpointStore) -> None:
    store.write_file(5, "model", lambda f: f.write(b"x" * 100), components=["model"])
    assert store.steps() == []
    with pytest.raises(CheckpointError, match="no checkpoint at step 5"):
        store.manifest(5)
    assert store.latest() is None


def test_commit_refuses_a_file_that_is_not_there(store: CheckpointStore) -> None:
    entry = store.write_file(7, "model", lambda f: f.write(b"abc"), components=["model"])
    store.backend.delete([store.key(7, entry.name)])
    with pytest.raises(CheckpointError, match="missing or wrong size"):
        store.commit(7, world_size=1, files=[entry])
    assert store.steps() == []


def test_latest_advances_only_forward(store: CheckpointStore) -> None:
    save_plain(store, 100)
    save_plain(store, 200)
    save_plain(store, 150)  # e.g. a re-save after a rollback: never moves latest backwards
    assert store.latest() == 200


def test_block_holds_latest_and_survives_a_new_store_instance(store: CheckpointStore) -> None:
    save_plain(store, 100)
    store.block("incident 7 open", incident=7)
    save_plain(store, 200)
    assert store.steps() == [100, 200]  # saves still happen
    reopened = CheckpointStore(store.backend, store.job)  # a restarted supervisor
    state = reopened.block_state()
    assert state is not None and [h.incident for h in state.holders] == ["7"] and state.latest_at_block == 100
    save_plain(reopened, 300)
    assert reopened.latest() == 100
    reopened.block("second incident", incident="8")
    assert reopened.unblock(7) is not None  # incident 8 still holds it
    save_plain(reopened, 400)
    assert reopened.latest() == 100
    assert reopened.unblock("8") is None
    save_plain(reopened, 500)
    assert reopened.latest() == 500


def test_latest_retreats_to_a_rollback_target_even_while_blocked(store: CheckpointStore) -> None:
    for step in (100, 120, 140):
        save_plain(store, step)
    store.block("incident 1 open", incident=1)
    store.retreat_latest(100)  # training went back to 100: 120 and 140 are the abandoned timeline
    assert store.latest() == 100
    store.retreat_latest(120)  # never forward
    assert store.latest() == 100
    save_plain(store, 120)  # the new timeline's save while blocked: latest stays put
    assert store.latest() == 100
    store.unblock(1)
    save_plain(store, 160)
    assert store.latest() == 160
    store.retreat_latest(-1)  # a restart from scratch: no pointer at all
    assert store.latest() is None and store.steps() == [100, 120, 140, 160]


def test_diagnostic_snapshot_never_advances_latest(store: CheckpointStore) -> None:
    save_plain(store, 100)
    m = save_plain(store, 110, mark=HealthMark.DIAGNOSTIC)
    assert m.health == HealthMark.DIAGNOSTIC and m.history[-1].reason == "marked at save"
    assert store.latest() == 100


def test_health_transitions_are_recorded_and_invalid_ones_refused(store: CheckpointStore) -> None:
    save_plain(store, 10)
    with pytest.raises(CheckpointError, match="valid: diagnostic, quarantined, verified"):
        store.mark(10, HealthMark.HEALTHY, "skip verification")
    store.mark(10, HealthMark.VERIFIED, "checked")
    m = store.mark(10, HealthMark.HEALTHY, "window 0-60 clean")
    assert [(h.from_, h.to, h.reason) for h in m.history] == [
        (HealthMark.UNVERIFIED, HealthMark.VERIFIED, "checked"),
        (HealthMark.VERIFIED, HealthMark.HEALTHY, "window 0-60 clean"),
    ]
    assert CheckpointStore(store.backend, store.job).manifest(10).health == HealthMark.HEALTHY
    with pytest.raises(CheckpointError, match="needs a reason"):
        store.mark(10, HealthMark.QUARANTINED, " ")


def test_healthy_checkpoint_is_never_replaced_by_a_resave(store: CheckpointStore) -> None:
    save_plain(store, 10)
    store.mark(10, HealthMark.VERIFIED, "ok")
    store.mark(10, HealthMark.HEALTHY, "ok")
    with pytest.raises(CheckpointError, match="already holds a healthy checkpoint"):
        save_plain(store, 10)
    assert store.manifest(10).health == HealthMark.HEALTHY


def test_resave_of_unverified_step_keeps_old_files_until_commit(store: CheckpointStore) -> None:
    old = save_plain(store, 20)
    new = save_plain(store, 20)
    assert {f.name for f in old.files}.isdisjoint({f.name for f in new.files})
    assert store.manifest(20) == new


def test_resave_over_a_quarantined_step_keeps_it_as_history(store: CheckpointStore) -> None:
    old = save_plain(store, 30)
    store.mark(30, HealthMark.QUARANTINED, "checksum mismatch in model")
    assert store.history(30) == []
    new = save_plain(store, 30)  # the new timeline saves step 30 again
    assert store.manifest(30) == new and new.health == HealthMark.UNVERIFIED
    (kept,) = store.history(30)
    assert kept.health == HealthMark.QUARANTINED and kept.history[-1].reason == "checksum mismatch in model"
    assert [f.name for f in kept.files] == [f.name for f in old.files]
    names = set(store.step_dirs()[30])
    assert {f.name for f in old.files} <= names  # its files are still there
    assert [n for n in names if n.startswith("MANIFEST.quarantined.")] == [archived_name(kept)]
    assert store.steps() == [30] and [m.step for m in store.manifests()] == [30]


def test_resave_at_a_snapshot_step_keeps_the_snapshot_as_history(store: CheckpointStore) -> None:
    # A rollback's new timeline reaches the step an incident's snapshot was taken at: the periodic
    # save goes on (training must not die on it) and the evidence stays, files and all.
    snap = save_plain(store, 140, mark=HealthMark.DIAGNOSTIC)
    new = save_plain(store, 140)
    assert store.manifest(140) == new and new.health == HealthMark.UNVERIFIED
    assert [m.health for m in store.saves(140)] == [HealthMark.DIAGNOSTIC, HealthMark.UNVERIFIED]
    (kept,) = store.history(140)
    assert [f.name for f in kept.files] == [f.name for f in snap.files]
    assert {f.name for f in snap.files} <= set(store.step_dirs()[140])
    assert store.latest() == 140  # the new timeline's save advances latest; the snapshot never did


def test_kept_history_survives_garbage_collection_and_goes_with_its_step(store: CheckpointStore) -> None:
    from supervisor.checkpoint import collect_garbage
    from supervisor.checkpoint.store import StoreSettings

    old = save_plain(store, 40)
    store.mark(40, HealthMark.QUARANTINED, "abandoned timeline")
    save_plain(store, 40)
    stale = CheckpointStore(store.backend, store.job, StoreSettings(stale_uncommitted_s=0))
    assert collect_garbage(stale, keep=3).orphans_deleted == 0  # history is not a killed writer's leftovers
    assert {f.name for f in old.files} <= set(store.step_dirs()[40]) and len(store.history(40)) == 1
    store.mark(40, HealthMark.QUARANTINED, "bad")
    save_plain(store, 50)
    store.mark(50, HealthMark.VERIFIED, "ok")
    store.mark(50, HealthMark.HEALTHY, "ok")
    assert collect_garbage(stale, keep=1).deleted == [40]
    assert 40 not in store.step_dirs()


def test_resave_of_an_unjudged_step_keeps_no_history(store: CheckpointStore) -> None:
    save_plain(store, 60)
    save_plain(store, 60)
    assert store.history(60) == []


def test_corrupt_manifest_is_a_one_line_checkpoint_error_and_skipped_in_listings(
    store: CheckpointStore,
) -> None:
    save_plain(store, 1)
    save_plain(store, 2)
    store.backend.put_bytes(store.key(2, MANIFEST), b"{not json")
    with pytest.raises(CheckpointError, match="corrupt manifest"):
        store.manifest(2)
    assert [m.step for m in store.manifests()] == [1]


def test_damaged_latest_pointer_is_replaced_by_the_next_commit(store: CheckpointStore) -> None:
    save_plain(store, 100)
    store.backend.put_bytes(f"{store.root}/latest", b"garbage")
    with pytest.raises(CheckpointError, match="unreadable latest pointer"):
        store.latest()
    save_plain(store, 200)
    assert store.latest() == 200
