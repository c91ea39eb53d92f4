"""Sample IDs for batches of any shape.

The loader always knows the IDs of what it drew (a map-style dataset's ``sample_id(i)`` or
the index; a stream's key, or shard + offset). It hands them on in two ways:

* attached to the batch where the batch can carry them — a mapping gets ``sample_ids``,
  ``sources`` and ``batch_index`` keys; a dataclass with any of those fields gets them set;
* always through ``SupervisedLoader.batch_meta(batch)``, which the probe asks when the batch
  itself carries none (a tuple, a list, a bare tensor).

``find_ids`` reads IDs back from a batch (mapping keys, dataclass fields, a list of strings
inside a tuple) or through a user function, for code that gets batches from elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch

ID_KEYS = ("sample_ids", "samples", "ids")
ITEM_ID_KEYS = ("__key__", "id", "sample_id", "key")
"""Keys a stream item's ID is taken from, in this order, when no ``id_key`` is given."""
IdFn = Callable[[Any], Sequence[str]]
BARE = frozenset({torch.Tensor, tuple, list})
"""Batch types that carry no IDs (``attach`` returns them as they are; the probe asks the loader)."""


@dataclasses.dataclass(slots=True)
class BatchMeta:
    sample_ids: list[str]
    sources: list[str]
    batch_index: int

    def fields(self) -> dict[str, Any]:
        return {"sample_ids": self.sample_ids, "sources": self.sources, "batch_index": self.batch_index}


def attach(batch: Any, meta: BatchMeta) -> Any:
    """``batch`` carrying ``meta`` where its type allows (the same object when mutable)."""
    kind = type(batch)
    if kind in BARE:  # the common shapes first: per batch
        return batch
    if kind is dict or isinstance(batch, MutableMapping):  # per batch too (the usual collate)
        batch["sample_ids"], batch["sources"] = meta.sample_ids, meta.sources  # (no dict built per batch)
        batch["batch_index"] = meta.batch_index
        return batch
    if isinstance(batch, Mapping):
        return {**batch, **meta.fields()}
    if isinstance(batch, torch.Tensor | tuple | list):
        return batch
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        names = {f.name for f in dataclasses.fields(batch)}
        if names & set(meta.fields()):
            return dataclasses.replace(batch, **{k: v for k, v in meta.fields().items() if k in names})
    return batch  # a tuple, list, tensor or other object: the probe asks the loader


def _as_ids(value: Any) -> list[str] | None:
    strings = isinstance(value, Sequence) and not isinstance(value, str | bytes) and value
    return list(value) if strings and all(isinstance(v, str) for v in value) else None


def find_ids(batch: Any, fn: IdFn | None = None) -> list[str] | None:
    """The sample IDs inside ``batch``: ``fn(batch)`` if given, else known keys/fields, else None."""
    if fn is not None:
        return [str(x) for x in fn(batch)]
    if isinstance(batch, Mapping):
        fields: dict[str, Any] = dict(batch)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    elif isinstance(batch, tuple | list):
        found = [ids for ids in map(_as_ids, batch) if ids is not None]
        return found[0] if len(found) == 1 else None
    else:
        fields = {k: getattr(batch, k) for k in ID_KEYS if hasattr(batch, k)}
    for key in ID_KEYS:
        ids = _as_ids(fields.get(key))
        if ids is not None:
            return ids
    return None


def item_id(item: Any, id_key: str | None) -> str | None:
    """A stream item's own ID: ``item[id_key]``, or the first of ``ITEM_ID_KEYS`` it has."""
    if not isinstance(item, Mapping):
        return None
    for key in (id_key,) if id_key else ITEM_ID_KEYS:
        if key in item and item[key] is not None:
            return str(item[key])
    if id_key:
        raise KeyError(
            f"stream item has no {id_key!r} key (keys: {sorted(map(str, item))}); pass "
            f"id_key=<one of them> or id_fn=<item -> str> to SupervisedLoader, or id_key=None "
            "to name samples by shard and offset"
        )
    return None
