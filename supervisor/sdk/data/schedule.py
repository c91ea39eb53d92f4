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
from dataclasses import dataclass
from typing import Any

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.ids import BatchMeta
from supervisor.sdk.data.order import Permutation

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
    ) -> None:
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.id_of, self.source_of, self.exclusions = sample_id, source, exclusions
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

    def sample_id(self, i: int) -> str:
        return str(self.id_of(i)) if self.id_of is not None else str(i)

    def source(self, i: int) -> str:
        return str(self.source_of(i)) if self.source_of is not None else "default"

    def _allowed(self, i: int) -> bool:
        ex = self.exclusions
        if ex.sources and self.source(i) in ex.sources:
            return False
        return not (ex.samples and self.sample_id(i) in ex.samples)

    def _global_batch(self) -> list[int]:
        c, need, picked = self.cursor, self.batch_size * self.world_size, list[int]()
        check = bool(self.exclusions.samples or self.exclusions.sources)
        allowed = self._allowed
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
            if allowed(i):
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
            ids = list(map(str, mine)) if self.id_of is None else [self.sample_id(i) for i in mine]
            srcs = ["default"] * len(mine) if self.source_of is None else [self.source(i) for i in mine]
            return Draw(ids, srcs, index, mine, c.copy())
