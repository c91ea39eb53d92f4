"""The global batch schedule of a map-style dataset and its resumable cursor.

Epoch ``e`` visits the dataset in the order ``Permutation(n, seed, e)``; each *global*
batch takes the next ``batch_size * world_size`` allowed samples of it, and rank ``r`` gets
slice ``r``. A cursor ``(epoch, pos, batch, skip_pending)`` therefore fixes every later
batch on every rank: restoring it replays the same order minus whatever was excluded since.
Skipped batches and excluded batch ranges are drawn and dropped, so batch indices
(``attrs.batch`` in records) keep naming the same batches.

A loader worker takes every ``num_workers``-th batch (``turns``). When the excluded samples
are known as indices (or nothing is excluded by ID or source), it does not draw the others'
batches: excluded indices are placed in the epoch's order once (the permutation's inverse,
sorted), so the ``k``-th allowed sample of an epoch stands at ``k + #(excluded positions
before it)`` — one binary search — and a batch is a range of allowed-sample counts. A worker
counts past the others' batches and maps only its own rank's samples.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.ids import BatchMeta
from supervisor.sdk.data.lookup import Inverse, excluded_indices, member
from supervisor.sdk.data.order import Permutation

Locate = Callable[[int, int], int]
"""``locate(i, batch)``: the dataset index read for order index ``i`` at global batch ``batch``
(the batch its position falls in when nothing is excluded: positions drawn // global batch size)."""

BLOCK = 4096
"""Positions mapped per numpy call (memory stays O(BLOCK) whatever the dataset size)."""


@dataclass(slots=True)
class Cursor:
    epoch: int = 0
    pos: int = 0
    batch: int = 0
    skip_pending: int = 0

    def copy(self) -> Cursor:
        return Cursor(self.epoch, self.pos, self.batch, self.skip_pending)

    def public(self) -> dict[str, int]:
        """The ``cursor`` of ``data_state`` (``skip_pending`` is stored beside it)."""
        return {"epoch": self.epoch, "pos": self.pos, "batch": self.batch}


@dataclass(slots=True)
class Draw(BatchMeta):
    """One batch of this rank: its IDs, sources and index, the dataset indices, the cursor after it."""

    indices: list[int]
    after: Cursor


class _Block:
    """``BLOCK`` mapped positions of one epoch and, when something is excluded, which of them remain."""

    __slots__ = ("key", "start", "stop", "array", "indices", "kept_at", "kept", "version")

    def __init__(self, key: tuple[int, int], start: int, array: np.ndarray, version: int) -> None:
        self.key, self.start, self.stop, self.version = key, start, start + array.size, version
        """``key``: (seed, epoch)."""
        self.array = array
        self.indices: list[int] = array.tolist()
        self.kept_at: list[int] | None = None
        """Offsets (in the block) of the allowed samples, ascending; None when all are allowed."""
        self.kept: list[int] = self.indices

    def filter(self, keep: np.ndarray | None) -> None:
        if keep is None:
            self.kept_at, self.kept = None, self.indices
        else:
            self.kept_at, self.kept = np.flatnonzero(keep).tolist(), self.array[keep].tolist()


class _Placed:
    """Where one epoch's excluded samples stand in its order: sorted positions ``p`` and
    ``gaps[j] = p[j] - j``, the number of allowed positions before ``p[j]`` (non-decreasing)."""

    __slots__ = ("positions", "gaps")

    def __init__(self, positions: np.ndarray) -> None:
        self.positions = np.sort(positions)
        self.gaps = self.positions - np.arange(self.positions.size, dtype=np.int64)

    def allowed_before(self, pos: int) -> int:
        return pos - int(np.searchsorted(self.positions, pos, side="left"))

    def position(self, k: np.ndarray) -> np.ndarray:
        """The position of the ``k``-th allowed sample (0-based) of the epoch, for each ``k``:
        ``k`` plus the excluded positions before it, i.e. those with at most ``k`` allowed before."""
        return k + np.searchsorted(self.gaps, k, side="right")


class Schedule:
    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool,
        sample_id: Callable[[int], Any] | None,
        source: Callable[[int], Any] | None,
        exclusions: ExclusionSet,
        index_of: Inverse | None = None,
        locate: Locate | None = None,
    ) -> None:
        """``index_of`` inverts ``sample_id`` (``lookup.inverse``): excluded IDs are then filtered
        as indices, vectorised, instead of naming every drawn sample. ``locate(i, batch)`` maps an
        order position's index to the index read for global batch ``batch`` (a mixture schedule):
        then every located sample is checked one by one, as it is drawn."""
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.id_of, self.source_of, self.exclusions = sample_id, source, exclusions
        self.index_of, self.locate = index_of, locate
        self.inverts = index_of is not None
        """Excluded IDs are filtered as indices (``index_of`` here, or the cache a worker's copy holds)."""
        self.cursor = Cursor()
        self._perm: tuple[tuple[int, int], Permutation] | None = None
        self._block: _Block | None = None
        self._excluded: tuple[int, np.ndarray] | None = None  # (exclusions.version, sorted indices)
        self._ready: deque[tuple[list[int], int]] = deque()
        """The rest of the current block cut into global batches: (indices, position after)."""
        self._ready_at: tuple[int, int, int, int] | None = None  # (seed, epoch, pos, version) they follow
        self._placed: dict[tuple[int, int, int], _Placed] = {}  # (seed, epoch, version) -> placed exclusions

    def _block_at(self, epoch: int, pos: int) -> _Block:
        """The mapped block holding position ``pos`` of ``epoch``, filtered by the current exclusions."""
        blk, version = self._block, self.exclusions.version
        if blk is None or blk.key != (self.seed, epoch) or not blk.start <= pos < blk.stop:
            blk = self._block = _Block(
                (self.seed, epoch), pos, self._perm_of(epoch).block(pos, BLOCK), version - 1
            )
        if blk.version != version:
            blk.version = version
            blk.filter(self._keep(blk))
        return blk

    def _keep(self, blk: _Block) -> np.ndarray | None:
        """Which of the block's indices are allowed (None: all). One vectorised lookup when IDs invert."""
        ex, indices = self.exclusions, blk.indices
        if not (ex.samples or ex.sources) or self.locate is not None:
            return None
        keep = np.ones(len(indices), dtype=bool)
        if ex.samples and self.inverts:
            keep &= ~member(blk.array, self._excluded_indices())
        elif ex.samples:
            samples, name = ex.samples, self.sample_id
            keep &= np.fromiter((name(i) not in samples for i in indices), bool, len(indices))
        if ex.sources:
            sources, src = ex.sources, self.source
            keep &= np.fromiter((src(i) not in sources for i in indices), bool, len(indices))
        return keep

    def _excluded_indices(self) -> np.ndarray:
        ex, cached = self.exclusions, self._excluded
        if cached is None or cached[0] != ex.version:
            assert self.index_of is not None, "a worker's copy carries its excluded indices"
            cached = self._excluded = (ex.version, excluded_indices(ex.samples, self.index_of))
        return cached[1]

    def sample_id(self, i: int) -> str:
        return str(self.id_of(i)) if self.id_of is not None else str(i)

    def source(self, i: int) -> str:
        return str(self.source_of(i)) if self.source_of is not None else "default"

    def _allowed(self, i: int) -> bool:
        ex = self.exclusions
        if ex.sources and self.source(i) in ex.sources:
            return False
        return not (ex.samples and self.sample_id(i) in ex.samples)

    def _located_batch(self, locate: Locate) -> list[int]:
        """A global batch of located samples, each checked against the exclusions as it is drawn."""
        c, need, picked = self.cursor, self.batch_size * self.world_size, list[int]()
        scanned = 0
        while len(picked) < need:
            if c.pos >= self.n:
                c.epoch, c.pos = c.epoch + 1, 0
            blk = self._block_at(c.epoch, c.pos)
            # The position's own batch (as if nothing were excluded), not the batch being formed:
            # then a located sample depends on its position only, and an exclusion never changes
            # what the positions after it locate.
            i = int(locate(blk.indices[c.pos - blk.start], (c.epoch * self.n + c.pos) // need))
            c.pos += 1
            if self._allowed(i):
                picked.append(i)
                scanned = 0
            elif (scanned := scanned + 1) > self.n:
                raise ValueError("every sample is excluded: the loader cannot form a batch")
        return picked

    def _global_batch(self) -> list[int]:
        if self.locate is not None:
            return self._located_batch(self.locate)
        c = self.cursor
        if self._ready and self._ready_at == (self.seed, c.epoch, c.pos, self.exclusions.version):
            picked, c.pos = self._ready.popleft()  # cut when the block was mapped: the common case
            self._ready_at = (self.seed, c.epoch, c.pos, self.exclusions.version)
            return picked
        picked = self._scan()
        self._cut(self._block_at(c.epoch, c.pos) if c.pos < self.n else None)
        return picked

    def _cut(self, blk: _Block | None) -> None:
        """Cut the rest of ``blk`` after the cursor into whole global batches, all at once."""
        c, need = self.cursor, self.batch_size * self.world_size
        self._ready.clear()
        if blk is None:
            return
        at = c.pos - blk.start
        if blk.kept_at is None:
            ends = range(at + need, len(blk.indices) + 1, need)
            self._ready.extend((blk.indices[e - need : e], blk.start + e) for e in ends)
        else:
            j = bisect.bisect_left(blk.kept_at, at)
            kept, kept_at = blk.kept, blk.kept_at
            ends = range(j + need, len(kept) + 1, need)
            self._ready.extend((kept[e - need : e], blk.start + kept_at[e - 1] + 1) for e in ends)
        self._ready_at = (self.seed, c.epoch, c.pos, self.exclusions.version)

    def _scan(self) -> list[int]:
        c, need, picked = self.cursor, self.batch_size * self.world_size, list[int]()
        scanned = 0  # positions since the last accepted sample: under 2n while any sample is allowed
        while len(picked) < need:
            if c.pos >= self.n:
                c.epoch, c.pos = c.epoch + 1, 0
            blk = self._block_at(c.epoch, c.pos)
            at = c.pos - blk.start
            if blk.kept_at is None:  # nothing excluded here: a slice of the mapped block
                k = min(need - len(picked), blk.stop - c.pos)
                picked += blk.indices[at : at + k]
                c.pos += k
                continue
            j = bisect.bisect_left(blk.kept_at, at)
            k = min(need - len(picked), len(blk.kept_at) - j)
            if k == 0:  # the rest of the block is excluded
                scanned += blk.stop - c.pos
                c.pos = blk.stop
                if scanned >= 2 * self.n:  # (the next allowed one may stand early in the next epoch)
                    raise ValueError("every sample is excluded: the loader cannot form a batch")
                continue
            picked += blk.kept[j : j + k]
            c.pos = blk.start + blk.kept_at[j + k - 1] + 1
            scanned = 0
        return picked

    def next(self) -> Draw:
        """The next batch this rank trains on; skipped and excluded batches are consumed silently."""
        index, mine = self.advance()
        c = self.cursor
        return self._draw(index, mine, Cursor(c.epoch, c.pos, c.batch, c.skip_pending))

    def _draw(self, index: int, mine: list[int], after: Cursor) -> Draw:
        ids = list(map(str, mine)) if self.id_of is None else [self.sample_id(i) for i in mine]
        srcs = ["default"] * len(mine) if self.source_of is None else [self.source(i) for i in mine]
        return Draw(ids, srcs, index, mine, after)

    def advance(self) -> tuple[int, list[int]]:
        """``next`` without naming the samples: the batch index and this rank's dataset indices."""
        c = self.cursor
        while True:
            index, picked = c.batch, self._global_batch()
            c.batch += 1
            if c.skip_pending > 0:
                c.skip_pending -= 1
                continue
            if self.exclusions.has_ranges and self.exclusions.batch_excluded(index):
                continue
            return index, picked[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def turns(self, worker: int, workers: int) -> Iterator[Draw]:
        """The batches of loader worker ``worker`` of ``workers``: exactly what ``next()`` returns
        at calls ``worker``, ``worker + workers``, ... from the cursor on (the DataLoader asks its
        workers in turn). The exclusions must not change while this runs (a worker's frozen copy)."""
        return (
            self._counted_turns(worker, workers) if self._countable() else self._walked_turns(worker, workers)
        )

    def _walked_turns(self, worker: int, workers: int) -> Iterator[Draw]:
        """Every batch drawn, the others' only advanced past (IDs by name, sources, ``locate``)."""
        for _ in range(worker):
            self.advance()
        while True:
            yield self.next()
            for _ in range(workers - 1):
                self.advance()

    def _countable(self) -> bool:
        """Whether allowed samples can be counted without drawing: nothing excluded by source,
        excluded IDs known as indices, and something left to draw."""
        ex = self.exclusions
        if self.locate is not None or ex.sources or (ex.samples and not self.inverts):
            return False
        return self.n > self._excluded_count()

    def _excluded_count(self) -> int:
        return int(self._excluded_indices().size) if self.exclusions.samples else 0

    def _placed_in(self, epoch: int) -> _Placed:
        key = (self.seed, epoch, self.exclusions.version)
        placed = self._placed.get(key)
        if placed is None:
            excluded = self._excluded_indices() if self.exclusions.samples else np.zeros(0, np.int64)
            placed = _Placed(self._perm_of(epoch).positions(excluded))
            if len(self._placed) >= 2:  # the epoch being drawn and the next one
                self._placed.pop(next(iter(self._placed)))
            self._placed[key] = placed
        return placed

    def _perm_of(self, epoch: int) -> Permutation:
        if self._perm is None or self._perm[0] != (self.seed, epoch):
            self._perm = ((self.seed, epoch), Permutation(self.n, self.seed, epoch, shuffle=self.shuffle))
        return self._perm[1]

    def _where(self, g: np.ndarray, allowed: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch and position of each ``g``-th allowed sample since epoch 0's start."""
        epochs, k = np.divmod(g, allowed)
        positions = np.empty_like(k)
        for epoch in np.unique(epochs).tolist():
            here = epochs == epoch
            positions[here] = self._placed_in(epoch).position(k[here])
        return epochs, positions

    def _counted_turns(self, worker: int, workers: int) -> Iterator[Draw]:
        """``turns`` by counting: global batch ``b`` of the walk takes allowed samples ``[g, g +
        need)``; only this worker's batches are mapped, a growing run of them per numpy call."""
        c, bs, need = self.cursor, self.batch_size, self.batch_size * self.world_size
        allowed = self.n - self._excluded_count()
        g = c.epoch * allowed + self._placed_in(c.epoch).allowed_before(c.pos)
        ex, ranges = self.exclusions, self.exclusions.has_ranges
        batch, pending, turn, run = c.batch, c.skip_pending, 0, 2
        slice_at = np.arange(self.rank * bs, (self.rank + 1) * bs, dtype=np.int64)
        while True:
            own: list[tuple[int, int, int, int]] = []  # (index, first sample, batch after, skips after)
            while len(own) < run:
                index, first = batch, g
                batch, g = batch + 1, g + need
                if pending > 0:
                    pending -= 1
                    continue
                if ranges and ex.batch_excluded(index):
                    continue
                if turn % workers == worker:
                    own.append((index, first, batch, pending))
                turn += 1
            run = min(2 * run, max(1, BLOCK // bs))
            firsts = np.array([o[1] for o in own], dtype=np.int64)
            epochs, positions = self._where((firsts[:, None] + slice_at).ravel(), allowed)
            indices = np.empty_like(positions)
            for epoch in np.unique(epochs).tolist():
                here = epochs == epoch
                indices[here] = self._perm_of(epoch).at(positions[here])
            last_epochs, lasts = self._where(firsts + (need - 1), allowed)
            rows = indices.reshape(len(own), bs).tolist()
            draw = self._draw
            for (index, _, after, skips), mine, epoch, last in zip(
                own, rows, last_epochs.tolist(), lasts.tolist(), strict=True
            ):
                self.cursor = Cursor(epoch, last + 1, after, skips)  # replaced, never changed in place
                yield draw(index, mine, Cursor(epoch, last + 1, after, skips))

    def for_worker(self) -> Schedule:
        """A copy that continues from the cursor on its own in a loader worker process: the
        exclusions frozen as they are now, the excluded IDs already inverted (so the copy pickles
        without ``index_of``, which may be a closure, and no worker inverts 10^5 IDs again)."""
        assert self.locate is None, "a locating dataset is scheduled in the training process"
        ex = self.exclusions.copy()
        out = Schedule(
            self.n, self.batch_size, rank=self.rank, world_size=self.world_size, seed=self.seed,
            shuffle=self.shuffle, sample_id=self.id_of, source=self.source_of, exclusions=ex,
        )  # fmt: skip
        out.cursor, out.inverts = self.cursor.copy(), self.inverts
        if self.inverts and ex.samples:
            out._excluded = (ex.version, self._excluded_indices())
        return out
