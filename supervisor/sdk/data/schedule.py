"""The global batch schedule of a map-style dataset and its resumable cursor.

Epoch ``e`` visits the dataset in the order ``Permutation(n, seed, e)``; each *global*
batch takes the next ``batch_size * world_size`` allowed samples of it, and rank ``r`` gets
slice ``r``. A cursor ``(epoch, pos, batch, skip_pending)`` therefore fixes every later
batch on every rank: restoring it replays the same order minus whatever was excluded since.
Skipped batches and excluded batch ranges are drawn and dropped, so batch indices
(``attrs.batch`` in records) keep naming the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.order import Permutation

BLOCK = 4096
"""Positions mapped per numpy call (memory stays O(BLOCK) whatever the dataset size)."""


@dataclass
class Cursor:
    epoch: int = 0
    pos: int = 0
    batch: int = 0
    skip_pending: int = 0

    def public(self) -> dict[str, int]:
        """The ``cursor`` of ``data_state`` (``skip_pending`` is stored beside it)."""
        return {"epoch": self.epoch, "pos": self.pos, "batch": self.batch}


@dataclass(frozen=True)
class Draw:
    """One batch of this rank: dataset indices, their IDs and sources, and the cursor after it."""

    batch_index: int
    indices: list[int]
    sample_ids: list[str]
    sources: list[str]
    after: Cursor


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
        sample_id: Callable[[int], str],
        source: Callable[[int], str],
        exclusions: ExclusionSet,
    ) -> None:
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.sample_id, self.source, self.exclusions = sample_id, source, exclusions
        self.cursor = Cursor()
        self._perm: tuple[tuple[int, int], Permutation] | None = None
        self._block: tuple[int, int, Any] | None = None  # (epoch, start, indices)

    def _block_at(self, epoch: int, pos: int) -> tuple[int, list[int]]:
        """The mapped block holding position ``pos`` of ``epoch``: (its first position, indices)."""
        blk = self._block
        if blk is None or blk[0] != epoch or not blk[1] <= pos < blk[1] + len(blk[2]):
            if self._perm is None or self._perm[0] != (self.seed, epoch):
                self._perm = ((self.seed, epoch), Permutation(self.n, self.seed, epoch, shuffle=self.shuffle))
            blk = self._block = (epoch, pos, self._perm[1].block(pos, BLOCK).tolist())
        return blk[1], blk[2]

    def _allowed(self, i: int) -> bool:
        ex = self.exclusions
        if ex.sources and self.source(i) in ex.sources:
            return False
        return not (ex.samples and self.sample_id(i) in ex.samples)

    def _global_batch(self) -> list[int]:
        c, need, picked = self.cursor, self.batch_size * self.world_size, list[int]()
        check = bool(self.exclusions.samples or self.exclusions.sources)
        scanned = 0  # positions since the last accepted sample
        while len(picked) < need:
            if c.pos >= self.n:
                c.epoch, c.pos = c.epoch + 1, 0
            start, block = self._block_at(c.epoch, c.pos)
            if not check:  # fast path: a slice of the mapped block
                k = min(need - len(picked), start + len(block) - c.pos)
                picked.extend(block[c.pos - start : c.pos - start + k])
                c.pos += k
                continue
            i = block[c.pos - start]
            c.pos += 1
            if self._allowed(i):
                picked.append(i)
                scanned = 0
            elif (scanned := scanned + 1) > self.n:
                raise ValueError("every sample is excluded: the loader cannot form a batch")
        return picked

    def next(self) -> Draw:
        """The next batch this rank trains on; skipped and excluded batches are consumed silently."""
        c = self.cursor
        while True:
            index, picked = c.batch, self._global_batch()
            c.batch += 1
            if c.skip_pending > 0:
                c.skip_pending -= 1
                continue
            if self.exclusions.batch_excluded(index):
                continue
            mine = picked[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            ids = [self.sample_id(i) for i in mine]
            return Draw(index, mine, ids, [self.source(i) for i in mine], replace(c))
