"""The telemetry wire: record batches as columns on the Ray hop from the ranks to the supervisor.

A rank's link (``ranks/channel.py``) and the rank emulator (``drills/emulator.py``) send their
records as one *packed batch*: per field one column over all records (numbers as ``array``
buffers, which Ray copies as bytes instead of unpickling one object per value), sources, sample
IDs and events as flat columns with per-record counts, and the records of several links in one
batch (``groups``). The supervisor actor decodes it in bulk: into one ``StepFrame`` (``unpack_frame``:
the columns as they came, no object per record) when every record travelled in the clean columns,
else straight into ``Record`` objects (``unpack``), without a dict per record. What the trace files hold (docs/sdk.md, the
telemetry record) is unchanged: the wire is not the trace.

A record that does not fit the columns (a control message, a field outside the record's table, a
source with other keys, a sample ID holding the separator) travels as itself, a plain dict, at
its place in the batch. A column whose values are not all of one clean type travels as a plain
list; the decoder then rebuilds dicts and the supervisor validates them one by one
(``Record.from_dict``), as for any record dict. A batch that is not a packed batch of this
version, or whose parts do not add up, is refused whole with :class:`WireError` naming the part.

Layout of a packed batch (a dict)::

    wire     WIRE_VERSION
    groups   (ranks, link ids, held, counts): per link its rank, id (or None), the (oldest, newest)
             seq it still holds (-1, -1: not said) and how many records it has here, in order
    seq      array('q') of every record's number within its link, or None (unnumbered)
    m        how many records are columnar (the others are ``rows``)
    cols     {field: array | list}, each of length m, for the scalar fields of the record table
    sources  None | (names, per-record count, name index, tokens, loss_sum)
    samples  None | (per-record count, IDs joined by SEP)
    events   None | (per-record count, events joined by SEP)
    attrs    None | [dict | None] of length m
    rows     [(position in the batch, record dict), ...] in ascending position
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

from supervisor.core.frame import SEP, Column, Flat, StepFrame, source_views, split_joined
from supervisor.core.records import MAX_STEP, Record, SourceView

WIRE_VERSION = 1
MAX_BATCH = 1_000_000
"""Records one packed batch may hold; a larger claim is refused before anything is built."""

_FLOAT = ("time", "loss", "loss_sum", "batch_mean_loss", "lr", "grad_norm", "param_norm", "update_norm",
          "loss_scale", "seq_len_mean", "step_time", "tokens_per_s")  # fmt: skip
_INT = ("step", "rank", "world_size", "tokens", "seq_len_max")
_BOOL = ("overflow", "nonfinite")
_STR = ("nonfinite_at", "param_checksum")
_TYPECODE = {**dict.fromkeys(_FLOAT, "d"), **dict.fromkeys(_INT, "q"), **dict.fromkeys(_BOOL, "b")}
_SCALARS = (*_FLOAT, *_INT, *_BOOL, *_STR)
_NESTED = ("sources", "samples", "events", "attrs")
_FIELDS = frozenset((*_SCALARS, *_NESTED))
_SOURCE_KEYS = frozenset(("tokens", "loss_sum"))

Group = tuple[int, str | None, tuple[int, int] | None, list[int] | None, list[Any]]
"""(rank, link id, held range, seqs, records) of one link's part of a batch."""


class WireError(ValueError):
    """A packed batch that cannot be decoded; the message names the part that is wrong."""


