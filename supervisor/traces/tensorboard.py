"""TensorBoard event files (``events.out.tfevents.*``), read with TensorBoard's own loader.

A run directory (searched recursively) or single event files. Scalar tags go to trace fields
through ``FieldMap`` (``--map FIELD=TAG``). Conventions handled:

* a directory named like a split (``train/``, ``eval/``, ``validation/``...) prefixes its tags
  (Keras-style ``logs/train/events...`` with tag ``loss`` reads as ``train/loss``);
* a path component ``rank<N>`` (``rank_3``, ``rank-3``) sets the records' rank;
* several files for one run (a restart writes a new file): for a (step, tag) seen twice, the
  later wall time wins.

Needs the optional ``tensorboard`` package (``pip install 'spike-supervisor[tensorboard]'``);
``tensorboard``'s ``EventFileLoader`` reads the TFRecord framing and the protobufs, including
scalars written by tensorboardX / ``torch.utils.tensorboard`` (``simple_value``) and by TF2
(tensor values). A file that is cut short keeps what was read before the cut.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from supervisor.errors import TraceError
from supervisor.traces.base import TraceData
from supervisor.traces.metrics import FieldMap, rows_to_records

EVENT_GLOB = "*tfevents*"
MAX_FILES = 4096
MAX_WALK_ENTRIES = 100_000
"""Most directory entries looked at when searching a directory for event files (``analyze /``
or ``analyze ~`` would otherwise walk the whole tree, /proc included)."""


def walk_files(root: Path) -> Iterator[Path]:
    """Every file under ``root`` (symlinks not followed, unreadable folders passed over); a
    one-line TraceError past ``MAX_WALK_ENTRIES`` entries."""
    seen = 0
    for folder, dirs, names in os.walk(root):
        seen += len(dirs) + len(names)
        if seen > MAX_WALK_ENTRIES:
            raise TraceError(
                f"more than {MAX_WALK_ENTRIES:,} entries under this directory; name the run's own folder",
                source=str(root),
            )
        dirs.sort()
        yield from (Path(folder, n) for n in sorted(names))


_SPLITS = {"train", "training", "eval", "evaluation", "val", "valid", "validation", "test"}
_RANK = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)


def is_event_file(path: Path) -> bool:
    return "tfevents" in path.name and path.is_file()


def event_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in walk_files(path) if "tfevents" in p.name and p.is_file())
    if len(files) > MAX_FILES:
        raise TraceError(f"{len(files)} event files (at most {MAX_FILES})", source=str(path))
    return files


def read_tensorboard(paths: Iterable[Path], fmap: FieldMap | None = None) -> TraceData:
    files = [(root, f) for root in paths for f in event_files(root)]
    if not files:
        raise TraceError(
            "no TensorBoard event files (events.out.tfevents.*)", source=", ".join(map(str, paths))
        )
    loader = _loader()
    # (rank, step, tag) -> (wall_time, value)
    values: dict[tuple[int, int, str], tuple[float, float]] = {}
    skipped = 0
    notes: list[str] = []
    for root, f in files:
        prefix, rank = _context(root, f)
        try:
            for ev in loader(str(f)).Load():
                for v in ev.summary.value:
                    x = _scalar(v)
                    if x is None:
                        continue
                    key = (rank, int(ev.step), prefix + v.tag)
                    old = values.get(key)
                    if old is None or ev.wall_time >= old[0]:
                        values[key] = (ev.wall_time, x)
        except Exception as exc:  # a corrupt or truncated file: keep what came before, say so
            skipped += 1
            notes.append(f"{f.name}: stopped reading at a damaged record ({type(exc).__name__})")
    tags = sorted({k[2] for k in values})
    chosen, map_notes = (fmap or FieldMap()).resolve(tags)
    notes[:0] = map_notes
    if "loss" not in chosen:
        raise TraceError(
            f"no loss tag among {len(tags)} scalar tags ({', '.join(tags[:8])}{', ...' if len(tags) > 8 else ''}); "
            "use --map loss=TAG",
            source=str(files[0][1]),
        )
    records = []
    for rank in sorted({k[0] for k in values}):
        rows: dict[int, dict[str, float]] = {}
        for (r, step, tag), (_, x) in values.items():
            if r == rank:
                rows.setdefault(step, {})[tag] = x
        records += rows_to_records(sorted(rows.items()), chosen, rank=rank)
    records.sort(key=lambda r: (r.step, r.rank))
    notes.insert(0, "fields: " + ", ".join(f"{k}<-{v!r}" for k, v in chosen.items()))
    return TraceData(records, skipped, "tensorboard", notes)


def _loader():  # type: ignore[no-untyped-def]
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError:
        raise TraceError(
            "reading TensorBoard event files needs the `tensorboard` package: "
            "pip install 'spike-supervisor[tensorboard]'",
            source="tensorboard",
        ) from None
    return EventFileLoader


def _scalar(v) -> float | None:  # type: ignore[no-untyped-def]
    if v.HasField("simple_value"):
        return float(v.simple_value)
    if not v.HasField("tensor"):
        return None
    from tensorboard.util import tensor_util

    try:
        arr = tensor_util.make_ndarray(v.tensor)
    except (ValueError, TypeError):
        return None
    if arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(()))


def _context(root: Path, f: Path) -> tuple[str, int]:
    """(tag prefix from a split-named directory, rank from a rank<N> component) of one file."""
    rel = f.parent.relative_to(root) if root.is_dir() else Path()
    prefix = (
        f"{f.parent.name}/" if f.parent.name.lower() in _SPLITS and root.is_dir() and rel != Path() else ""
    )
    rank = 0
    for part in (*rel.parts, f.name):
        m = _RANK.match(part)
        if m:
            rank = int(m.group(1))
    return prefix, rank
