"""Map-style datasets through ``torch.utils.data.DataLoader``: worker processes and prefetch.

With ``num_workers=0`` (and no pinning) batches are fetched and collated in place, as the
DataLoader's single-process iterator would.

With workers the schedule runs *in the workers* (``_Scheduled``): each gets a frozen copy of it
(cursor, exclusions, the excluded IDs already inverted to indices) and loads, collates and
names only its own share — batch ``j`` of the generation goes to worker ``j % num_workers``,
the order in which the DataLoader asks its workers in turn and hands their results back. A
worker counts past the others' batches without drawing them (``Schedule.turns``: the excluded
samples placed in the epoch's order once, a batch's start found by binary search) and maps only
its own rank's samples; with sources or un-invertible IDs excluded it walks every batch. A batch
arrives with its index, the cursor after it and its dataset indices packed in one small bytes
object (``Shipped``), so the training process does no per-batch work beyond the DataLoader's own
(it sends no index lists either, and unpickles one bytes object); the sample IDs are named from
the indices only when someone asks (``named``: ``batch_meta``, a mapping batch, a record). The
cursor of the last *consumed* batch is the loader's state — not the workers' read-ahead.

When exclusions, skips or a restored cursor change what comes next, ``restart()`` drops the
prefetched batches and the workers; the next batch starts new ones with a schedule copied
from the consumed cursor (a rollback costs one worker start-up, tens of milliseconds).

A dataset that *locates* its samples (``locate(i, batch)``, a mixture schedule that depends on
the training step) is scheduled in the training process instead, as the DataLoader's batch
sampler: its locate function belongs to the training process (it reads the run's plan), and
workers then only load and collate the named indices.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from supervisor.sdk.data.ids import BatchMeta
from supervisor.sdk.data.schedule import Cursor, Draw, Schedule

Shipped = bytes | tuple[int, int, int, int, int, list[str], list[str] | None]
"""What a worker sends beside a batch: one bytes object — ``_HEAD`` (the batch index, the cursor
after the batch: epoch, pos, batch, skip_pending; the length of the IDs' text; whether sources
follow) and then the batch's sample IDs, and its sources unless all are ``"default"``, as UTF-8
text joined by NUL. One bytes object is the cheapest thing to unpickle in the training process
(~0.1 µs beyond the batch, against ~1.5 µs for eight ID strings, a cursor tuple and their tuple);
the strings are split out of it only when someone asks (``named``: ~1 µs). IDs or sources that
contain NUL themselves are shipped as a tuple of the same fields and the lists of strings."""

Named = BatchMeta | Shipped
"""A batch's metadata as the pipeline hands it on: a ``BatchMeta`` (a ``Draw`` when drawn in this
process), or what a worker shipped, named only when asked (``named``)."""

_HEAD = struct.Struct("=7q")
_HEAD_SIZE, _unpack_head = _HEAD.size, _HEAD.unpack_from
_SEP = "\x00"


def ship(draw: Draw, own_sources: bool) -> Shipped:
    """``draw`` packed for the trip to the training process (in a worker); ``own_sources``: the
    dataset names sources (else they are all ``"default"`` and are not sent)."""
    c = draw.after
    head = (draw.batch_index, c.epoch, c.pos, c.batch, c.skip_pending)
    sources = draw.sources if own_sources else None
    ids, srcs = _joined(draw.sample_ids), _joined(sources) if sources is not None else b""
    if ids is None or srcs is None:
        return (*head, draw.sample_ids, sources)  # a NUL inside a name: the strings as they are
    return _HEAD.pack(*head, len(ids), own_sources) + ids + srcs


def _joined(names: list[str]) -> bytes | None:
    """``names`` as one text joined by NUL (None when a name holds a NUL itself). Encoded with
    ``surrogatepass`` so that every ``str`` comes back exactly, even an unpaired surrogate."""
    text = _SEP.join(names)
    return text.encode("utf-8", "surrogatepass") if text.count(_SEP) == len(names) - 1 else None


def named(meta: Named) -> BatchMeta:
    """The batch's IDs, sources and index (split out of what a worker shipped, when it did)."""
    if isinstance(meta, bytes):
        index, _, _, _, _, size, own_sources = _unpack_head(meta)
        at = _HEAD_SIZE + size
        ids = meta[_HEAD_SIZE:at].decode("utf-8", "surrogatepass").split(_SEP)
        srcs = (
            meta[at:].decode("utf-8", "surrogatepass").split(_SEP) if own_sources else ["default"] * len(ids)
        )
        return BatchMeta(ids, srcs, index)
    if isinstance(meta, BatchMeta):
        return meta
    ids, sources = meta[5], meta[6]
    return BatchMeta(ids, sources if sources is not None else ["default"] * len(ids), meta[0])


def _cursor(meta: Shipped) -> Cursor:
    """The cursor after a shipped batch."""
    head = _HEAD.unpack_from(meta) if isinstance(meta, bytes) else meta
    return Cursor(head[1], head[2], head[3], head[4])


