"""Map-style datasets through ``torch.utils.data.DataLoader``: worker processes and prefetch.

With ``num_workers=0`` (and no pinning) batches are fetched and collated in place, as the
DataLoader's single-process iterator would. With workers the schedule runs in the training
process, as the DataLoader's batch sampler: it decides
which indices form each batch (so exclusions never need to reach the workers), and every
batch it hands out is queued here with its IDs and the cursor after it. Workers only load
and collate. Batches come back in the order they were sampled, so the head of the queue
always describes the batch just yielded, and the cursor of the last *consumed* batch is the
loader's state — not the sampler's read-ahead.

When exclusions, skips or a restored cursor change what comes next, ``restart()`` drops the
prefetched batches and samples again from the consumed cursor: with persistent workers the
DataLoader's own reset drains in-flight work and keeps the processes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from supervisor.sdk.data.ids import BatchMeta
from supervisor.sdk.data.schedule import Cursor, Draw, Schedule


class _ScheduleSampler:
    """A batch sampler over the schedule; each ``iter()`` starts a new generation."""

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
        self.consumed = Cursor()
        self.generation = 0
        self.loader = DataLoader(
            dataset, batch_sampler=_ScheduleSampler(self), collate_fn=collate_fn, **dataloader
        )
        self._it: Iterator[Any] | None = None
        self.dataset, self.collate_fn = dataset, collate_fn
        self.direct = self.loader.num_workers == 0 and not self.loader.pin_memory
        """In-process loading without pinning: fetch and collate here, as the DataLoader would."""

    def next(self) -> tuple[Any, BatchMeta]:
        if self.direct:  # the DataLoader's single-process iterator would only add per-batch calls
            draw = self.schedule.next()
            fetch = getattr(self.dataset, "__getitems__", None)
            items = fetch(draw.indices) if fetch else [self.dataset[i] for i in draw.indices]
            self.consumed = draw.after
            return self.collate_fn(items), draw
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        draw = self.pending.popleft()
        self.consumed = draw.after
        return batch, draw

    def restart(self) -> None:
        """Forget prefetched batches; the next batch is drawn from the consumed cursor."""
        self.generation += 1
        self.pending.clear()
        self.schedule.cursor = self.consumed.copy()
        if self._it is not None and not self.loader.persistent_workers:
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
        self.loader._iterator = None  # persistent workers go with their iterator


def _shutdown(it: Any) -> None:
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()
