"""Real text for the tiny LM: the Python standard library's own source, in named sources.

Sources (``SOURCES``):
  * ``code``       — ``.py`` files outside test folders, as written;
  * ``docstrings`` — module/class/function docstrings extracted from those files;
  * ``tests``      — ``.py`` files under ``test``/``tests``/``idle_test`` folders.

Each source is capped (``max_bytes_per_source``) and the files it takes are chosen by a
seeded hash, so a corpus is deterministic given (seed, seq_len, caps) and builds in about a
second. Text is cut into byte sequences of ``seq_len + 1``; a short tail is padded and its
padding masked (``targets == -100``), so lengths vary a little, as in real batches.

Sample IDs are ``<source>:<relative path>:<byte offset>`` — they name where a sample came
from and never contain sample text. Nothing is cached on disk.

    ds = build_dataset(seq_len=64, max_bytes_per_source=1_000_000, seed=0)
    ds.sample_id(0), ds.source(0), ds[0]["input_ids"]

The same samples can be read as a **stream** (``data: {streaming: hf | webdataset}`` in the
job config): ``write_shards`` writes them once to JSONL or tar shards (same IDs, same
sources) and ``loader_source`` returns a Hugging Face streaming dataset or webdataset shards
over those files, with ``data.loader_workers`` DataLoader workers. The replay hooks keep
using the map-style dataset: the IDs are the same.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import json
import os
import re
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from supervisor.sdk.data.order import Permutation

SOURCES = ("code", "docstrings", "tests")
IGNORE_INDEX = -100
_TEST_DIRS = {"test", "tests", "idle_test"}
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Chunk:
    source: str
    name: str
    offset: int
    start: int
    """Start in the dataset's byte buffer."""
    length: int
    """Bytes in this chunk (``<= seq_len + 1``)."""


class TextDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Byte sequences with stable IDs and source labels; items are dicts of tensors + metadata."""

    def __init__(self, texts: Mapping[str, Mapping[str, str]], seq_len: int = 64, min_tail: int = 16) -> None:
        """``texts`` maps source -> document name -> text (the name becomes part of sample IDs)."""
        self.seq_len = seq_len
        self._buf = bytearray()
        self.chunks: list[Chunk] = []
        for source in sorted(texts):
            for name in sorted(texts[source]):
                self._add(source, name, texts[source][name].encode("utf-8"), min_tail)

    def _add(self, source: str, name: str, data: bytes, min_tail: int) -> None:
        span = self.seq_len + 1
        base = len(self._buf)
        self._buf += data
        for off in range(0, len(data), span):
            n = min(span, len(data) - off)
            if n >= min_tail:
                self.chunks.append(Chunk(source, name, off, base + off, n))

    def __len__(self) -> int:
        return len(self.chunks)

    def sample_id(self, i: int) -> str:
        c = self.chunks[i]
        return f"{c.source}:{c.name}:{c.offset}"

    def source(self, i: int) -> str:
        return self.chunks[i].source

    def index_of(self, sample_id: str) -> int | None:
        """The index ``sample_id`` names, or None: chunks are in (source, name, offset) order, so a
        binary search finds it without a table of IDs (the loader and replay use this)."""
        source, _, rest = sample_id.partition(":")
        name, _, offset = rest.rpartition(":")
        if not offset.isdecimal():
            return None
        key = (source, name, int(offset))
        i = bisect.bisect_left(self.chunks, key, key=lambda c: (c.source, c.name, c.offset))
        return i if i < len(self.chunks) and self.sample_id(i) == sample_id else None

    @property
    def sources(self) -> list[str]:
        return sorted({c.source for c in self.chunks})

    def __getitem__(self, i: int) -> dict[str, Any]:
        return sample(self.raw(i), self.seq_len)

    def raw(self, i: int) -> torch.Tensor:
        c = self.chunks[i]
        return torch.frombuffer(self._buf[c.start : c.start + c.length], dtype=torch.uint8).long()


def sample(raw: torch.Tensor, seq_len: int) -> dict[str, Any]:
    """Inputs and next-byte targets of one chunk of ``<= seq_len + 1`` bytes; padding is masked."""
    n = len(raw)
    inputs = torch.zeros(seq_len, dtype=torch.long)
    targets = torch.full((seq_len,), IGNORE_INDEX, dtype=torch.long)
    inputs[: n - 1] = raw[:-1]
    targets[: n - 1] = raw[1:]
    return {"input_ids": inputs, "targets": targets, "length": n - 1}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_test(rel: Path) -> bool:
    return any(part in _TEST_DIRS or part.startswith("test_") for part in rel.parts[:-1])


def _stdlib_files(root: Path) -> tuple[list[Path], list[Path]]:
    code, tests = [], []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)  # prune site-packages before descending
        base = Path(folder).relative_to(root)
        for name in files:
            if name.endswith(".py"):
                rel = base / name
                (tests if _is_test(rel) else code).append(rel)
    return code, tests


def _seeded_order(paths: Iterable[Path], seed: int) -> list[Path]:
    key = lambda p: hashlib.sha1(f"{seed}:{p.as_posix()}".encode()).hexdigest()  # noqa: E731
    return sorted(paths, key=key)


def _read(root: Path, rel: Path) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


_DOC = re.compile(
    r"""(?:\A|:[ \t]*\n)[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1""",
    re.DOTALL,
)


def _docstrings(text: str) -> str:
    """Triple-quoted strings that open a module or follow a ``def``/``class`` line (a regex: ast is 10x slower)."""
    docs = (inspect.cleandoc(m.group(2)) for m in _DOC.finditer(text))
    return "\n\n".join(d for d in docs if d.strip())


def _take(root: Path, files: list[Path], cap: int, extract: Any = None) -> dict[str, str]:
    out: dict[str, str] = {}
    total = 0
    for rel in files:
        if total >= cap:
            break
        text = _read(root, rel)
        if text is not None and extract is not None:
            text = extract(text)
        if not text:
            continue
        text = text[: cap - total]
        out[rel.as_posix()] = text
        total += len(text)
    return out


def stdlib_texts(
    max_bytes_per_source: int = 1_000_000, seed: int = 0, root: Path | None = None
) -> dict[str, dict[str, str]]:
    """source -> relative path -> text, each source capped at about ``max_bytes_per_source`` characters."""
    root = root or stdlib_root()
    code, tests = _stdlib_files(root)
    code, tests = _seeded_order(code, seed), _seeded_order(tests, seed)
    return {
        "code": _take(root, code, max_bytes_per_source),
        "docstrings": _take(root, code, max_bytes_per_source, _docstrings),
        "tests": _take(root, tests, max_bytes_per_source),
    }


def build_dataset(
    seq_len: int = 64,
    max_bytes_per_source: int = 1_000_000,
    seed: int = 0,
    extra_texts: Mapping[str, Mapping[str, str]] | None = None,
) -> TextDataset:
    """The stdlib corpus, plus ``extra_texts`` (source -> name -> text) merged in, e.g. injected faults."""
    texts = stdlib_texts(max_bytes_per_source, seed)
    for source, docs in (extra_texts or {}).items():
        texts.setdefault(source, {}).update(docs)
    return TextDataset(texts, seq_len)


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors; keep ``length`` as a host-side list (the probe reads it without a sync)."""
    return {
        "input_ids": torch.stack([it["input_ids"] for it in items]),
        "targets": torch.stack([it["targets"] for it in items]),
        "lengths": [int(it["length"]) for it in items],
    }


# -- the same samples as a stream ---------------------------------------------------------------
STREAM_FORMATS = ("hf", "webdataset")


def write_shards(
    dataset: TextDataset, folder: Path, num_shards: int = 8, fmt: str = "hf", seed: int = 0
) -> list[Path]:
    """The dataset's samples, shuffled by ``seed``, in ``num_shards`` files (JSONL / tar).

    Each row keeps the sample's ID and source (webdataset keys cannot hold the dots of an ID:
    its key is the row number and the ID travels in the row's JSON). Files already there are reused (their name holds
    a hash of the content); each is written to a temporary name and renamed, so ranks writing
    the same folder at once never read a half-written shard.
    """
    digest = hashlib.sha1(
        bytes(dataset._buf) + f"{dataset.seq_len}:{len(dataset)}:{seed}".encode()
    ).hexdigest()
    digest = digest[:12]
    folder.mkdir(parents=True, exist_ok=True)
    ext = "jsonl" if fmt == "hf" else "tar"
    paths = [folder / f"tinylm-{digest}-{j:03d}-of-{num_shards:03d}.{ext}" for j in range(num_shards)]
    per = -(-len(dataset) // num_shards)
    order = Permutation(len(dataset), seed, 0).block(0, len(dataset)).tolist()  # shuffled once, at write time
    for j, path in enumerate(paths):
        if path.exists():
            continue
        rows = [
            {"id": dataset.sample_id(i), "source": dataset.source(i), "tokens": dataset.raw(i).tolist()}
            for i in order[j * per : (j + 1) * per]
        ]
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
        os.close(fd)
        if fmt == "hf":
            Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        else:
            import webdataset as wds

            with wds.TarWriter(tmp) as sink:
                for k, r in enumerate(rows):
                    sink.write({"__key__": f"{j:03d}-{k:06d}", "json": r})
        os.replace(tmp, path)
    return paths


class StreamCollate:
    """Stream rows (``{"id", "source", "tokens"}``, or webdataset's ``{"json": ...}``) -> a ``collate`` batch."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [it.get("json", it) for it in items]
        return collate([sample(torch.tensor(r["tokens"], dtype=torch.long), self.seq_len) for r in rows])


def _webdataset_id(item: dict[str, Any]) -> str:
    return str(item["json"]["id"])


def _webdataset_source(item: dict[str, Any]) -> str:
    return str(item["json"]["source"])


def loader_source(dataset: TextDataset, data: Mapping[str, Any], seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """What ``SupervisedLoader`` reads and its options, from the job's ``data`` config.

    Without ``streaming`` that is the map-style dataset itself; with ``streaming: hf`` a
    Hugging Face streaming dataset over JSONL shards, with ``streaming: webdataset`` tar shards.
    ``loader_workers`` / ``prefetch_factor`` go to the DataLoader; ``shards`` (default 8) and
    ``stream_dir`` (default: the system temp folder) say where the shards are written.
    """
    options: dict[str, Any] = {"num_workers": int(data.get("loader_workers", 0))}
    if data.get("prefetch_factor") is not None:
        options["prefetch_factor"] = int(data["prefetch_factor"])
    fmt = data.get("streaming")
    if not fmt:
        return dataset, {**options, "collate_fn": collate}
    if fmt not in STREAM_FORMATS:
        raise ValueError(f"data.streaming: {fmt!r} is not one of {', '.join(STREAM_FORMATS)}")
    folder = Path(data.get("stream_dir") or Path(tempfile.gettempdir()) / "tinylm-streams")
    paths = write_shards(dataset, folder, int(data.get("shards", 8)), fmt, seed)
    options["collate_fn"] = StreamCollate(dataset.seq_len)
    if fmt == "webdataset":
        from supervisor.sdk.data.shards import WebDatasetShards

        return WebDatasetShards(paths), {**options, "id_fn": _webdataset_id, "source_fn": _webdataset_source}
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never ask the Hub
    import datasets

    files = [str(p) for p in paths]
    return datasets.load_dataset("json", data_files=files, split="train", streaming=True), options
