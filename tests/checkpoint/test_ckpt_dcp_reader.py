"""The mmap DCP reader: the same values as DCP's own reader, each tensor record read in place."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from supervisor.checkpoint import dcp_reader
from supervisor.checkpoint.dcp_reader import MmapReader
from supervisor.checkpoint.torch_io import crc_off


def state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "w": torch.randn(64, 48),
        "wt": torch.randn(48, 64).t(),  # a transposed view: saved with its strides
        "half": torch.randn(7, 5).to(torch.bfloat16),
        "ids": torch.arange(10, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "lr": 0.01,  # a non-tensor: a bytes item, read by DCP's own path
    }


def zeros_like(values: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0.0 for k, v in values.items()}


@pytest.mark.parametrize("crc", [True, False], ids=["torch_crc", "crc_off"])  # the store saves with it off
def test_mmap_reader_matches_dcp_and_reads_every_tensor_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crc: bool
) -> None:
    saved = state()
    with contextlib.nullcontext() if crc else crc_off():
        dcp.save(saved, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True)
    in_place: list[bool] = []
    real_view = dcp_reader._view

    def view(*args: Any) -> torch.Tensor | None:
        out = real_view(*args)
        in_place.append(out is not None)
        return out

    monkeypatch.setattr(dcp_reader, "_view", view)
    mine, theirs = zeros_like(saved), zeros_like(saved)
    dcp.load(mine, storage_reader=MmapReader(tmp_path), no_dist=True)
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(mine[key], value) and torch.equal(theirs[key], value), key
        else:
            assert mine[key] == theirs[key] == value
    assert in_place == [True] * 5  # every tensor record (DCP writes none for the empty one) read in place
