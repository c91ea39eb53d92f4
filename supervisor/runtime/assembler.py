"""Group every rank's records by step, so the detector sees one step at a time, in order.

A step is released when all ranks reported it. A rank's records arrive in order, so once it
reported a *later* step its record of this one is lost for good: the step is released at once
with the ranks present and the gap counted (``missing``), never waited out. Only a rank that
reported nothing newer holds a step, for at most ``deadline_s``. Steps at or below the watermark
were analysed already and are dropped: that makes a resent batch harmless.

A record's tag (link id, seq: ``receipts.py``) goes to ``on_release`` once the record no longer
waits here (analysed or dropped). A decoded batch (``add_frame``: a ``StepFrame`` of several links'
records) is held as one *unit* instead: ``on_release_unit`` once every step it fed was released.
Its records stay in their columns: a step whose ranks all came in one batch, in rank order, is
handed on as that batch's frame, with no object per rank built.

After a rollback or a group restart to step ``c``, records still in flight from the abandoned
timeline must not mix with the new one: after :meth:`rewind` each rank is ignored until it
reports a step ``<= c + 1`` (its first step on the new timeline).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.core.frame import StepFrame
from supervisor.core.records import Record
from supervisor.logging import get_logger

log = get_logger("supervisor.runtime.assembler")

Tag = tuple[str, int]


_ROW_BITS = 32
_WHOLE = (1 << _ROW_BITS) - 1
"""The row of a part that is one record itself."""


class _Bucket:
    """One step's records so far: the parts they came in (a frame, or one record) and, per rank,
    where its record is: ``part << 32 | row`` (row ``_WHOLE``: the part is the record) -- an int,
    not a tuple, so that a thousand ranks a step add nothing for the collector to walk."""

    __slots__ = ("parts", "where")

    def __init__(self) -> None:
        self.parts: list[StepFrame | Record] = []
        self.where: dict[int, int] = {}

    def frame(self) -> StepFrame:
        """The step's records, one per rank, in rank order."""
        parts, where = self.parts, self.where
        first = parts[0]
        if len(parts) == 1 and type(first) is StepFrame:
            ranks = first.col("rank")
            if len(where) == len(first) and ranks == sorted(ranks):  # distinct (add_frame): ascending
                return first  # one batch, every rank once, in order: the batch's own columns
            return first.take([where[r] & _WHOLE for r in sorted(where)])
        picks = [divmod(where[r], 1 << _ROW_BITS) for r in sorted(where)]
        return StepFrame.of([parts[k] if i == _WHOLE else parts[k][i] for k, i in picks])  # type: ignore[index,misc]


