"""The supervised data pipeline: batches with stable sample IDs, exclusions, a resumable cursor.

The order is a pure function of (seed, epoch): each epoch is a seeded permutation of the
dataset, and each *global* batch takes the next ``batch_size * world_size`` non-excluded
samples from it; rank ``r`` gets slice ``r``. So every rank computes the same global
schedule without talking to the others, and a restored cursor replays exactly the same
order minus exclusions. The cursor (epoch, position, batch index), the exclusion set and the
pending skip count are the loader's ``state_dict`` — the ``data_state`` of a checkpoint.

Sample IDs and sources come from the dataset's ``sample_id(i)`` / ``source(i)`` when it has
them (e.g. ``examples.tinylm.data.TextDataset``), otherwise ``"<index>"`` and ``"default"``:
IDs are dataset-level names, never sample text.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import default_collate

from supervisor.sdk.context import dist_info
from supervisor.sdk.directives import Exclusions

Boundary = Callable[[], None]


class SupervisedLoader:
    """Iterate to get batch dicts: the collated items plus ``sample_ids``, ``sources``, ``batch_index``."""

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
    ) -> None:
        if rank is None or world_size is None:
            rank, world_size = dist_info()
        if len(dataset) < batch_size * world_size:
            raise ValueError(
                f"dataset has {len(dataset)} samples, fewer than one global batch ({batch_size}x{world_size})"
            )
        self.dataset = dataset
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle = shuffle
        self.collate_fn = collate_fn or default_collate
        self.epoch, self.pos, self.batch = 0, 0, 0
        self.skip_pending = 0
        self.excluded_samples: set[str] = set()
        self.excluded_sources: set[str] = set()
        self.excluded_batches: list[tuple[int, int]] = []
        self.boundary: Boundary | None = None
        """Called before each batch is drawn (the probe's step boundary); may raise StopIteration."""
        self._perm: tuple[int, list[int]] | None = None

    # -- metadata ------------------------------------------------------------------------------
    def sample_id(self, i: int) -> str:
        f = getattr(self.dataset, "sample_id", None)
        return str(f(i)) if f is not None else str(i)

    def source(self, i: int) -> str:
        f = getattr(self.dataset, "source", None)
        return str(f(i)) if f is not None else "default"

    # -- orders --------------------------------------------------------------------------------
    def exclude(self, ex: Exclusions) -> None:
        self.excluded_samples.update(ex.samples)
        self.excluded_sources.update(ex.sources)
        self.excluded_batches.extend(ex.batch_ranges)

    def skip(self, n: int) -> None:
        """Consume the next ``n`` batches without yielding them."""
        self.skip_pending += max(0, int(n))

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.boundary is not None:
            self.boundary()
        return self.next_batch()

    def next_batch(self) -> dict[str, Any]:
        while True:
            index, picked = self.batch, self._draw_global()
            self.batch += 1
            if self.skip_pending > 0:
                self.skip_pending -= 1
                continue
            if any(a <= index <= b for a, b in self.excluded_batches):
                continue
            mine = picked[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            batch = self.collate_fn([self.dataset[i] for i in mine])
            if isinstance(batch, dict):
                batch.update(
                    sample_ids=[self.sample_id(i) for i in mine],
                    sources=[self.source(i) for i in mine],
                    batch_index=index,
                )
            return batch

    def _order(self) -> list[int]:
        if self._perm is None or self._perm[0] != self.epoch:
            order = list(range(len(self.dataset)))
            if self.shuffle:
                random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
            self._perm = (self.epoch, order)
        return self._perm[1]

    def _allowed(self, i: int) -> bool:
        if self.excluded_sources and self.source(i) in self.excluded_sources:
            return False
        return not (self.excluded_samples and self.sample_id(i) in self.excluded_samples)

    def _draw_global(self) -> list[int]:
        need, picked = self.batch_size * self.world_size, list[int]()
        scanned = 0  # since the last accepted sample
        while len(picked) < need:
            order = self._order()
            if self.pos >= len(order):
                self.epoch, self.pos = self.epoch + 1, 0
                continue
            i = order[self.pos]
            self.pos += 1
            if self._allowed(i):
                picked.append(i)
                scanned = 0
            elif (scanned := scanned + 1) > len(order):
                raise ValueError("every sample is excluded: the loader cannot form a batch")
        return picked

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "cursor": {"epoch": self.epoch, "pos": self.pos, "batch": self.batch},
            "skip_pending": self.skip_pending,
            "exclusions": self.exclusions().to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state.get("seed", self.seed))
        cur = state["cursor"]
        self.epoch, self.pos, self.batch = int(cur["epoch"]), int(cur["pos"]), int(cur["batch"])
        self.skip_pending = int(state.get("skip_pending", 0))
        ex = Exclusions.from_dict(state.get("exclusions"))
        self.excluded_samples, self.excluded_sources = set(ex.samples), set(ex.sources)
        self.excluded_batches = list(ex.batch_ranges)

    def fixed_batch(self, n: int | None = None) -> Any:
        """The first ``n`` samples of the dataset, the same on every rank (a canary batch)."""
        items = [self.dataset[i] for i in range(min(n or self.batch_size, len(self.dataset)))]
        return self.collate_fn(items)

    def exclusions(self) -> Exclusions:
        return Exclusions(
            tuple(sorted(self.excluded_samples)),
            tuple(sorted(self.excluded_sources)),
            tuple(self.excluded_batches),
        )
