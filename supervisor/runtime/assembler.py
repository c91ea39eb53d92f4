"""Group every rank's records by step, so the detector sees one step at a time, in order.

A step is released when all ranks reported it. A rank's records arrive in order, so once it
reported a *later* step its record of this one is lost for good: the step is released at once
with the ranks present and the gap counted (``missing``), never waited out. Only a rank that
reported nothing newer holds a step, for at most ``deadline_s``. Steps at or below the watermark
were analysed already and are dropped: that makes a resent batch harmless.

A record's tag (link id, seq: ``receipts.py``) goes to ``on_release`` once the record no longer
waits here (analysed or dropped).

After a rollback or a group restart to step ``c``, records still in flight from the abandoned
timeline must not mix with the new one: after :meth:`rewind` each rank is ignored until it
reports a step ``<= c + 1`` (its first step on the new timeline).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.core.records import Record
from supervisor.logging import get_logger

log = get_logger("supervisor.runtime.assembler")

Tag = tuple[str, int]


class StepAssembler:
    def __init__(
        self,
        world_size: int,
        deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[Tag], None] = lambda tag: None,
    ) -> None:
        self.world_size = world_size
        self.deadline_s = deadline_s
        self.clock = clock
        self.on_release = on_release
        self.watermark: int = -1
        self.skipped = 0
        self.missing = 0
        """Rank records never received for a step that was analysed without them."""
        self._pending: dict[int, dict[int, Record]] = {}
        self._tags: dict[int, dict[int, Tag]] = {}
        self._first_seen: dict[int, float] = {}
        self._resync_at: int | None = None
        self._synced: set[int] = set()
        self.last_seen: dict[int, float] = {}
        self._started = clock()
        self.last_step: dict[int, int] = {}

    def add(self, rank: int, raw: dict[str, Any] | Record, tag: Tag | None = None) -> None:
        """One record (a dict as sent, or a ``Record`` decoded from a packed batch); unusable ones are
        counted and skipped."""
        if not self._add(rank, raw, tag) and tag is not None:
            self.on_release(tag)

    def _add(self, rank: int, raw: dict[str, Any] | Record, tag: Tag | None) -> bool:
        """True when the record now waits for its step."""
        rec = raw if isinstance(raw, Record) else self._parse(rank, raw)
        if rec is None:
            return False
        rank, step, now = rec.rank, rec.step, self.clock()
        self.last_seen[rank] = now
        if self._resync_at is not None and rank not in self._synced:
            if step > self._resync_at + 1:
                return False
            self._synced.add(rank)
        self.last_step[rank] = step
        if step <= self.watermark:
            return False
        tags = self._tags.get(step)
        old = tags.pop(rank, None) if tags else None
        if old is not None:
            self.on_release(old)
        pending = self._pending.get(step)
        if pending is None:  # the step's first record: its deadline starts
            pending = self._pending[step] = {}
            self._first_seen[step] = now
        pending[rank] = rec
        if tag is not None:
            if tags is None:
                tags = self._tags[step] = {}
            tags[rank] = tag
        return True

    def _parse(self, rank: int, raw: dict[str, Any]) -> Record | None:
        if raw.get("control"):  # an SDK control message (acks while frozen): a heartbeat, not a step
            self.last_seen[int(raw.get("rank", rank))] = self.clock()
            return None
        try:
            rec = Record.from_dict(raw)
        except (KeyError, TypeError, ValueError):
            self.skipped += 1
            return None
        if "rank" not in raw:
            rec.rank = rank
        return rec

    def ready(self, *, final: bool = False) -> list[tuple[int, list[Record]]]:
        """Steps ready for the detector, oldest first. ``final``: no record will come any more
        (the workers are gone), so every step waiting is released with the ranks it has."""
        out: list[tuple[int, list[Record]]] = []
        now = self.clock()
        for step in sorted(self._pending):
            ranks = self._pending[step]
            absent = [r for r in range(self.world_size) if r not in ranks]
            if absent:
                moved_on = all(self.last_step.get(r, -1) > step for r in absent)
                timed_out = now - self._first_seen[step] >= self.deadline_s
                if not (moved_on or timed_out or final):
                    break
                why = ("later steps arrived from them" if moved_on
                       else "the workers ended" if final else f"waited step_deadline_s={self.deadline_s:g}s")  # fmt: skip
                self.missing += len(absent)
                log.warning(
                    "rank_record_missing", step=step, ranks=absent, why=why, missing_total=self.missing
                )
            out.append((step, [ranks[r] for r in sorted(ranks)]))
            self._release(step)
            self.watermark = step
        return out

    def _release(self, step: int) -> None:
        del self._pending[step]
        del self._first_seen[step]
        for tag in self._tags.pop(step, {}).values():
            self.on_release(tag)

    def reached(self) -> int | None:
        """The furthest step any rank reported on this timeline (None: none yet): how far the whole
        group got, since a rank completes a step only together with the others (the all-reduce)."""
        return max(self.last_step.values(), default=None)

    def rewind(self, to_step: int) -> None:
        self.watermark = to_step
        self.last_step.clear()
        for step in list(self._pending):
            self._release(step)
        self._resync_at = max(to_step, 0)  # from scratch (-1) the first step is 1
        self._synced = set()

    def silent_ranks(self, timeout_s: float, ranks: range, startup_timeout_s: float) -> list[int]:
        """Ranks silent for ``timeout_s`` since their last record; a rank not heard from since the
        group started gets ``startup_timeout_s`` (imports, data, rendezvous take a while)."""
        now = self.clock()
        seen = self.last_seen
        if (ranks and ranks.step == 1 and len(seen) == len(ranks) and min(seen) == ranks.start
                and max(seen) == ranks[-1] and now - min(seen.values()) <= timeout_s):  # fmt: skip
            return []  # exactly these ranks, all heard from within the timeout: no walk in Python
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
