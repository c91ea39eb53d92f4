"""The loader's persistent exclusion set: sample IDs, sources, global batch ranges.

Membership is O(1) for IDs and sources (hash sets) and O(log r) for ``r`` merged batch
ranges. IDs are kept as the strings the supervisor names them by, because they go into the
checkpoint's ``data_state`` and back into ``Exclusions`` unchanged; at ~100 bytes per ID a
set of 10^5 exclusions is ~10 MB, independent of the dataset's size.
"""

from __future__ import annotations

import bisect
from typing import Any

from supervisor.sdk.directives import Exclusions


class ExclusionSet:
    def __init__(self) -> None:
        self.samples: set[str] = set()
        self.sources: set[str] = set()
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.version = 0
        """Bumped on every change, so a pipeline can tell its copy is stale."""

    def __bool__(self) -> bool:
        return bool(self.samples or self.sources or self._starts)

    def add(self, ex: Exclusions) -> bool:
        """Merge ``ex`` in; True when something new was added."""
        before = (len(self.samples), len(self.sources), list(zip(self._starts, self._ends, strict=True)))
        self.samples.update(map(str, ex.samples))
        self.sources.update(map(str, ex.sources))
        for a, b in ex.batch_ranges:
            self._add_range(int(a), int(b))
        changed = before != (
            len(self.samples),
            len(self.sources),
            list(zip(self._starts, self._ends, strict=True)),
        )
        self.version += changed
        return changed

    def _add_range(self, a: int, b: int) -> None:
        if b < a:
            return
        ranges = list(zip(self._starts, self._ends, strict=True)) + [(a, b)]
        ranges.sort()
        merged: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self._starts = [lo for lo, _ in merged]
        self._ends = [hi for _, hi in merged]

    @property
    def has_ranges(self) -> bool:
        return bool(self._starts)

    def batch_excluded(self, index: int) -> bool:
        k = bisect.bisect_right(self._starts, index) - 1
        return k >= 0 and index <= self._ends[k]

    def allows(self, sample_id: str, source: str) -> bool:
        return sample_id not in self.samples and source not in self.sources

    def to_exclusions(self) -> Exclusions:
        return Exclusions(
            tuple(sorted(self.samples)),
            tuple(sorted(self.sources)),
            tuple(zip(self._starts, self._ends, strict=True)),
        )

    def load(self, d: dict[str, Any] | None) -> None:
        """Replace the whole set with a ``to_dict`` form (a checkpoint's ``data_state``)."""
        self.samples, self.sources, self._starts, self._ends = set(), set(), [], []
        self.add(Exclusions.from_dict(d))
        self.version += 1

    def copy(self) -> ExclusionSet:
        out = ExclusionSet()
        out.samples, out.sources = set(self.samples), set(self.sources)
        out._starts, out._ends, out.version = list(self._starts), list(self._ends), self.version
        return out
