"""Issue 29 point 5: a checkpoint whose files *and* recorded checksums were rewritten to match
passes verification, and only the restore check after loading it (each rank's restored shard
against the one saved) catches it. The rank that catches it quarantines it through
``CheckpointStore.quarantine``: never a target again, `latest` moved off it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from supervisor import sdk
from supervisor.checkpoint import CheckpointStore, verify
from supervisor.core.model import HealthMark
from supervisor.storage import open_backend
from tests.sdk.conftest import SEQ, make_run, train


@pytest.fixture(scope="module")
def dataset() -> Any:
    from examples.tinylm.data import build_dataset

    return build_dataset(seq_len=SEQ, max_bytes_per_source=40_000, seed=0)


def forge(victim: CheckpointStore, donor: CheckpointStore, step: int) -> None:
    """Replace ``step``'s state files in ``victim`` with the donor's and rewrite their sizes and
    checksums in the manifest to match: every file check passes, the state is another model's."""
    mine, theirs = victim.manifest(step), donor.manifest(step)
    by_suffix = {e.name.split("/", 1)[-1]: e for e in theirs.files}
    files = []
    for entry in mine.files:
        other = by_suffix.get(entry.name.split("/", 1)[-1])
        if other is None or entry.name.endswith(("rng.rank00000", ".pt")) and "dcp" not in entry.name:
            files.append(entry)
            continue
        with (
            donor.local_file(step, other.name, theirs) as src,
            victim.local_file(step, entry.name, mine) as dst,
        ):
            shutil.copyfile(src, dst)
        files.append(entry.model_copy(update={"size": other.size, "checksum": other.checksum}))
    victim.save_manifest(mine.model_copy(update={"files": files}))


def test_a_forged_checkpoint_caught_by_the_restore_check_is_quarantined(dataset: Any, tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    donor_store = CheckpointStore(open_backend(str(tmp_path / "donor")), "job")
    model, _, _, loader, probe, transport = make_run(dataset, checkpoint=store, checkpoint_every=4)
    train(model, loader, probe, 5)
    probe.steering.finish_saves()
    dm, _, _, dl, dp, _ = make_run(dataset, seed=1, checkpoint=donor_store, checkpoint_every=4)
    train(dm, dl, dp, 5)
    dp.steering.finish_saves()
    forge(store, donor_store, 4)
    assert verify(store, 4, deep=True).ok  # every file matches its (rewritten) checksum
    store.mark(4, HealthMark.VERIFIED, "verified")
    store.mark(4, HealthMark.HEALTHY, "window clean")
    store.advance_latest(4)
    assert store.latest() == 4

    transport.deliver(sdk.RollbackInPlace(step=4, id="rb1"))
    train(model, loader, probe, 1)
    probe.flush()
    assert transport.flush(5.0)
    seen = {e for r in transport.records for e in r.get("events", [])}
    assert "directive_failed:rb1:rollback" in seen
    after = store.manifest(4)
    assert after.health is HealthMark.QUARANTINED
    reason = after.history[-1].reason
    assert "restore check" in reason and "rank 0" in reason and "differs from the saved one" in reason
    assert store.latest() != 4
