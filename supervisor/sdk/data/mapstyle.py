"""Map-style datasets through ``torch.utils.data.DataLoader``: worker processes and prefetch.

With ``num_workers=0`` (and no pinning) batches are fetched and collated in place, as the
DataLoader's single-process iterator would.

With workers the schedule runs *in the workers* (``_Scheduled``): each gets a frozen copy of it
(cursor, exclusions, the excluded IDs already inverted to indices) and loads, collates and
names only its own share — batch ``j`` of the generation goes to worker ``j % num_workers``,
the order in which the DataLoader asks its workers in turn and hands their results back. A
worker counts past the others' batches without drawing them (``Schedule.turns``: the excluded
samples placed in the epoch's order once, a batch's start found by binary search) and maps only
its own rank's samples; with sources or un-invertible IDs excluded it walks every batch. A batch arrives with its IDs, sources, index and the cursor
after it, so the training process does no per-batch work beyond the DataLoader's own (it
sends no index lists either), and the cursor of the last *consumed* batch is the loader's
state — not the workers' read-ahead.

When exclusions, skips or a restored cursor change what comes next, ``restart()`` drops the
prefetched batches and the workers; the next batch starts new ones with a schedule copied
from the consumed cursor (a rollback costs one worker start-up, tens of milliseconds).

A dataset that *locates* its samples (``locate(i, batch)``, a mixture schedule that depends on
the training step) is scheduled in the training process instead, as the DataLoader's batch
sampler: its locate function belongs to the training process (it reads the run's plan), and
workers then only load and collate the named indices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from supervisor.sdk.data.ids import BatchMeta
from supervisor.sdk.data.schedule import Cursor, Draw, Schedule

Named = tuple[list[str], list[str] | None, int, tuple[int, int, int, int]]
"""What a worker sends beside a batch: IDs, sources (None: all ``"default"``), batch index, the
cursor after it — plain lists and tuples, the cheapest things to unpickle in the training process."""


class _Scheduled(IterableDataset[tuple[Any, Named]]):
    """Runs in each worker: the schedule from its cursor; this worker's share, loaded and named."""

    def __init__(self, dataset: Any, schedule: Schedule, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.schedule, self.collate_fn = dataset, schedule, collate_fn

    def __iter__(self) -> Iterator[tuple[Any, Named]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        sched, dataset = self.schedule, self.dataset
        fetch = getattr(dataset, "__getitems__", None)
        named_sources = sched.source_of is not None
        for draw in sched.turns(worker, workers):  # this worker's batches only
            items = fetch(draw.indices) if fetch else [dataset[i] for i in draw.indices]
            c = draw.after
            sources = draw.sources if named_sources else None
            yield self.collate_fn(items), (
                draw.sample_ids, sources, draw.batch_index, (c.epoch, c.pos, c.batch, c.skip_pending),
            )  # fmt: skip


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
        self._after: tuple[int, int, int, int] | None = None
        """The consumed cursor as a worker sent it, made a ``Cursor`` only when asked for."""
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

    def next(self) -> tuple[Any, BatchMeta]:
        if self.direct:  # the DataLoader's single-process iterator would only add per-batch calls
            draw = self.schedule.next()
            fetch = getattr(self.dataset, "__getitems__", None)
            items = fetch(draw.indices) if fetch else [self.dataset[i] for i in draw.indices]
            self.consumed = draw.after
            return self.collate_fn(items), draw
        if self.in_workers:
            if self._it is None:
                self._it = self._start_workers()
            batch, (ids, sources, index, self._after) = next(self._it)
            return batch, BatchMeta(ids, sources or ["default"] * len(ids), index)
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
            self._consumed, self._after = Cursor(*self._after), None
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