# -- the sending side -------------------------------------------------------------------------------
def pack(groups: Sequence[tuple[int, str | None, tuple[int, int] | None, Sequence[int] | None, Sequence[dict[str, Any]]]]) -> dict[str, Any]:  # fmt: skip
    """One packed batch of several links' records: ``(rank, link id, held, seqs, records)`` each."""
    columnar: list[dict[str, Any]] = []
    ranks: list[Any] = []  # a record without its own rank is its link's (as the supervisor reads it)
    rows: list[tuple[int, dict[str, Any]]] = []
    at = 0
    for rank, _link, _held, _seqs, records in groups:
        for rec in records:
            if _fits(rec):
                columnar.append(rec)
                ranks.append(rec.get("rank", rank))
            else:
                rows.append((at, rec))
            at += 1
    present = set().union(*(r.keys() for r in columnar)) if columnar else set()
    cols = {f: [r.get(f) for r in columnar] for f in _SCALARS if f in present and f != "rank"}
    if columnar:
        cols["rank"] = ranks
    return _assemble(
        [(g[0], g[1], g[2], g[3], len(g[4])) for g in groups], cols,
        sources=_source_lists(columnar) if "sources" in present else None,
        samples=[rec.get("samples") or () for rec in columnar] if "samples" in present else None,
        events=[rec.get("events") or () for rec in columnar] if "events" in present else None,
        attrs=[r.get("attrs") for r in columnar] if "attrs" in present else None,
        rows=rows,
    )  # fmt: skip


def pack_columns(
    groups: Sequence[tuple[int, str | None, tuple[int, int] | None, Sequence[int] | None, int]],
    cols: dict[str, list[Any]],
    *,
    sources: tuple[list[str], list[int], list[int], list[Any], list[Any]] | None = None,
    samples: Sequence[Sequence[str]] | None = None,
    events: Sequence[Sequence[str]] | None = None,
    attrs: list[Any] | None = None,
) -> dict[str, Any]:
    """The packed batch ``pack`` makes of the same records, from their columns: for a sender that
    makes records in bulk (the rank emulator), with no dict per record. ``groups``: ``(rank, link id,
    held, seqs, count)`` per link; ``cols``: each scalar field's values over every record in group
    order (``rank`` among them, ``None`` where a record lacks the field); ``sources``: (names,
    per-record count, name index, tokens, loss_sum); ``samples`` / ``events``: per record its
    strings. The caller vouches for what ``pack`` checks per record (``_fits``): every value one the
    columns carry, strings without the separator."""
    unknown = cols.keys() - set(_SCALARS)
    if unknown:
        raise ValueError(f"not scalar fields of the record: {sorted(unknown)}")
    ordered = {f: cols[f] for f in _SCALARS if f in cols and f != "rank"}
    if "rank" in cols:
        ordered["rank"] = cols["rank"]
    return _assemble(groups, ordered, sources=sources, samples=samples, events=events, attrs=attrs, rows=[])


def _assemble(
    groups: Sequence[tuple[int, str | None, tuple[int, int] | None, Sequence[int] | None, int]],
    cols: dict[str, list[Any]],
    *,
    sources: tuple[list[str], list[int], list[int], list[Any], list[Any]] | None,
    samples: Sequence[Sequence[str]] | None,
    events: Sequence[Sequence[str]] | None,
    attrs: list[Any] | None,
    rows: list[tuple[int, dict[str, Any]]],
) -> dict[str, Any]:
    numbered = all(g[3] is not None for g in groups)
    held: list[int] = []
    seq: list[int] = []
    for _rank, _link, h, seqs, _count in groups:
        held.extend((-1, -1) if h is None else h)
        if numbered:
            seq.extend(seqs)  # type: ignore[arg-type]
    m = len(cols["rank"]) if "rank" in cols else 0
    return {
        "wire": WIRE_VERSION,
        "groups": (
            array("q", [g[0] for g in groups]),
            [g[1] for g in groups],
            array("q", held),
            array("q", [g[4] for g in groups]),
        ),  # fmt: skip
        "seq": array("q", seq) if numbered else None,
        "m": m,
        "cols": {f: _column(f, v) for f, v in cols.items()},
        "sources": None if sources is None else _source_columns(*sources),
        "samples": None if samples is None else _pack_strings(samples),
        "events": None if events is None else _pack_strings(events),
        "attrs": attrs,
        "rows": rows,
    }


def _fits(rec: Any) -> bool:
    """A record the columns carry exactly (anything else travels as itself)."""
    if type(rec) is not dict or not rec.keys() <= _FIELDS or "step" not in rec or "loss" not in rec:
        return False
    if type(rec.get("rank", 0)) is not int:
        return False
    src = rec.get("sources")
    if src is not None and not _sources_fit(src):
        return False
    samples, events, attrs = rec.get("samples"), rec.get("events"), rec.get("attrs")
    return ((samples is None or _strings_fit(samples)) and (events is None or _strings_fit(events))
            and (attrs is None or type(attrs) is dict))  # fmt: skip


