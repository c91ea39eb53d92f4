"""Group every rank's records by step, so the detector sees one step at a time, in order.

A step is released when all ranks reported it, or when it has waited ``deadline_s`` with
some ranks missing (the detector then works with the ranks present; a rank that stays
silent is the hang detector's business). Steps at or below the watermark were analysed
already and are dropped: that makes a resent batch harmless.

After a rollback or a group restart to step ``c`` the timeline starts again at ``c + 1``.
Records still in flight from the abandoned timeline must not mix with the new one, so after
:meth:`rewind` each rank is ignored until it reports a step ``<= c + 1`` (its first step on
the new timeline; records of one rank arrive in order, see ``channel.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.core.records import Record


class StepAssembler:
    def __init__(
        self, world_size: int, deadline_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.world_size = world_size
        self.deadline_s = deadline_s
        self.clock = clock
        self.watermark: int = -1
        self.skipped = 0
        self._pending: dict[int, dict[int, Record]] = {}
        self._first_seen: dict[int, float] = {}
        self._resync_at: int | None = None
        self._synced: set[int] = set()
        self.last_seen: dict[int, float] = {}
        self._started = clock()
        self.last_step: dict[int, int] = {}

    def add(self, rank: int, raw: dict[str, Any]) -> None:
        """Take one record (as sent by a worker); unusable records are counted and skipped."""
        if raw.get("control"):  # an SDK control message (acks while frozen): a heartbeat, not a step
            self.last_seen[int(raw.get("rank", rank))] = self.clock()
            return
        try:
            rec = Record.from_dict(raw)
        except (KeyError, TypeError, ValueError):
            self.skipped += 1
            return
        if "rank" in raw:
            rank = rec.rank
        else:
            rec.rank = rank
        self.last_seen[rank] = self.clock()
        if self._resync_at is not None and rank not in self._synced:
            if rec.step > self._resync_at + 1:
                return
            self._synced.add(rank)
        self.last_step[rank] = rec.step
        if rec.step <= self.watermark:
            return
        self._pending.setdefault(rec.step, {})[rank] = rec
        self._first_seen.setdefault(rec.step, self.clock())

    def ready(self) -> list[tuple[int, list[Record]]]:
        """Steps ready for the detector, oldest first."""
        out: list[tuple[int, list[Record]]] = []
        now = self.clock()
        for step in sorted(self._pending):
            ranks = self._pending[step]
            if len(ranks) < self.world_size and now - self._first_seen[step] < self.deadline_s:
                break
            out.append((step, [ranks[r] for r in sorted(ranks)]))
            del self._pending[step]
            del self._first_seen[step]
            self.watermark = step
        return out

    def reached(self) -> int | None:
        """The furthest step any rank reported on this timeline (None: none yet).

        In data-parallel training a rank completes a step only together with the others (the
        gradient all-reduce), so this is also how far the whole group got: the records of a
        rank that died may have been lost in its send buffer, but its peers' were not.
        """
        return max(self.last_step.values(), default=None)

    def rewind(self, to_step: int) -> None:
        """The job continues from the checkpoint at ``to_step``: drop the abandoned timeline."""
        self.watermark = to_step
        self.last_step.clear()
        self._pending.clear()
        self._first_seen.clear()
        self._resync_at = to_step
        self._synced = set()

    def silent_ranks(self, timeout_s: float, ranks: range, startup_timeout_s: float) -> list[int]:
        """Ranks silent for ``timeout_s`` since their last record; a rank not heard from since the
        group started gets ``startup_timeout_s`` (imports, data, rendezvous take a while)."""
        now = self.clock()
        out = []
        for r in ranks:
            if r in self.last_seen:
                if now - self.last_seen[r] > timeout_s:
                    out.append(r)
            elif now - self._started > startup_timeout_s:
                out.append(r)
        return out

    def touch(self, *, started: bool = False) -> None:
        """Restart every rank's silence clock (after a freeze ends); ``started``: a new group began."""
        now = self.clock()
        if started:
            self.last_seen.clear()
            self._started = now
        for r in list(self.last_seen):
            self.last_seen[r] = now
