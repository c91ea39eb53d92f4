"""adopt: a checkpoint a framework finished writing gets a manifest, checksums and health marks;
verification, rollback targets and quarantine then treat it like a native one (local and S3)."""

from __future__ import annotations

import io
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from supervisor.checkpoint import CheckpointStore, adopt, collect_garbage, select_rollback_target, verify
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError


def put_dcp_dir(store: CheckpointStore, key: str, tmp_path) -> None:
    """A torchtitan-style ``step-N/`` written by dcp.save, placed in the store's backend."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    local = tmp_path / "titan"
    dcp.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(local), no_dist=True
    )
    for path in sorted(local.iterdir()):
        store.backend.put_bytes(f"{key}/{path.name}", path.read_bytes())


def test_adopt_a_dcp_step_dir_verify_mark_target_and_quarantine(store: CheckpointStore, tmp_path) -> None:
    put_dcp_dir(store, "titan/checkpoint/step-10", tmp_path)
    manifest = adopt(store, 10, "titan/checkpoint/step-10", metrics={"loss": 3.1})
    assert manifest.layout == "dcp" and manifest.source == "titan/checkpoint/step-10"
    assert {f.name for f in manifest.files} >= {".metadata", "__0_0.distcp"}
    assert store.steps() == [10] and store.latest() == 10
    assert verify(store, 10, deep=True).ok
    store.mark(10, HealthMark.HEALTHY, "window clean")
    assert select_rollback_target(store, onset_step=20, margin=5).step == 10
    # The framework's file is damaged later: re-verification finds it and quarantines the step.
    key = "titan/checkpoint/step-10/__0_0.distcp"
    data = bytearray(store.backend.get_bytes(key))
    data[len(data) // 2] ^= 0xFF
    store.backend.put_bytes(key, bytes(data))
    with pytest.raises(CheckpointError, match="no healthy checkpoint"):
        select_rollback_target(store, onset_step=20, margin=5)
    assert store.manifest(10).health == HealthMark.QUARANTINED
    store.retreat_latest(-1)  # `latest` no longer names it, so retention may take it
    collect_garbage(store, keep=1)  # the manifest goes, the framework's files stay the framework's
    assert store.steps() == [] and store.backend.stat(key) is not None


def test_adopt_a_single_file_and_an_hf_style_directory(store: CheckpointStore) -> None:
    buf = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(3)}, "optimizer_states": [{}], "global_step": 40}, buf)
    store.backend.put_bytes("lightning/epoch=0-step=40.ckpt", buf.getvalue())
    one = adopt(store, 40, "lightning/epoch=0-step=40.ckpt", components=["model", "optimizer", "scheduler"])
    assert [f.name for f in one.files] == ["epoch=0-step=40.ckpt"] and one.source == "lightning"
    assert verify(store, 40, deep=True).ok
    store.backend.put_bytes("hf/checkpoint-50/model.safetensors", b"\0" * 64)
    store.backend.put_bytes("hf/checkpoint-50/trainer_state.json", json.dumps({"global_step": 50}).encode())
    hf = adopt(store, 50, "hf/checkpoint-50")
    assert sorted(f.name for f in hf.files) == ["model.safetensors", "trainer_state.json"]
    assert verify(store, 50, deep=True).ok  # checksums; torch does not open safetensors / json
    with pytest.raises(CheckpointError, match="no such file"):
        adopt(store, 60, "hf/checkpoint-60")
    with pytest.raises(CheckpointError, match="unknown components"):
        adopt(store, 50, "hf/checkpoint-50", components=["weights"])