def _sources_fit(src: Any) -> bool:
    """``{name: {"tokens": n, "loss_sum": x}}`` with numbers only (the source columns)."""
    if type(src) is not dict:
        return False
    for k, v in src.items():
        if type(k) is not str or type(v) is not dict or v.keys() != _SOURCE_KEYS:
            return False
        if not (_number(v["tokens"]) and _number(v["loss_sum"])):
            return False
    return True


def _strings_fit(v: Any) -> bool:
    """A list of non-empty strings without the separator (they join into one column)."""
    if type(v) is not list:
        return False
    if not v:
        return True
    try:
        joined = "".join(v)
    except TypeError:  # not all strings
        return False
    return SEP not in joined and "" not in v


def _number(v: Any) -> bool:
    t = type(v)
    return t is float or (t is int and -(2**63) < v < 2**63)


def _column(name: str, values: list[Any]) -> Any:
    code = _TYPECODE.get(name)
    if code is not None:
        try:  # None, a string or a float in an int column: TypeError
            return array(code, values)
        except (TypeError, OverflowError, ValueError):  # 2048.0 in an int column, 10**30: as a list
            pass
    return values


def _source_lists(recs: list[dict[str, Any]]) -> tuple[list[str], list[int], list[int], list[Any], list[Any]]:
    names: dict[str, int] = {}
    per, idx, tokens, loss_sum = [], [], [], []
    for rec in recs:
        src = rec.get("sources") or {}
        per.append(len(src))
        for name, v in src.items():
            idx.append(names.setdefault(name, len(names)))
            tokens.append(v["tokens"])
            loss_sum.append(v["loss_sum"])
    return list(names), per, idx, tokens, loss_sum


def _source_columns(names: list[str], per: list[int], idx: list[int], tokens: list[Any], loss_sum: list[Any]) -> tuple[Any, ...]:  # fmt: skip
    return list(names), array("q", per), array("q", idx), _column("loss", tokens), _column("loss", loss_sum)


def _pack_strings(values: Sequence[Sequence[str]]) -> tuple[Any, str]:
    return array("q", map(len, values)), SEP.join(chain.from_iterable(values))


# -- the receiving side -----------------------------------------------------------------------------
def unpack(batch: Any, *, as_dicts: bool = False) -> list[Group]:
    """The links' parts of a packed batch, records as ``Record`` (or as dicts: ``as_dicts``, or a
    column that is not clean). Raises :class:`WireError` for anything that is no such batch."""
    heads, seqs, rows, m = _frame_of(batch)
    columnar = _decode(batch, m, as_dicts)
    records = _merge(columnar, rows, sum(h[3] for h in heads))
    out: list[Group] = []
    at = 0
    for rank, link, held, count in heads:
        out.append(
            (rank, link, held, None if seqs is None else seqs[at : at + count], records[at : at + count])
        )
        at += count
    return out


@dataclass(slots=True)
class Packed:
    """A packed batch decoded as one frame: per link its rank, id, the (oldest, newest) seq it still
    holds (flat pairs, -1: not said) and how many records it has here; every record's number within
    its link (None: unnumbered); and the records in batch order."""

    ranks: list[int]
    links: list[str | None]
    held: list[int]
    counts: list[int]
    seqs: list[int] | None
    frame: StepFrame

    def held_of(self, g: int) -> tuple[int, int] | None:
        lo, hi = self.held[2 * g], self.held[2 * g + 1]
        return None if lo < 0 else (lo, hi)


def unpack_frame(batch: Any) -> Packed | None:
    """A packed batch whose every record travelled in the clean columns, as one ``StepFrame`` with no
    object per record; None for any other valid batch (``unpack`` reads those). Raises
    :class:`WireError` as ``unpack`` does."""
    ranks, links, held, counts, seqs, rows, m = _framing(batch)
    parts = _parts(batch, m)
    if rows or parts is None:
        return None
    clean, flat, samples, events, attrs = parts
    strings = {name: part for name, part in (("samples", samples), ("events", events)) if part is not None}
    if attrs is not None:
        clean["attrs"] = [a if type(a) is dict else {} for a in attrs]
    frame = StepFrame(m, clean, flat_sources=flat, strings=strings)
    return Packed(ranks, links, held, counts, seqs, frame)