class _Scheduled(IterableDataset[tuple[Any, Shipped]]):
    """Runs in each worker: the schedule from its cursor; this worker's share, loaded and packed."""

    def __init__(self, dataset: Any, schedule: Schedule, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.schedule, self.collate_fn = dataset, schedule, collate_fn

    def __iter__(self) -> Iterator[tuple[Any, Shipped]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        sched, dataset = self.schedule, self.dataset
        fetch = getattr(dataset, "__getitems__", None)
        own_sources = sched.source_of is not None
        for draw in sched.turns(worker, workers):  # this worker's batches only
            items = fetch(draw.indices) if fetch else [dataset[i] for i in draw.indices]
            yield self.collate_fn(items), ship(draw, own_sources)


def _as_is(batch: Any) -> Any:
    """The DataLoader's per-item collate: ``_Scheduled`` yields batches already collated."""
    return batch


class _ScheduleSampler:
    """A batch sampler over the schedule (locating datasets); each ``iter()`` starts a new generation."""

    def __init__(self, pipe: MapPipeline) -> None:
        self.pipe = pipe

    def __iter__(self) -> Iterator[list[int]]:
        pipe = self.pipe
        generation = pipe.generation
        while generation == pipe.generation:  # a restarted pipeline orphans this generator
            draw = pipe.schedule.next()
            pipe.pending.append(draw)
            yield draw.indices


class MapPipeline:
    def __init__(
        self, dataset: Any, schedule: Schedule, collate_fn: Callable[[list[Any]], Any], **dataloader: Any
    ) -> None:
        self.schedule = schedule
        self.pending: deque[Draw] = deque()
        self._consumed = Cursor()
        self._after: Shipped | None = None
        """The consumed batch as a worker shipped it: its cursor is unpacked only when asked for."""
        self.generation = 0
        self.dataset, self.collate_fn, self.dataloader = dataset, collate_fn, dataloader
        workers = int(dataloader.get("num_workers", 0))
        self.in_workers = workers > 0 and schedule.locate is None
        """The schedule runs in the workers (``_Scheduled``), which are started afresh per generation."""
        self.loader: DataLoader[Any] | None = None
        if not self.in_workers:
            self.loader = DataLoader(
                dataset, batch_sampler=_ScheduleSampler(self), collate_fn=collate_fn, **dataloader
            )
        self._it: Iterator[Any] | None = None
        self.direct = workers == 0 and not dataloader.get("pin_memory", False)
        """In-process loading without pinning: fetch and collate here, as the DataLoader would."""

    def next(self) -> tuple[Any, Named]:
        """The next batch and its metadata (``named(meta)`` gives its IDs)."""
        if self.in_workers:  # per batch: one tuple unpacked, nothing named (see ``Shipped``)
            it = self._it
            if it is None:
                it = self._it = self._start_workers()
            batch, self._after = next(it)
            return batch, self._after
        if self.direct:  # the DataLoader's single-process iterator would only add per-batch calls
            draw = self.schedule.next()
            fetch = getattr(self.dataset, "__getitems__", None)
            items = fetch(draw.indices) if fetch else [self.dataset[i] for i in draw.indices]
            self.consumed = draw.after
            return self.collate_fn(items), draw
        assert self.loader is not None
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        draw = self.pending.popleft()
        self.consumed = draw.after
        return batch, draw

    @property
    def consumed(self) -> Cursor:
        """The cursor after the last batch the training loop took."""
        if self._after is not None:
            self._consumed, self._after = _cursor(self._after), None
        return self._consumed

    @consumed.setter
    def consumed(self, cursor: Cursor) -> None:
        self._consumed, self._after = cursor, None

    def _start_workers(self) -> Iterator[Any]:
        kw = {**self.dataloader, "persistent_workers": False}  # a generation's workers end with it
        scheduled = _Scheduled(self.dataset, self.schedule.for_worker(), self.collate_fn)
        self.loader = DataLoader(scheduled, batch_size=None, collate_fn=_as_is, **kw)
        return iter(self.loader)

    def restart(self) -> None:
        """Forget prefetched batches; the next batch is drawn from the consumed cursor."""
        self.generation += 1
        self.pending.clear()
        self.schedule.cursor = self.consumed.copy()
        persistent = self.loader is not None and self.loader.persistent_workers
        if self._it is not None and not persistent:
            _shutdown(self._it)
        self._it = None  # persistent workers: the next iter() resets the DataLoader's iterator

    def set_cursor(self, cursor: Cursor) -> None:
        self.consumed = cursor.copy()
        self.restart()

    def close(self) -> None:
        self.generation += 1
        if self._it is not None:
            _shutdown(self._it)
        self._it = None
        if self.loader is not None:
            self.loader._iterator = None  # persistent workers go with their iterator


def _shutdown(it: Any) -> None:
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()
