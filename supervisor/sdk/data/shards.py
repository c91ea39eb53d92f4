"""Streaming sources as ordered lists of shards: what a stream's cursor and IDs are built on.

A source is a list of named shards, each opened as an iterator that yields the same items in
the same order every time (files, tar archives, a dataset's own shards). That is what makes
``shard + offset`` a stable sample ID and a resumable position.

* ``HFShards``         — a Hugging Face ``datasets.IterableDataset`` (streaming mode): its shards;
* ``WebDatasetShards`` — webdataset tar shards (``webdataset`` optional extra);
* ``IterableShards``   — any other iterable, as a single shard (each rank reads it all and
  keeps its share: correct, not fast; give real shards for scale).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Shards(Protocol):
    names: list[str]
    """One stable name per shard (part of ``shard:offset`` IDs)."""

    def open(self, j: int) -> Iterator[Any]:
        """Shard ``j``'s items, in the same order every time."""
        ...


class HFShards:
    """The shards of a Hugging Face streaming dataset (one per data file for file-based builders)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        n = int(getattr(dataset, "num_shards", None) or dataset.n_shards)
        self.names = [f"{j:05d}" for j in range(n)]

    def open(self, j: int) -> Iterator[Any]:
        # ``.iter(batch_size)`` rather than ``iter()``: inside a DataLoader worker the latter splits
        # the shards over workers itself, and the split here is the loader's.
        shard = self.dataset.shard(num_shards=len(self.names), index=j, contiguous=True)
        for rows in shard.iter(batch_size=256):
            columns = list(rows)
            for i in range(len(rows[columns[0]]) if columns else 0):
                yield {c: rows[c][i] for c in columns}


class WebDatasetShards:
    """webdataset tar shards, decoded with ``decode`` (``webdataset.decode`` arguments; default: all)."""

    def __init__(
        self, urls: Sequence[str | Path], decode: Sequence[Any] = (), map: Callable[[Any], Any] | None = None
    ):
        try:
            import webdataset  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "webdataset shards need the webdataset package: pip install 'spike-supervisor[streaming]'"
            ) from exc
        self.urls = [str(u) for u in urls]
        if not self.urls:
            raise ValueError("WebDatasetShards needs at least one shard URL")
        self.names = [Path(u).name for u in self.urls]
        self.decoders, self.map = tuple(decode), map

    def open(self, j: int) -> Iterator[Any]:
        import webdataset as wds

        stages: list[Any] = [
            wds.SimpleShardList([self.urls[j]]),
            wds.tarfile_to_samples(),
            wds.decode(*self.decoders),
        ]
        if self.map is not None:
            stages.append(wds.map(self.map))
        return iter(wds.DataPipeline(*stages))


class IterableShards:
    """Any re-iterable source (its ``iter()`` must restart from the beginning, in the same order)."""

    def __init__(self, iterable: Iterable[Any], name: str = "stream") -> None:
        self.iterable, self.names = iterable, [name]

    def open(self, j: int) -> Iterator[Any]:
        return iter(self.iterable)


def as_shards(source: Any) -> Shards:
    if isinstance(source, Shards):
        return source
    mod = type(source).__module__ or ""
    if mod.startswith("datasets.") and hasattr(source, "shard"):
        return HFShards(source)
    if isinstance(source, Iterable):
        return IterableShards(source)
    raise TypeError(
        f"cannot stream from a {type(source).__name__}: pass a map-style dataset (__len__ and "
        "__getitem__), an IterableDataset, a Hugging Face streaming dataset, or WebDatasetShards([...])"
    )
