"""Which numbered records the supervisor has received, consumed, and durably accepted
(docs/runtime.md, Crash consistency: "No record is lost").

Every worker link numbers its records 1, 2, 3, ... (``seq``) under a link id of its own, new per
worker process. A link's *consumed* mark is the highest ``seq`` with every record up to it
consumed (analysed, or dropped); it becomes *durable*, and is sent back to the link, only once the
state that reflects those records is on disk. A batch that starts past the next number expected
while its link still holds that number is refused with ``resend_from`` (``offer``); a gap the link
no longer holds is accepted, counted and logged.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from supervisor.logging import get_logger

log = get_logger("supervisor.runtime.receipts")

Tag = tuple[str, int]
"""(link id, seq) of one record."""


class Receipts:
    def __init__(self, durable: Mapping[str, int] | None = None) -> None:
        self.durable: dict[str, int] = dict(durable or {})
        """Per link: the mark of the last state written to disk (what ``ingest`` answers)."""
        self.received: dict[str, int] = dict(self.durable)
        self.lost = 0
        """Records a worker dropped before sending (gaps in its numbering): counted, logged."""
        self._open: dict[str, set[int]] = {}
        self._units: dict[int, dict[str, int]] = {}  # a decoded batch held whole: link -> its lowest seq
        self._next_unit = 0
        self._offered: dict[str, int] = dict(self.durable)  # highest seq let into the inbox, per link
        self._lock = threading.Lock()

    def offer(self, link: str, seqs: Sequence[int], held: tuple[int, int] | None) -> int | None:
        """Called on the actor thread before a batch is queued: None to take it, or the seq the
        link must resend from (it holds records this supervisor never got, older than the batch).
        ``held``: (oldest, newest) seq the link still holds, this batch included."""
        with self._lock:
            top = self._offered.get(link, 0)
            if held is not None:
                oldest, newest = held
                missing_first = top + 1
                behind = seqs[0] > missing_first if seqs else newest > top
                if behind and oldest < (seqs[0] if seqs else newest + 1):
                    return max(missing_first, oldest)
            if seqs:
                self._offered[link] = max(top, seqs[-1])
            return None

    def offer_next(self, links: Sequence[str], seqs: Sequence[int]) -> bool:
        """``offer`` for a batch of one record per link (distinct links), taken whole when each record
        is the next its link numbers (True); False, having changed nothing, for any other batch
        (``offer`` each link then)."""
        with self._lock:
            offered = self._offered
            if [offered.get(link, 0) + 1 for link in links] == list(seqs):
                offered.update(zip(links, seqs, strict=True))
                return True
            return False

    def fresh(self, link: str, seq: int) -> bool:
        """True for a record not seen before (its number is above the link's highest)."""
        last = self.received.get(link, 0)
        if seq <= last:
            return False
        if seq > last + 1:
            gap = seq - last - 1
            self.lost += gap
            log.warning("records_lost", link=link, after_seq=last, missing=gap, lost_total=self.lost,
                        why="the worker's buffer dropped them (RuntimeSettings.buffer_records)")  # fmt: skip
        self.received[link] = seq
        return True

    def fresh_batch(self, links: Sequence[str | None], counts: list[int], seqs: Sequence[int]) -> list[bool] | None:  # fmt: skip
        """``fresh`` for a decoded batch's records (per link its id and how many records, then every
        record's number): None when every record is fresh (the common case, checked without a call
        per record), else which ones are."""
        received = self.received
        if (
            counts.count(1) == len(counts) == len(seqs)
            and None not in links
            and len(set(links)) == len(links)
        ):
            known = [received.get(link, 0) + 1 for link in links]  # type: ignore[arg-type]
            if known == list(seqs):  # one record per link, each the next of its link
                received.update(zip(links, seqs, strict=True))  # type: ignore[arg-type]
                return None
        keep: list[bool] = []
        at = 0
        for link, count in zip(links, counts, strict=True):
            last = received.get(link, 0) if link is not None else 0
            if link is None:
                keep.extend([True] * count)
            elif (
                count
                and seqs[at] == last + 1
                and seqs[at : at + count] == list(range(last + 1, last + count + 1))
            ):
                received[link] = last + count  # the link's next records, in order
                keep.extend([True] * count)
            else:
                keep.extend(self.fresh(link, q) for q in seqs[at : at + count])
            at += count
        return None if all(keep) else keep

    def hold_unit(self, marks: dict[str, int]) -> int:
        """Hold a batch's records whole (``marks``: per link its lowest seq in the batch) until
        :meth:`release_unit`; the id to release it with."""
        self._next_unit += 1
        self._units[self._next_unit] = marks
        return self._next_unit

    def release_unit(self, unit: int) -> None:
        self._units.pop(unit, None)

    def hold(self, tag: Tag) -> None:
        """The record waits (its step is not analysed yet): the link's mark stays below it."""
        self._open.setdefault(tag[0], set()).add(tag[1])

    def release(self, tag: Tag) -> None:
        held = self._open.get(tag[0])
        if held is not None:
            held.discard(tag[1])

    def consumed(self) -> dict[str, int]:
        out = dict(self.received)
        for link, held in self._open.items():
            if held and link in out:
                out[link] = min(held) - 1
        for marks in self._units.values():
            for link, lowest in marks.items():
                if lowest <= out.get(link, lowest):
                    out[link] = lowest - 1
        return out

    def made_durable(self, marks: Mapping[str, int]) -> None:
        """``marks`` (from :meth:`consumed`) are now on disk: links may forget records up to them."""
        self.durable = dict(marks)  # one assignment: actor threads read it without a lock

    def ack_for(self, link: str) -> int:
        return self.durable.get(link, 0)
