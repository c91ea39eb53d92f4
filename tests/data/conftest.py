"""Real datasets on disk for the loader tests: stdlib text as a token file, JSONL shards, tar shards.

* ``token_file`` — a map-style dataset over a file of bytes read with ``np.memmap`` (opened
  lazily, so DataLoader workers each map it themselves); IDs ``<file>:<offset>``.
* ``jsonl_shards`` — 8 JSONL files, read by Hugging Face ``datasets`` in streaming mode.
* ``tar_shards`` — 8 webdataset tar shards.

Every stream item has an ``id`` (``__key__`` for tars), a ``source`` and ``tokens``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from examples.tinylm.data import stdlib_texts

SEQ = 16
SHARDS = 8
ROWS_PER_SHARD = 30

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # everything here is local files: never ask the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class TokenFile(torch.utils.data.Dataset[dict[str, Any]]):
    def __init__(self, path: Path, seq_len: int = SEQ) -> None:
        self.path, self.seq_len = path, seq_len
        self.n = path.stat().st_size // seq_len
        self._data: np.memmap | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        row = torch.from_numpy(
            np.array(self._data[i * self.seq_len : (i + 1) * self.seq_len], dtype=np.int64)
        )
        return {"input_ids": row}

    def sample_id(self, i: int) -> str:
        return f"{self.path.name}:{i * self.seq_len}"

    def source(self, i: int) -> str:
        return "even" if i % 2 == 0 else "odd"

    def index_of(self, sample_id: str) -> int | None:
        name, _, offset = sample_id.rpartition(":")
        ok = name == self.path.name and offset.isdecimal() and int(offset) % self.seq_len == 0
        return int(offset) // self.seq_len if ok else None


def _rows() -> list[dict[str, Any]]:
    text = "".join(stdlib_texts(max_bytes_per_source=20_000, seed=0)["code"].values()).encode()
    rows = []
    for j in range(SHARDS * ROWS_PER_SHARD):
        chunk = list(text[j * SEQ : (j + 1) * SEQ])
        rows.append({"id": f"doc{j:04d}", "source": ("code", "prose")[j % 3 == 0], "tokens": chunk})
    return rows


@pytest.fixture(scope="session")
def rows() -> list[dict[str, Any]]:
    return _rows()


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> TokenFile:
    path = tmp_path_factory.mktemp("tokens") / "stdlib.u8"
    text = "".join(stdlib_texts(max_bytes_per_source=20_000, seed=0)["code"].values()).encode()
    path.write_bytes(text[: (len(text) // SEQ) * SEQ])
    return TokenFile(path)


@pytest.fixture(scope="session")
def jsonl_shards(tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, Any]]) -> list[str]:
    folder = tmp_path_factory.mktemp("jsonl")
    files = []
    for s in range(SHARDS):
        path = folder / f"part-{s:02d}.jsonl"
        part = rows[s * ROWS_PER_SHARD : (s + 1) * ROWS_PER_SHARD]
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        files.append(str(path))
    return files


@pytest.fixture(scope="session")
def tar_shards(tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, Any]]) -> list[str]:
    import webdataset as wds

    folder = tmp_path_factory.mktemp("tars")
    files = []
    for s in range(SHARDS):
        path = folder / f"shard-{s:04d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for r in rows[s * ROWS_PER_SHARD : (s + 1) * ROWS_PER_SHARD]:
                sink.write({"__key__": r["id"], "json": {"source": r["source"], "tokens": r["tokens"]}})
        files.append(str(path))
    return files


def hf_stream(files: list[str]) -> Any:
    import datasets

    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


def collate_rows(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stream items -> a batch: the token rows stacked (webdataset items keep them under ``json``)."""
    rows = [it.get("json", it) for it in items]
    return {"input_ids": torch.tensor([r["tokens"] for r in rows], dtype=torch.long)}


def wds_source(item: dict[str, Any]) -> str:
    return str(item["json"]["source"])
