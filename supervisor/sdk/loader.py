"""The supervised data pipeline: batches with stable sample IDs, exclusions, a resumable cursor.

    loader = SupervisedLoader(dataset, batch_size=8, seed=0, num_workers=2, pin_memory=True)
    for batch in loader: ...                       # the probe's step boundary runs inside
    state = loader.state_dict()                    # torchdata StatefulDataLoader's protocol
    loader.load_state_dict(state)                  # the same batches again, minus exclusions

``dataset`` is either

* **map-style** (``__len__`` + ``__getitem__``): epoch ``e`` is the seeded permutation
  ``Permutation(len, seed, e)`` computed per index (``supervisor.sdk.data.order``), so start-up
  and memory do not grow with the dataset. Each *global* batch takes the next
  ``batch_size * world_size`` non-excluded samples; rank ``r`` gets slice ``r``. Every rank
  computes the same schedule without talking to the others. IDs and sources come from the
  dataset's ``sample_id(i)`` / ``source(i)`` when it has them, else ``"<index>"`` / ``"default"``;
  its ``index_of(sample_id)``, when it has one, finds a sample by ID without a table
  (``supervisor.sdk.data.lookup``). A dataset whose sample at position ``i`` depends on where
  training is (a mixture or curriculum schedule) defines ``locate(i, batch) -> index into
  dataset.base``, ``batch`` being the global batch of ``i``'s position when nothing is excluded:
  it is called in the training process as batches are drawn, so worker processes read exactly
  what was named, and a restored cursor draws the same samples, minus exclusions.
* **iterable / streaming** (an ``IterableDataset``, a Hugging Face streaming dataset,
  ``WebDatasetShards([...])``, or any ``Shards``): shards are split over ranks and loader
  workers, IDs are the items' keys or ``<shard>:<offset>``, exclusions are applied by ID in the
  workers as samples stream past (``supervisor.sdk.data.stream``; needs the ``streaming`` extra).

``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers`` and
``multiprocessing_context`` mean what they mean for ``torch.utils.data.DataLoader``. With
workers a map-style schedule runs in the workers, each batch coming back with its IDs and
cursor (``supervisor.sdk.data.mapstyle``); the loader never ends an epoch, so workers live
until a change. Exclusions, skips and a restored cursor take effect at the next batch:
prefetched batches are dropped and loading resumes from the cursor of the last batch the loop
consumed (map-style and stream workers are started afresh with the new state).

Batches: a mapping gets ``sample_ids``, ``sources`` and ``batch_index``; any other shape
(tuple, list, dataclass, tensor) is yielded as ``collate_fn`` made it, and the probe asks
``batch_meta(batch)`` for its IDs — they are never dropped.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, default_collate

from supervisor.sdk.context import dist_info
from supervisor.sdk.data import lookup
from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.ids import BARE, BatchMeta, attach
from supervisor.sdk.data.mapstyle import MapPipeline, Named, named
from supervisor.sdk.data.schedule import Cursor, Locate, Schedule
from supervisor.sdk.data.shards import as_shards
from supervisor.sdk.data.stream import StreamPipeline, StreamSource
from supervisor.sdk.directives import Exclusions

Boundary = Callable[[], None]


def is_map_style(dataset: Any) -> bool:
    if isinstance(dataset, IterableDataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


class SupervisedLoader:
    """Iterate to get batches with their sample IDs; ``state_dict`` / ``load_state_dict`` resume them."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        multiprocessing_context: Any = None,
        id_key: str | None = None,
        id_fn: Callable[[Any], str] | None = None,
        source_fn: Callable[[Any], str] | None = None,
    ) -> None:
        """``id_key`` / ``id_fn`` / ``source_fn`` name a stream item's ID and source (streams only)."""
        if rank is None or world_size is None:
            rank, world_size = dist_info()
        self.dataset = dataset
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle = shuffle
        self.collate_fn = collate_fn or default_collate
        self.excluded = ExclusionSet()
        self.boundary: Boundary | None = None
        """Called before each batch is drawn (the probe's step boundary); may raise StopIteration."""
        self._recent: deque[tuple[Any, Named]] = deque(maxlen=4)
        """The last batches yielded and their metadata, named only when ``batch_meta`` asks."""
        self._drawn: list[Named] | None = None
        """The metadata of each batch drawn since the last ``take_drawn()`` (kept once ``track_draws()``
        asked for it: a loop that reports its own steps, ``sdk.watch``)."""
        self._dirty = False
        self._checked = False
        workers = {
            "num_workers": num_workers, "pin_memory": pin_memory, "prefetch_factor": prefetch_factor,
            "multiprocessing_context": multiprocessing_context,
        }  # fmt: skip
        self.streaming = not is_map_style(dataset)
        self._locate: Locate | None = None if self.streaming else getattr(dataset, "locate", None)
        self.reads = dataset.base if self._locate is not None else dataset
        """What samples are read from (and named by): the dataset, or the ``base`` of one that locates."""
        self._id_of = getattr(self.reads, "sample_id", None)
        self._source_of = getattr(self.reads, "source", None)
        self._index_of = None if self.streaming else lookup.inverse(self.reads, len(self.reads))
        self._map: MapPipeline | None = None
        self._stream: StreamPipeline | None = None
        if self.streaming:
            source = StreamSource(
                as_shards(dataset), rank=rank, world_size=world_size, seed=seed, shuffle=shuffle,
                exclusions=self.excluded, id_key=id_key, id_fn=id_fn, source_fn=source_fn,
            )  # fmt: skip
            self._stream = StreamPipeline(source, batch_size, self.collate_fn, **workers)
        else:
            if len(dataset) < batch_size * world_size:
                raise ValueError(
                    f"dataset has {len(dataset)} samples, fewer than one global batch ({batch_size}x{world_size})"
                )
            schedule = Schedule(
                len(dataset), batch_size, rank=rank, world_size=world_size, seed=seed, shuffle=shuffle,
                sample_id=self._id_of, source=self._source_of, exclusions=self.excluded,
                index_of=self._index_of, locate=self._locate,
            )  # fmt: skip
            if persistent_workers is None:
                persistent_workers = num_workers > 0
            kw = {k: v for k, v in workers.items() if v is not None}
            self._map = MapPipeline(
                self.reads, schedule, self.collate_fn, persistent_workers=persistent_workers, **kw
            )

    # -- metadata ------------------------------------------------------------------------------
    def sample_id(self, i: int) -> str:
        f = self._id_of
        return str(f(i)) if f is not None else str(i)

    def source(self, i: int) -> str:
        f = self._source_of
        return str(f(i)) if f is not None else "default"

    def batch_meta(self, batch: Any) -> BatchMeta | None:
        """IDs, sources and index of a batch this loader yielded recently (any batch shape)."""
        for b, meta in reversed(self._recent):
            if b is batch:
                return named(meta)
        return None

    def track_draws(self) -> None:
        """Keep the metadata of every batch drawn until ``take_drawn()``: all micro-batches of a step."""
        if self._drawn is None:
            self._drawn = []

    @property
    def drawn_count(self) -> int:
        """Batches drawn since the last ``take_drawn()`` (0 when draws are not tracked)."""
        return len(self._drawn) if self._drawn is not None else 0

    def take_drawn(self) -> list[BatchMeta]:
        """IDs, sources and index of each batch drawn since the last call, in draw order; then forget them."""
        if not self._drawn:
            return []
        out, self._drawn = [named(m) for m in self._drawn], []
        return out

    # -- orders --------------------------------------------------------------------------------
    def exclude(self, ex: Exclusions) -> None:
        if self.excluded.add(ex):
            self._dirty = True

    def skip(self, n: int) -> None:
        """Consume the next ``n`` batches without yielding them."""
        if int(n) > 0:
            self._restart()
            if self._map is not None:
                self._map.schedule.cursor.skip_pending += int(n)
                self._map.consumed.skip_pending += int(n)
            elif self._stream is not None:
                self._stream.skip_pending += int(n)

    @property
    def skip_pending(self) -> int:
        if self._map is not None:
            return self._map.consumed.skip_pending
        return self._stream.skip_pending if self._stream is not None else 0

    def _restart(self) -> None:
        if self._map is not None:
            self._map.restart()
        elif self._stream is not None:
            self._stream.restart()
        self._dirty = False

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.boundary is not None:
            self.boundary()
        return self.next_batch()

    def next_batch(self) -> Any:
        if self._dirty:
            self._restart()
        batch, meta = self._map.next() if self._map is not None else self._next_stream()
        if type(batch) not in BARE:  # a tensor, tuple or list carries no IDs: named when asked
            meta = named(meta)  # (kept named: batch_meta then hands back the lists the batch holds)
            batch = attach(batch, meta)
        self._recent.append((batch, meta))
        if self._drawn is not None:
            self._drawn.append(meta)
        return batch

    def _next_stream(self) -> tuple[Any, BatchMeta]:
        assert self._stream is not None
        while True:
            batch, meta = self._stream.next_raw()
            if self._stream.skip_pending > 0:
                self._stream.skip_pending -= 1
                continue
            if not self.excluded.batch_excluded(meta.batch_index):
                return batch, meta

    def epoch_progress(self) -> float | None:
        """Passes over the dataset consumed so far (``1.5``: half-way through the second epoch),
        from the cursor of the last batch the loop consumed; None for a stream (no length)."""
        if self._map is None:
            return None
        cur = self._map.consumed
        return cur.epoch + cur.pos / len(self.dataset)

    # -- state (torchdata StatefulDataLoader's protocol) ----------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seed": self.seed, "skip_pending": self.skip_pending}
        if self._map is not None:
            out["cursor"] = self._map.consumed.public()
        elif self._stream is not None:
            out["cursor"] = {"batch": self._stream.batch}
            out["stream"] = self._stream.stream_state()
        out["exclusions"] = self.exclusions().to_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor; the saved exclusions are *added* to the live ones.

        Exclusions only grow: rolling back to a checkpoint older than an exclusion must not
        let the excluded samples back in (a new process starts with none, so it gets exactly
        the checkpoint's, plus whatever the supervisor re-delivers).
        """
        self.seed = int(state.get("seed", self.seed))
        cur = state["cursor"]
        self.excluded.add(Exclusions.from_dict(state.get("exclusions")))
        skip = int(state.get("skip_pending", 0))
        if self._map is not None:
            self._map.schedule.seed = self.seed
            self._map.set_cursor(Cursor(int(cur["epoch"]), int(cur["pos"]), int(cur["batch"]), skip))
        elif self._stream is not None:
            self._stream.restart(state.get("stream"), keep=False)
            self._stream.batch, self._stream.skip_pending = int(cur["batch"]), skip
        self._dirty = False

    # -- samples by ID (replay) -----------------------------------------------------------------
    def samples(self, sample_ids: list[str], *, deadline: float | None = None) -> list[Any]:
        """The items these IDs name, in this order, found without a table of the dataset
        (``supervisor.sdk.data.lookup``); an ID that names nothing is a ``KeyError``, never a
        smaller batch. ``deadline`` (``time.monotonic()``) bounds a scan of IDs that do not invert."""
        ids = [str(s) for s in sample_ids]
        if self._stream is not None:
            src = self._stream.source
            found = lookup.find_in_stream(
                ids, src.shards.names, src.shards.open, src.name_of, deadline=deadline
            )
        else:
            n = len(self.reads)
            at = lookup.find_indices(ids, n, self.sample_id, self._index_of, deadline=deadline)
            found = {sid: self.reads[i] for sid, i in at.items()}
        missing = [s for s in ids if s not in found]
        if missing:
            raise KeyError(f"samples not in the dataset: {missing[:3]}")
        return [found[s] for s in ids]

    def control_ids(self, n: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """``n`` ordinary sample IDs, the same on every rank, none of ``exclude`` nor excluded by this
        loader: spread evenly over a map-style dataset, the first ones of a stream's shards."""
        ex, chosen = self.excluded, list[str]()
        if self._stream is not None:
            src = self._stream.source
            for j in range(len(src.shards.names)):
                for k, item in enumerate(itertools.islice(src.shards.open(j), 4 * n)):
                    sid = src.name_of(item, j, k)
                    if sid not in exclude and ex.allows(sid, src.source_of(item)):
                        chosen.append(sid)
                        if len(chosen) == n:
                            return chosen
            return chosen
        size = len(self.reads)
        for i in range(0, size, max(1, size // (4 * n))):  # a range: nothing of dataset size is built
            sid = self.sample_id(i)
            if sid not in exclude and ex.allows(sid, self.source(i)):
                chosen.append(sid)
                if len(chosen) == n:
                    break
        return chosen

    def fixed_batch(self, n: int | None = None) -> Any:
        """The first ``n`` samples of the dataset (of its first shard for a stream), the same on every rank."""
        n = n or self.batch_size
        if self._stream is not None:
            items = list(itertools.islice(self._stream.source.shards.open(0), n))
        else:
            items = [self.reads[i] for i in range(min(n, len(self.reads)))]
        return self.collate_fn(items)

    def exclusions(self) -> Exclusions:
        return self.excluded.to_exclusions()

    def close(self) -> None:
        """Stop worker processes (also done when the loader is garbage-collected)."""
        for pipe in (self._map, self._stream):
            if pipe is not None:
                pipe.close()