def _frame_of(batch: Any) -> tuple[list[Any], list[int] | None, list[tuple[int, Any]], int]:
    """(heads, seqs, rows, m) of a packed batch, its framing checked."""
    ranks, links, held, counts, seqs, rows, m = _framing(batch)
    pairs = zip(held[0::2], held[1::2], strict=True)
    heads = [(r, link, None if lo < 0 else (lo, hi), c)
             for r, link, (lo, hi), c in zip(ranks, links, pairs, counts, strict=True)]  # fmt: skip
    return heads, seqs, rows, m


def _framing(batch: Any) -> tuple[list[int], list[Any], list[int], list[int], list[int] | None, list[tuple[int, Any]], int]:  # fmt: skip
    if type(batch) is not dict or batch.get("wire") != WIRE_VERSION:
        got = batch.get("wire") if type(batch) is dict else type(batch).__name__
        raise WireError(f"not a packed record batch of wire version {WIRE_VERSION} (got {got!r})")
    ranks, links, held, counts = _groups(batch.get("groups"))
    n = sum(counts)
    seqs = _ints(batch.get("seq"), n, "seq") if batch.get("seq") is not None else None
    rows = _rows(batch.get("rows"), n)
    m = batch.get("m")
    if type(m) is not int or m != n - len(rows):
        raise WireError(f"m: {m!r} columnar records, but the groups hold {n} and rows {len(rows)}")
    return ranks, links, held, counts, seqs, rows, m


def _groups(part: Any) -> tuple[list[int], list[Any], list[int], list[int]]:
    """(ranks, link ids, held pairs flat, counts) of the batch's links, checked."""
    if not (type(part) in (tuple, list) and len(part) == 4 and type(part[1]) is list):
        raise WireError("groups: (ranks, link ids, held, counts) expected")
    g = len(part[1])
    ranks, held, counts = (
        _ints(part[0], g, "groups.ranks"),
        _ints(part[2], 2 * g, "groups.held"),
        _ints(part[3], g, "groups.counts"),
    )
    if not set(map(type, part[1])) <= {str, type(None)}:
        raise WireError("groups.links: link ids (str or None) expected")
    if g and (min(ranks) < 0 or min(counts) < 0 or min(held) < -1):
        raise WireError("groups: a rank, count or held seq below 0")
    if sum(counts) > MAX_BATCH:
        raise WireError(f"groups: more than {MAX_BATCH} records in one batch")
    return ranks, part[1], held, counts


def _ints(col: Any, n: int, what: str) -> list[int]:
    values = _typed(col, "q", n, what)
    if values is None:
        raise WireError(f"{what}: {n} integers expected")
    return values


def _typed(col: Any, code: str, n: int, what: str) -> list[Any] | None:
    """The column's values when it is a clean ``array`` of ``code``; None when it is a plain list."""
    got = _array(col, code, n, what)
    return None if got is None else got.tolist()


def _array(col: Any, code: str, n: int, what: str) -> array[Any] | None:
    """The column itself when it is a clean ``array`` of ``code`` (a frame makes it a list when it is
    read, ``core/frame.py``); None when it is a plain list."""
    if type(col) is array and col.typecode == code:
        if len(col) != n:
            raise WireError(f"{what}: {len(col)} values for {n} records")
        return col
    if type(col) is list:
        if len(col) != n:
            raise WireError(f"{what}: {len(col)} values for {n} records")
        return None
    raise WireError(f"{what}: an array('{code}') or a list expected, got {type(col).__name__}")


def _rows(rows: Any, n: int) -> list[tuple[int, Any]]:
    if type(rows) is not list:
        raise WireError(f"rows: a list expected, got {type(rows).__name__}")
    last = -1
    for i, row in enumerate(rows):
        if not (type(row) in (tuple, list) and len(row) == 2 and type(row[0]) is int and last < row[0] < n):
            raise WireError(f"rows[{i}]: (position, record) in ascending position below {n} expected")
        last = row[0]
    return [(p, tidy(r)) for p, r in rows]


