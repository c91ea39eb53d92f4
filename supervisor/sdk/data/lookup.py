"""Finding samples by ID without a table of the dataset: invert the ID, or look it up lazily.

A map-style dataset's IDs are either the index itself (``"<i>"``, when the dataset has no
``sample_id``) or whatever its ``sample_id(i)`` returns. Turning an ID back into an index:

* default IDs are parsed (``"42"`` -> 42; ``"042"`` or ``"-1"`` name no sample);
* a dataset that knows its own naming can say so with ``index_of(sample_id) -> int | None``
  (None or ``KeyError`` for an ID it does not name; ``examples/tinylm/data.py`` bisects its
  sorted chunks): O(1) memory, and every answer is checked against ``sample_id``;
* otherwise ``find_indices`` walks the index space in blocks, holding only the IDs it still
  looks for, and stops when it has found them all: memory bounded by the request, never by
  the dataset (time is O(n) in the worst case — give the dataset ``index_of`` for speed).

A stream's IDs are its items' keys or ``<shard>:<offset>``: ``find_in_stream`` opens the named
shard at the offset, or streams the shards past until every key was seen.

The loader's exclusion filter uses the same inverse: excluded IDs become a sorted array of
indices, and a block of the epoch's order is filtered with one vectorised lookup.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

Inverse = Callable[[str], "int | None"]
SCAN_BLOCK = 4096
"""Indices named per step of a lazy scan."""


def inverse(dataset: Any, n: int) -> Inverse | None:
    """ID -> index for this dataset without a table, or None when only a scan can tell."""
    own, name = getattr(dataset, "index_of", None), getattr(dataset, "sample_id", None)
    if callable(own) and callable(name):

        def via_dataset(sid: str) -> int | None:
            try:
                i = own(sid)
            except (KeyError, ValueError, IndexError):
                return None
            # Checked both ways: an inverse that disagrees with sample_id must not exclude a stranger.
            return int(i) if i is not None and 0 <= int(i) < n and str(name(int(i))) == sid else None

        return via_dataset
    if getattr(dataset, "sample_id", None) is None:
        return lambda sid: _decimal(sid, n)
    return None


def _decimal(sid: str, n: int) -> int | None:
    """The index a default ID names: canonical decimal only, so "042" never aliases sample 42."""
    if not sid.isdecimal() or (len(sid) > 1 and sid[0] == "0"):
        return None
    i = int(sid)
    return i if i < n else None


def excluded_indices(samples: Iterable[str], inv: Inverse) -> np.ndarray:
    """The sorted indices of ``samples`` (IDs that name no sample are dropped)."""
    found = [i for i in map(inv, samples) if i is not None]
    return np.unique(np.asarray(found, dtype=np.int64))


def member(block: np.ndarray, sorted_indices: np.ndarray) -> np.ndarray:
    """``block[k] in sorted_indices`` for every ``k``, by binary search (no hash set, no bitmap of
    the index space). The block is searched in sorted order: neighbouring searches then walk the
    same part of ``sorted_indices``, about twice as fast as a shuffled block's."""
    out = np.zeros(block.shape, dtype=bool)
    if sorted_indices.size == 0 or block.size == 0:
        return out
    order = np.argsort(block)
    queries = block[order]
    at = np.minimum(np.searchsorted(sorted_indices, queries), sorted_indices.size - 1)
    out[order] = sorted_indices[at] == queries
    return out


def find_indices(
    sample_ids: list[str],
    n: int,
    sample_id: Callable[[int], Any],
    inv: Inverse | None,
    *,
    deadline: float | None = None,
) -> dict[str, int]:
    """Where each of ``sample_ids`` is (IDs not in the dataset are left out of the answer)."""
    if inv is not None:
        out = {sid: inv(sid) for sid in sample_ids}
        return {sid: i for sid, i in out.items() if i is not None}
    wanted, found = set(sample_ids), {}
    for start in range(0, n, SCAN_BLOCK):
        _check(deadline, wanted)
        for i in range(start, min(n, start + SCAN_BLOCK)):
            sid = str(sample_id(i))
            if sid in wanted:
                found[sid] = i
                wanted.discard(sid)
        if not wanted:
            break
    return found


def find_in_stream(
    sample_ids: list[str],
    names: list[str],
    open_shard: Callable[[int], Iterator[Any]],
    item_key: Callable[[Any, int, int], str],
    *,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Items of a stream by ID: ``<shard>:<offset>`` IDs are opened where they are; keys are
    looked for by streaming the shards past, keeping only the items asked for."""
    by_name = {name: j for j, name in enumerate(names)}
    found: dict[str, Any] = {}
    wanted = set(sample_ids)
    for sid in sample_ids:
        shard, _, offset = sid.rpartition(":")
        j = by_name.get(shard)
        if j is None or not offset.isdecimal():
            continue
        item = next(itertools.islice(open_shard(j), int(offset), None), None)
        if item is not None and item_key(item, j, int(offset)) == sid:
            found[sid] = item
            wanted.discard(sid)
    for j in range(len(names)) if wanted else ():
        for k, item in enumerate(open_shard(j)):
            if k % SCAN_BLOCK == 0:
                _check(deadline, wanted)
            key = item_key(item, j, k)
            if key in wanted:
                found[key] = item
                wanted.discard(key)
                if not wanted:
                    return found
    return found


def _check(deadline: float | None, wanted: set[str]) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(
            f"looking for {len(wanted)} sample IDs ran past its deadline: they name no index of the "
            "dataset and the scan did not reach them (give the dataset index_of(sample_id))"
        )
