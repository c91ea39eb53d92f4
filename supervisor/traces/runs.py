"""One run from several files: one per rank (``trace_rank3.jsonl``, ``rank_3.log``), or pieces.

Ranks: a file whose records all say rank 0 takes the rank its name gives (``rank3``, ``rank_3``,
``rank-3``); when no name gives one and several such files remain, they are ranks 0, 1, ... in
file-name order (said in a note). A file whose records name several ranks is kept as written.

Merging keeps replays: each file is cut into segments where its step numbers go back (a
rollback re-ran steps); segment k of every file is merged by step, then segments follow each
other, so the analyzer sees each replay once, as it happened.
"""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.core.records import Record
from supervisor.traces.base import TraceData

_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    m = _RANK.search(path.name)
    return int(m.group(1)) if m else None


def merge_files(parsed: list[tuple[Path, TraceData]]) -> TraceData:
    notes: list[str] = []
    unnamed: list[list[Record]] = []
    per_file: list[list[Record]] = []
    for path, data in parsed:
        recs = data.records
        if len({r.rank for r in recs}) == 1 and recs[0].rank == 0:
            rank = rank_from_name(path)
            if rank is None:
                unnamed.append(recs)
            else:
                for r in recs:
                    r.rank = rank
        per_file.append(recs)
    if len(unnamed) > 1:
        taken = {r.rank for recs in per_file if all(recs is not u for u in unnamed) for r in recs}
        free = (i for i in range(len(per_file) + len(taken)) if i not in taken)
        for recs in unnamed:
            rank = next(free)
            for r in recs:
                r.rank = rank
        notes.append(
            f"{len(unnamed)} files without a rank in their name or records: ranks given in name order"
        )
    world = len({r.rank for recs in per_file for r in recs})
    for recs in per_file:
        for r in recs:
            r.world_size = max(r.world_size, world)
    segments: list[list[Record]] = []
    for recs in per_file:
        for k, seg in enumerate(_segments(recs)):
            if k == len(segments):
                segments.append([])
            segments[k].extend(seg)
    merged = [r for seg in segments for r in sorted(seg, key=lambda r: r.step)]
    formats = sorted({d.format for _, d in parsed})
    fmt = f"{'/'.join(formats)}, {len(parsed)} files"
    skipped = sum(d.skipped_lines for _, d in parsed)
    notes += [n for _, d in parsed for n in d.notes][:20]
    return TraceData(merged, skipped, fmt, notes)


def _segments(recs: list[Record]) -> list[list[Record]]:
    out: list[list[Record]] = [[]]
    last: int | None = None
    for r in recs:
        if last is not None and r.step < last and out[-1]:
            out.append([])
        out[-1].append(r)
        last = r.step
    return out