def tidy(rec: Any) -> dict[str, Any]:
    """A record dict the supervisor's bookkeeping can read whatever a sender put in it: a value of
    the wrong shape where the bookkeeping reads it (``rank``, ``events``, ``attrs``) is left out,
    as ``Record.from_dict`` leaves it out; a record that is no dict becomes an empty one (counted
    as unusable, its number consumed)."""
    if type(rec) is not dict:
        return {}
    bad = [
        k
        for k, ok in (("rank", int), ("events", list), ("attrs", dict))
        if k in rec and type(rec[k]) is not ok
    ]
    if not bad:
        return rec
    return {k: v for k, v in rec.items() if k not in bad}


def _merge(columnar: list[Any], rows: list[tuple[int, Any]], n: int) -> list[Any]:
    if not rows:
        return columnar
    out: list[Any] = []
    it = iter(columnar)
    for pos, rec in rows:
        out.extend(next(it) for _ in range(pos - len(out)))
        out.append(rec)
    out.extend(it)
    return out


Parts = tuple[dict[str, Column], Flat | None, tuple[list[int], str] | None, tuple[list[int], str] | None, list[Any] | None]  # fmt: skip
"""(clean scalar columns, sources, samples, events, attrs) of a batch's columnar records."""


def _decode(batch: dict[str, Any], m: int, as_dicts: bool) -> list[Any]:
    parts = _parts(batch, m)
    if parts is None or as_dicts:
        return _dicts(m, *_plain_parts(batch, m))
    if not m:
        return []
    clean, flat, samples, events, attrs = parts
    return _records(m, clean, source_views(flat) if flat is not None else None,
                    split_joined(*samples) if samples is not None else None,
                    split_joined(*events) if events is not None else None, attrs)  # fmt: skip


def _parts(batch: dict[str, Any], m: int) -> Parts | None:
    """The columnar records' parts, every one checked; None when a scalar column is not clean (a
    plain list: the records are rebuilt as dicts and validated one by one)."""
    cols = batch.get("cols")
    if type(cols) is not dict or not cols.keys() <= set(_SCALARS):
        raise WireError(f"cols: a dict of record fields expected, got {str(cols)[:80]}")
    if m and not {"step", "loss"} <= cols.keys():
        raise WireError("cols: every columnar record needs step and loss")
    clean: dict[str, Column] = {}
    plain = False
    for name, col in cols.items():
        values = _array(col, _TYPECODE[name], m, f"cols.{name}") if name in _TYPECODE else _strs(col, m, name)
        if values is None:
            plain = True
        else:
            clean[name] = values
    flat = _flat_sources(batch.get("sources"), m)
    samples = _joined(batch.get("samples"), m, "samples")
    events = _joined(batch.get("events"), m, "events")
    attrs = batch.get("attrs")
    if attrs is not None and not (type(attrs) is list and len(attrs) == m):
        raise WireError(f"attrs: a list of {m} expected")
    if plain:
        return None
    if m:
        steps = clean["step"]
        if not -MAX_STEP <= min(steps) <= max(steps) <= MAX_STEP:
            raise WireError(f"cols.step: a step beyond {MAX_STEP}")
    return clean, flat, samples, events, attrs


def _plain_parts(batch: dict[str, Any], m: int) -> tuple[dict[str, list[Any]], Any, Any, Any, Any]:
    """The parts as ``_dicts`` takes them (a column that is not clean as it came)."""
    cols: dict[str, list[Any]] = {}
    for name, col in batch["cols"].items():
        values = _typed(col, _TYPECODE[name], m, f"cols.{name}") if name in _TYPECODE else _strs(col, m, name)
        cols[name] = values if values is not None else col
    flat = _flat_sources(batch.get("sources"), m)
    samples = _joined(batch.get("samples"), m, "samples")
    events = _joined(batch.get("events"), m, "events")
    return (cols, source_views(flat) if flat is not None else None,
            split_joined(*samples) if samples is not None else None,
            split_joined(*events) if events is not None else None, batch.get("attrs"))  # fmt: skip


