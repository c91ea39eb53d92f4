"""Iterable and streaming sources: stable IDs, sharding over ranks and workers, exact resumption.

Every (rank, DataLoader worker) pair is a *slot*; with ``S = world_size * max(1, num_workers)``
slots, epoch ``e`` orders the shards by ``Permutation(num_shards, seed, e)`` and

* with at least ``S`` shards, slot ``s`` reads the shards at positions ``p ≡ s (mod S)``;
* with fewer, every slot reads all of them and keeps item ``k`` of the epoch when
  ``k ≡ s (mod S)`` (correct, but each slot reads everything: give more shards for scale).

Each item is read by exactly one slot per epoch: no duplicates, no gaps. Epochs follow each
other forever, per slot. An item's ID is its key (``id_fn``, ``id_key``, or one of
``ITEM_ID_KEYS``) or ``<shard>:<offset>``; excluded IDs and sources are skipped as they stream
past, inside the worker that reads them. A slot's position ``(epoch, p, offset, k)`` is the
dataset's ``state_dict``; torchdata's ``StatefulDataLoader`` snapshots it in every worker with
each batch and hands back the one of the last batch the training loop consumed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.ids import BatchMeta, item_id
from supervisor.sdk.data.order import Permutation
from supervisor.sdk.data.shards import Shards

Item = tuple[str, str, Any]  # (sample ID, source, item)


class StreamSource(IterableDataset[Item]):
    def __init__(
        self,
        shards: Shards,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool,
        exclusions: ExclusionSet,
        id_key: str | None = None,
        id_fn: Callable[[Any], str] | None = None,
        source_fn: Callable[[Any], str] | None = None,
    ) -> None:
        self.shards, self.rank, self.world_size = shards, rank, world_size
        self.seed, self.shuffle, self.exclusions = seed, shuffle, exclusions
        self.id_key, self.id_fn, self.source_fn = id_key, id_fn, source_fn
        self._state: dict[str, int] | None = None
        self._restored: dict[str, int] | None = None

    # -- geometry ------------------------------------------------------------------------------
    def slot(self) -> tuple[int, int]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def _positions(self, epoch: int, slot: int, slots: int) -> list[int]:
        """Shard indices this slot reads in ``epoch``, in order."""
        n = len(self.shards.names)
        order = Permutation(n, self.seed, epoch, shuffle=self.shuffle).block(0, n).tolist()
        return order[slot::slots] if n >= slots else order

    # -- identity ------------------------------------------------------------------------------
    def name_of(self, item: Any, shard: int, offset: int) -> str:
        if self.id_fn is not None:
            return str(self.id_fn(item))
        found = item_id(item, self.id_key)
        return found if found is not None else f"{self.shards.names[shard]}:{offset}"

    def source_of(self, item: Any) -> str:
        if self.source_fn is not None:
            return str(self.source_fn(item))
        if isinstance(item, Mapping) and isinstance(item.get("source"), str):
            return str(item["source"])
        return "default"

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Item]:
        slot, slots = self.slot()
        st = self._restored or {"epoch": 0, "p": 0, "offset": 0, "k": 0}
        self._restored = None
        if st.get("slots", slots) != slots:
            raise ValueError(
                f"the stream cursor was saved with {st['slots']} slots (ranks x loader workers), "
                f"now {slots}: resume with the same world size and num_workers"
            )
        st = self._state = {**st, "slot": slot, "slots": slots}
        n = len(self.shards.names)
        empty_epochs = 0
        while True:
            positions = self._positions(st["epoch"], slot, slots)
            yielded = False
            while st["p"] < len(positions):
                shard = positions[st["p"]]
                items = self.shards.open(shard)
                for _ in range(st["offset"]):  # resume inside a shard: read past what was consumed
                    next(items, None)
                for item in items:
                    offset = st["offset"]
                    st["offset"] += 1
                    k = st["k"]
                    st["k"] += 1
                    if n < slots and k % slots != slot:
                        continue
                    sid, src = self.name_of(item, shard, offset), self.source_of(item)
                    if self.exclusions.allows(sid, src):
                        yielded = True
                        yield sid, src, item
                st["p"], st["offset"] = st["p"] + 1, 0
            st.update(epoch=st["epoch"] + 1, p=0, offset=0, k=0)
            empty_epochs = 0 if yielded else empty_epochs + 1
            if empty_epochs >= 2:
                raise ValueError(
                    f"stream slot {slot} of {slots} found nothing to yield in a whole epoch: every "
                    "sample is excluded, or the source has fewer items than ranks x workers"
                )

    # -- the Stateful protocol (called in each worker by StatefulDataLoader) --------------------
    def state_dict(self) -> dict[str, int]:
        return dict(self._state) if self._state is not None else dict(self._restored or {})

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._restored = dict(state) if state else None


class _Collate:
    """Runs in the worker: the user's collate over the items, the IDs and sources beside it."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[Item]) -> tuple[list[str], list[str], Any]:
        return [i[0] for i in items], [i[1] for i in items], self.collate_fn([i[2] for i in items])


class StreamPipeline:
    """A ``StatefulDataLoader`` over a ``StreamSource``; restarts from its own consumed state."""

    def __init__(
        self, source: StreamSource, batch_size: int, collate_fn: Callable[[list[Any]], Any], **dataloader: Any
    ) -> None:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError as exc:
            raise ImportError(
                "streaming sources need torchdata's StatefulDataLoader: pip install 'spike-supervisor[streaming]'"
            ) from exc
        self._cls = StatefulDataLoader
        self.source, self.batch_size, self.collate = source, batch_size, _Collate(collate_fn)
        self.dataloader = {k: v for k, v in dataloader.items() if v is not None}
        self.dataloader["persistent_workers"] = (
            False  # a restart must re-fork workers with the new exclusions
        )
        self.batch = 0
        self.skip_pending = 0
        self._saved: dict[str, Any] | None = None
        self._loader: Any = None
        self._it: Iterator[Any] | None = None

    def _open(self) -> Iterator[Any]:
        self._loader = self._cls(
            self.source, batch_size=self.batch_size, collate_fn=self.collate, **self.dataloader
        )
        if self._saved is not None:
            workers = self._saved.get("_snapshot", {}).get("_main_snapshot", {}).get("_num_workers")
            if workers is not None and workers != self._loader.num_workers:
                raise ValueError(
                    f"the stream cursor was saved with num_workers={workers}, the loader has "
                    f"{self._loader.num_workers}: resume with the same num_workers"
                )
            self._loader.load_state_dict(self._saved)
        return iter(self._loader)

    def next_raw(self) -> tuple[Any, BatchMeta]:
        if self._it is None:
            self._it = self._open()
        ids, sources, batch = next(self._it)
        index = self.batch
        self.batch += 1
        return batch, BatchMeta(ids, sources, index)

    def stream_state(self) -> dict[str, Any] | None:
        if self._loader is not None and self._it is not None:
            return copy.deepcopy(self._loader.state_dict())
        return copy.deepcopy(self._saved)

    def restart(self, state: dict[str, Any] | None = None, *, keep: bool = True) -> None:
        """Drop prefetched batches; continue from the consumed position (``keep``) or ``state``."""
        saved = self.stream_state() if keep else state
        self._shutdown()
        self._saved = saved

    def _shutdown(self) -> None:
        if self._it is not None:
            stop = getattr(self._it, "_shutdown_workers", None)
            if stop is not None:
                stop()
        self._it = None
        if self._loader is not None:
            self._loader._iterator = None
        self._loader = None

    def close(self) -> None:
        self._shutdown()