class StepAssembler:
    def __init__(
        self,
        world_size: int,
        deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[Tag], None] = lambda tag: None,
        on_release_unit: Callable[[int], None] = lambda unit: None,
    ) -> None:
        self.world_size = world_size
        self.deadline_s = deadline_s
        self.clock = clock
        self.on_release = on_release
        self.on_release_unit = on_release_unit
        self.watermark: int = -1
        self.skipped = 0
        self.missing = 0
        """Rank records never received for a step that was analysed without them."""
        self._pending: dict[int, _Bucket] = {}
        self._tags: dict[int, dict[int, Tag]] = {}
        self._units: dict[int, list[int]] = {}  # step -> units holding records of it
        self._unit_steps: dict[int, int] = {}  # unit -> steps of it not released yet
        self._first_seen: dict[int, float] = {}
        self._resync_at: int | None = None
        self._synced: set[int] = set()
        self.last_seen: dict[int, float] = {}
        self._started = clock()
        self.last_step: dict[int, int] = {}

    def add(self, rank: int, raw: dict[str, Any] | Record, tag: Tag | None = None) -> None:
        """One record (a dict as sent, or a ``Record`` decoded from a packed batch); unusable ones are
        counted and skipped."""
        if self._add(rank, raw, tag) is None and tag is not None:
            self.on_release(tag)

    def add_frame(self, frame: StepFrame, keep: list[bool] | None = None, unit: int | None = None) -> None:
        """A decoded batch's records (``keep``: which of them to take; None: all), held as ``unit``
        until every step it fed is released. A batch that names each rank at most once per step is
        added in columns, step by step; any other (or one with ranks still to resync after a
        rewind) record by record, with the same outcome."""
        fed: set[int] = set()
        synced = self._resync_at is None or self._synced.issuperset(frame.col("rank"))
        chunks = self._by_step(frame) if keep is None and synced else None
        if chunks is not None:
            now = self.clock()
            for step, chunk in chunks:
                ranks = chunk.col("rank")
                self.last_seen.update(dict.fromkeys(ranks, now))
                self.last_step.update(dict.fromkeys(ranks, step))
                if step <= self.watermark:
                    continue
                bucket = self._bucket(step, now)
                if not bucket.where.keys().isdisjoint(ranks):  # a rank's record again: the new one counts
                    tags = self._tags.get(step)
                    for r in ranks:
                        old = tags.pop(r, None) if tags else None
                        if old is not None:
                            self.on_release(old)
                k = len(bucket.parts) << _ROW_BITS
                bucket.parts.append(chunk)
                bucket.where.update(zip(ranks, range(k, k + len(ranks)), strict=True))
                fed.add(step)
        else:
            for i, rec in enumerate(frame):
                if keep is None or keep[i]:
                    got = self._add(rec.rank, rec, None)
                    if got is not None:
                        fed.add(got)
        if unit is None:
            return
        if not fed:
            self.on_release_unit(unit)
            return
        self._unit_steps[unit] = len(fed)
        for step in fed:
            self._units.setdefault(step, []).append(unit)

    @staticmethod
    def _by_step(frame: StepFrame) -> list[tuple[int, StepFrame]] | None:
        """The batch split by step, oldest first, when no rank has two records of one step in it
        (None: it is added record by record). A rank's records come in step order, so the last
        step a rank reported is the newest of its chunks."""
        steps = frame.col("step")
        if not steps:
            return []
        lo, hi = min(steps), max(steps)
        k, m = hi - lo + 1, len(steps)
        if lo == hi:
            chunks = [(steps[0], frame)]
        elif m % k == 0 and list(steps[:k]) == list(range(lo, hi + 1)) and steps == steps[:k] * (m // k):
            # Every link sent the same run of steps (a fast run's batch): step j is every k-th record.
            chunks = [(lo + j, frame.take(range(j, m, k))) for j in range(k)]
        else:
            rows: dict[int, list[int]] = {}
            for i, step in enumerate(steps):
                rows.setdefault(step, []).append(i)
            chunks = [(step, frame.take(ix)) for step, ix in sorted(rows.items())]
        for _, chunk in chunks:
            ranks = chunk.col("rank")
            if len(set(ranks)) != len(ranks):
                return None
        return chunks

    def _bucket(self, step: int, now: float) -> _Bucket:
        bucket = self._pending.get(step)
        if bucket is None:  # the step's first record: its deadline starts
            bucket = self._pending[step] = _Bucket()
            self._first_seen[step] = now
        return bucket

    def _add(self, rank: int, raw: dict[str, Any] | Record, tag: Tag | None) -> int | None:
        """The step the record now waits for (None: it waits for none)."""
        rec = raw if isinstance(raw, Record) else self._parse(rank, raw)
        if rec is None:
            return None
        rank, step, now = rec.rank, rec.step, self.clock()
        self.last_seen[rank] = now
        if self._resync_at is not None and rank not in self._synced:
            if step > self._resync_at + 1:
                return None
            self._synced.add(rank)
        self.last_step[rank] = step
        if step <= self.watermark:
            return None
        tags = self._tags.get(step)
        old = tags.pop(rank, None) if tags else None
        if old is not None:
            self.on_release(old)
        bucket = self._bucket(step, now)
        bucket.where[rank] = len(bucket.parts) << _ROW_BITS | _WHOLE
        bucket.parts.append(rec)
        if tag is not None:
            if tags is None:
                tags = self._tags[step] = {}
            tags[rank] = tag
        return step

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

    def ready(self, *, final: bool = False) -> list[tuple[int, StepFrame]]:
        """Steps ready for the detector, oldest first, each as a frame of its ranks' records in rank
        order. ``final``: no record will come any more (the workers are gone), so every step
        waiting is released with the ranks it has."""
        out: list[tuple[int, StepFrame]] = []
        now = self.clock()
        for step in sorted(self._pending):
            bucket = self._pending[step]
            ranks = bucket.where
            absent = [] if len(ranks) == self.world_size and 0 <= min(ranks) <= max(ranks) < self.world_size else [
                r for r in range(self.world_size) if r not in ranks
            ]  # fmt: skip
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
            out.append((step, bucket.frame()))
            self._release(step)
            self.watermark = step
        return out

    def _release(self, step: int) -> None:
        del self._pending[step]
        del self._first_seen[step]
        for tag in self._tags.pop(step, {}).values():
            self.on_release(tag)
        for unit in self._units.pop(step, ()):
            left = self._unit_steps[unit] - 1
            if left:
                self._unit_steps[unit] = left
            else:
                del self._unit_steps[unit]
                self.on_release_unit(unit)

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