def _strs(col: Any, m: int, name: str) -> list[Any] | None:
    """A string column: None or text (an empty string is no value, as ``Record.from_dict`` reads it)."""
    if type(col) is not list or len(col) != m:
        raise WireError(f"cols.{name}: a list of {m} expected")
    if set(map(type, col)) <= {str, type(None)}:
        return [v or None for v in col]
    return None


def _flat_sources(part: Any, m: int) -> Flat | None:
    if part is None:
        return None
    if not (type(part) in (tuple, list) and len(part) == 5 and type(part[0]) is list
            and all(type(x) is str for x in part[0])):  # fmt: skip
        raise WireError("sources: (names, counts, name index, tokens, loss_sum) expected")
    names = part[0]
    per = _ints(part[1], m, "sources.counts")
    total = sum(per)
    idx = _ints(part[2], total, "sources.index")
    if min(per, default=0) < 0 or (idx and not 0 <= min(idx) <= max(idx) < len(names)):
        raise WireError("sources: a count below 0 or a name index outside the names")
    tokens = _typed(part[3], "d", total, "sources.tokens")
    loss_sum = _typed(part[4], "d", total, "sources.loss_sum")
    if tokens is None or loss_sum is None:
        raise WireError("sources: tokens and loss_sum must be float arrays")
    return names, per, idx, tokens, loss_sum


def _joined(part: Any, m: int, what: str) -> tuple[list[int], str] | None:
    """(per-record counts, joined text), checked to add up."""
    if part is None:
        return None
    if not (type(part) in (tuple, list) and len(part) == 2 and type(part[1]) is str):
        raise WireError(f"{what}: (counts, joined text) expected")
    per = _ints(part[0], m, f"{what}.counts")
    found = part[1].count(SEP) + 1 if part[1] else 0
    if min(per, default=0) < 0 or sum(per) != found:
        raise WireError(f"{what}: the counts add up to {sum(per)}, the text holds {found}")
    return per, part[1]


def _records(m: int, cols: dict[str, Column], sources: Any, samples: Any, events: Any, attrs: Any) -> list[Record]:  # fmt: skip
    """``Record`` objects straight from the columns (the field order of the dataclass)."""

    def col(name: str) -> Iterator[Any]:
        v = cols.get(name)
        if v is None:
            return repeat(None, m)
        return map(bool, v) if name in _BOOL else iter(v)

    return list(map(Record, col("step"), col("loss"), col("rank") if "rank" in cols else repeat(0, m),
                    col("world_size") if "world_size" in cols else repeat(1, m), col("time"), col("loss_sum"),
                    col("tokens"), col("batch_mean_loss"), col("lr"), col("grad_norm"), col("param_norm"),
                    col("update_norm"), col("loss_scale"), col("overflow"), col("nonfinite"), col("nonfinite_at"),
                    sources or repeat(None, m), [s or None for s in samples] if samples else repeat(None, m),
                    col("seq_len_max"),
                    col("seq_len_mean"), col("step_time"), col("tokens_per_s"), col("param_checksum"),
                    events or ([] for _ in range(m)),
                    (dict(a) if type(a) is dict else {} for a in attrs) if attrs else ({} for _ in range(m))))  # fmt: skip


def _dicts(m: int, cols: dict[str, list[Any]], sources: Any, samples: Any, events: Any, attrs: Any) -> list[dict[str, Any]]:  # fmt: skip
    """The columnar records as the dicts they were sent as (absent fields left out)."""
    out: list[dict[str, Any]] = [{} for _ in range(m)]
    for name, values in cols.items():
        for d, v in zip(out, values, strict=True):
            if v is not None:
                d[name] = bool(v) if name in _BOOL and type(v) is int else v
    for name, part in (("sources", sources), ("samples", samples), ("events", events), ("attrs", attrs)):
        if part is not None:
            for d, v in zip(out, part, strict=True):
                if v is not None and (v or name == "samples"):
                    d[name] = v.as_dict() if type(v) is SourceView else v
    return [tidy(d) for d in out]
