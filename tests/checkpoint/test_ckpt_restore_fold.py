"""The restore's self-check folded into the load's copy (``dcp_reader.ShardHash``): it gives the
fingerprint the live state gives after the load, bit for bit, or nothing; a corrupt or forged
model state is still refused; where it cannot cover the load (tied weights) the live state is
hashed after the load instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from supervisor.checkpoint import CheckpointStore, dcp_reader, dcp_state
from supervisor.checkpoint.dcp_state import fingerprint, live_state
from supervisor.checkpoint.training_state import load_training_state, save_training_state
from supervisor.checkpoint.verify import RestoreCheckError
from supervisor.storage import open_backend


def build(seed: int, tied: bool = False) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(40, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 40))
    if tied:
        model[2].weight = torch.nn.Parameter(model[0].weight.t())  # aliased storage, another layout
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 40)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def saved(
    tmp_path: Path, tied: bool = False
) -> tuple[CheckpointStore, torch.nn.Module, torch.optim.Optimizer]:
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    model, opt = build(0, tied)
    save_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)
    return store, model, opt


def test_folded_checksum_is_the_fingerprint_of_the_restored_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dcp_reader, "FOLD_CHUNK", 4096)  # several chunks per weight
    store, model, opt = saved(tmp_path)
    want = fingerprint(live_state(model, opt)["model"], store.settings.checksum)
    other, other_opt = build(1)  # different values: the load must replace every byte
    folded = dcp_state.load(store, store.manifest(1), other, other_opt, shard_hash=True)
    after = fingerprint(live_state(other, other_opt)["model"], store.settings.checksum)
    assert folded is not None and folded == after["shard_checksum"] == want["shard_checksum"]
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_restore_hashes_during_the_load_not_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = saved(tmp_path)
    calls: list[int] = []
    real = dcp_state.fingerprint
    monkeypatch.setattr(dcp_state, "fingerprint", lambda *a: calls.append(1) or real(*a))
    model, opt = build(1)
    loaded = load_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)
    assert loaded.shard_checksum is not None and calls == []  # no second pass over the model


def record(store: CheckpointStore, fqn: str) -> tuple[Path, Any]:
    """The .distcp file and the storage info (offset, length) of one tensor's record at step 1."""
    directory = store.backend.path(store.key(1, dcp_state.dcp_dir(store.manifest(1))))  # type: ignore[attr-defined]
    reader = dcp_reader.MmapReader(directory)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    info = next(v for k, v in reader.storage_data.items() if k.fqn == fqn)
    return directory / info.relative_path, info


def _corrupt_model_bytes(store: CheckpointStore, fqns: tuple[str, ...]) -> None:
    """Zero bytes inside these weights' records (the manifest untouched, as a forger leaves it)."""
    for fqn in fqns:
        path, info = record(store, fqn)
        data = bytearray(path.read_bytes())
        mid = info.offset + info.length // 2
        assert any(data[mid : mid + 64])
        data[mid : mid + 64] = bytes(64)
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("tied", [False, True], ids=["folded", "tied_weights_hashed_after"])
def test_a_corrupt_model_record_is_still_refused(tmp_path: Path, tied: bool) -> None:
    store, _, _ = saved(tmp_path, tied)
    # tied: both names hold the one storage, and whichever record is read last is what stays live
    _corrupt_model_bytes(store, ("model.0.weight", "model.2.weight") if tied else ("model.0.weight",))
    model, opt = build(1, tied)
    with pytest.raises(RestoreCheckError, match="differs from the saved one"):
        load_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)


def test_tied_weights_are_not_folded_and_the_live_state_is_checked(tmp_path: Path) -> None:
    store, model, opt = saved(tmp_path, tied=True)
    other, other_opt = build(1, tied=True)
    assert dcp_state.load(store, store.manifest(1), other, other_opt, shard_hash=True) is None
    loaded = load_training_state(store, 1, rank=0, world_size=1, model=other, optimizer=other_opt)
    want = fingerprint(live_state(model, opt)["model"], store.settings.checksum)["shard_checksum"]
    assert loaded.shard_checksum == want


def test_a_model_item_left_to_dcps_own_path_gives_no_folded_checksum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, _ = saved(tmp_path)
    _, info = record(store, "model.2.weight")
    real = dcp_reader._view

    def view(buf: Any, start: int, length: int) -> torch.Tensor | None:
        return None if start == info.offset else real(buf, start, length)  # not the plain layout

    monkeypatch.setattr(dcp_reader, "_view", view)
    model, opt = build(1)
    want = build(0)[0]
    assert dcp_state.load(store, store.manifest(1), model, opt, shard_hash=True) is None
    assert torch.equal(model[2].weight, want[2].weight)  # DCP's own path read it


def test_a_corrupt_replicated_model_is_refused_on_another_world_size_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicated (plain or DDP) state is the whole model on every rank, whatever the world size: a
    group restarted on fewer ranks checks it bit for bit as a same-size restore does. (Sharded
    DTensor state reshards: its local shards are not the saved ones, and are not compared.)"""
    from supervisor.checkpoint import training_state

    store, _, _ = saved(tmp_path)
    monkeypatch.setattr(training_state, "dist_world_size", lambda: 2)  # restored by a group of 2
    model, opt = build(1)
    loaded = load_training_state(store, 1, rank=0, world_size=2, model=model, optimizer=opt)
    assert loaded.shard_checksum is not None
    _corrupt_model_bytes(store, ("model.0.weight",))
    model, opt = build(1)
    with pytest.raises(RestoreCheckError, match="differs from the saved one"):
        load_training_state(store, 1, rank=0, world_size=2, model=model, optimizer=opt)
