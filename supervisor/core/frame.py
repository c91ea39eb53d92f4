"""One step's records as columns: what the per-step readers take, with no object per rank.

At a thousand ranks the supervisor's cost per step is its cost per record. A ``StepFrame`` holds a
step's records as one list per field (``col``), so the readers of every step (``summary.summarize``,
``runtime.observe.aggregate``, the metrics, the time ledger) run a comprehension per field instead
of building and reading an object per rank. A frame decoded from a packed batch (``sdk/wire.py``)
keeps the wire's columns as they came; the sources, sample IDs and events stay in their flat wire
form until a reader asks for them per record. ``Record`` objects are built only when something
reads a record whole (a diagnosis names a rank, an incident's series is exported), and then once.

A frame is a ``Sequence[Record]``: code that walks records walks a frame unchanged, and
``StepFrame.of(records)`` turns any list of records into one (its columns built when read).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Any, TypeAlias, overload

from supervisor.core.records import Record, SourceView, add_sources

FIELDS = ("step", "loss", "rank", "world_size", "time", "loss_sum", "tokens", "batch_mean_loss", "lr",
          "grad_norm", "param_norm", "update_norm", "loss_scale", "overflow", "nonfinite", "nonfinite_at",
          "sources", "samples", "seq_len_max", "seq_len_mean", "step_time", "tokens_per_s", "param_checksum",
          "events", "attrs")  # fmt: skip
"""``Record``'s fields in its constructor's order."""
_DEFAULTS: dict[str, Any] = {"rank": 0, "world_size": 1}
_BOOLS = frozenset(("overflow", "nonfinite"))

SEP = "\x1f"
"""Joins sample IDs and events in their flat column (the wire's separator, ``sdk/wire.py``)."""
#: A cut of at most this many records reaching at least ``SPLIT_REACH`` values into a string column
#: finds them in its text (``Joined._found``) rather than splitting everything before them.
FEW_ROWS = 4
SPLIT_REACH = 256

Flat = tuple[list[str], list[int], list[int], list[float], list[float]]
"""A step's sources as the wire sends them: (names, per-record count, name index, tokens, loss_sum)."""

Column: TypeAlias = "list[Any] | array[Any]"
"""A field's values: a list, or the wire's typed ``array`` (flags as 0/1), made a list when first read."""


class StepFrame(Sequence[Record]):
    """A step's records, field by field. ``cols`` maps a field to its values, one per record (a
    field no record has may be left out: it reads as ``None`` everywhere, or its ``Record``
    default). A column may be the wire's typed ``array``, cut as it is and made a list only when
    read: the steps of a batch that carried many each convert their own values while they are
    fresh in the cache, and a field no reader asks for is never converted. ``flat_sources`` and
    ``strings`` hold the sources and the sample IDs / events in their flat wire form (``strings``:
    field -> per-record counts and the values joined by ``SEP``), read per record only when asked."""

    __slots__ = (
        "_n",
        "_cols",
        "_records",
        "_flat",
        "_uniform",
        "_flat_ends",
        "_strings",
        "_picks",
        "_shared",
    )

    def __init__(
        self,
        n: int,
        cols: dict[str, Column] | None = None,
        *,
        flat_sources: Flat | None = None,
        strings: dict[str, tuple[list[int], str]] | None = None,
    ) -> None:
        self._n = n
        self._cols = cols if cols is not None else {}
        self._records: list[Record] | None = None
        self._flat = flat_sources
        self._uniform: bool | None = None
        """Whether every record of ``_flat`` lists the same names (``_uniform_names``), once known."""
        self._flat_ends: list[int] | None = None
        """Where each record's sources end in ``_flat``'s columns, once a cut by rows needed them."""
        self._strings = strings or {}
        self._picks: dict[str, tuple[Joined, Sequence[int]]] = {}
        """Flat string columns not cut yet: (the batch's column, this frame's rows)."""
        self._shared: dict[str, Joined] = {}
        """This frame's flat string columns as the steps cut from it share them (``_column``)."""

    @classmethod
    def of(cls, records: Sequence[Record]) -> StepFrame:
        """The frame of a list of records (a frame is returned as it is); columns built when read."""
        if type(records) is StepFrame:
            return records
        frame = cls(len(records))
        frame._records = list(records)
        return frame

    # -- columns --------------------------------------------------------------------------------
    def col(self, name: str) -> list[Any]:
        """Every record's ``name``, in record order (``None``, or the record's default, where absent)."""
        got = self._cols.get(name)
        if got is not None:
            if type(got) is array:
                got = self._cols[name] = list(map(bool, got)) if name in _BOOLS else got.tolist()
            return got  # type: ignore[return-value]
        if self._records is not None:
            got = [getattr(r, name) for r in self._records]
        elif name == "sources" and self._flat is not None:
            got = source_views(self._flat)
        elif (packed := self._joined(name)) is not None:
            got = split_joined(*packed)
            if name == "samples":
                got = [v or None for v in got]
        elif name == "events":
            got = [[] for _ in range(self._n)]
        elif name == "attrs":
            got = [{} for _ in range(self._n)]
        else:
            got = [_DEFAULTS.get(name)] * self._n
        self._cols[name] = got
        return got

    def has(self, name: str) -> bool:
        """Some record may carry ``name`` (False: none does, and reading it builds nothing)."""
        return (name in self._cols or name in self._strings or name in self._picks or self._records is not None
                or (name == "sources" and self._flat is not None))  # fmt: skip

    def _joined(self, name: str) -> tuple[Sequence[int], str] | None:
        """A flat string column: (per-record counts, values joined by ``SEP``), cut from its batch's
        column the first time it is read."""
        got = self._strings.get(name)
        if got is None and name in self._picks:
            column, index = self._picks.pop(name)
            got = self._strings[name] = column.cut(index)
        return got

    def all_events(self) -> set[str]:
        """Every event any record of the step carries."""
        packed = self._joined("events")
        if packed is not None and "events" not in self._cols:
            return set(packed[1].split(SEP)) if packed[1] else set()
        if not self.has("events"):
            return set()
        return {e for evs in self.col("events") if evs for e in evs}

    def any_events(self) -> bool:
        packed = self._joined("events")
        if packed is not None and "events" not in self._cols:
            return bool(packed[1])
        return self.has("events") and any(self.col("events"))

    def source_totals(self) -> dict[str, list[float]]:
        """{source: [tokens, loss_sum]} summed over the step's records, names in first-seen order."""
        acc: dict[str, list[float]] = {}
        flat = self._flat
        if flat is not None and "sources" not in self._cols and self._uniform_sources():
            names, per, index, tokens, loss_sum = flat
            k = per[0] if per else 0
            if k and len(tokens) == k * len(per):  # every record lists the same names: strided sums
                for j in range(k):
                    acc[names[index[j]]] = [sum(tokens[j::k]), sum(loss_sum[j::k])]
                return acc
            for i, t, s in zip(index, tokens, loss_sum, strict=True):
                a = acc.get(names[i])
                if a is None:
                    a = acc[names[i]] = [0.0, 0.0]
                a[0] += t or 0.0
                a[1] += s or 0.0
            return acc
        if self.has("sources"):
            for src in self.col("sources"):
                if src:
                    add_sources(acc, src)
        return acc

    def take(self, index: Sequence[int]) -> StepFrame:
        """A frame of the records at ``index`` (in that order); the flat parts stay flat. A ``range``
        (every k-th record: one step of a batch that carried several, link by link) is cut in slices."""
        if self._records is not None:
            return StepFrame.of([self._records[i] for i in index])
        m = len(index)
        if m and index[0] == 0 and index[-1] == m - 1 and list(index) == list(range(m)):
            return self._head(m)
        strided = isinstance(index, range) and index.step > 0
        if strided:
            cut = slice(index.start, index.stop, index.step)  # type: ignore[attr-defined]
            cols = {name: col[cut] for name, col in self._cols.items()}
        else:  # a step of a batch cut by rows: each column gathered in C
            pick = _gather(index)
            cols = {name: _picked(name, col, pick) for name, col in self._cols.items()}
        flat = None
        if self._flat is not None and "sources" not in cols:
            if strided and self._uniform_sources():
                flat = _take_uniform(self._flat, index)  # type: ignore[arg-type]
            else:
                if self._flat_ends is None:
                    self._flat_ends = list(accumulate(self._flat[1]))
                flat = _take_rows(self._flat, self._flat_ends, index)
        # The string columns are cut when read (sample IDs are read for incidents only), from one split
        # of this frame's text that every step cut from it shares.
        strings: dict[str, tuple[list[int], str]] = {}
        picks: dict[str, tuple[Joined, Sequence[int]]] = {}
        for name, (per, text) in self._strings.items():
            if name in cols:
                continue
            if not text:
                strings[name] = ([0] * m, "")
            else:
                picks[name] = (self._column(name, per, text), index)
        for name, (column, rows) in self._picks.items():
            if name not in cols:
                picks[name] = (column, rows[cut] if strided else [rows[i] for i in index])
        out = StepFrame(m, cols, flat_sources=flat, strings=strings)
        out._picks = picks
        return out

    def _head(self, m: int) -> StepFrame:
        """The first ``m`` records (slices, and the flat parts cut at their ``m``-th record)."""
        cols = {name: col[:m] for name, col in self._cols.items()}
        flat = None
        if self._flat is not None and "sources" not in cols:
            names, per, idx, tokens, loss_sum = self._flat
            k = sum(per[:m])
            flat = (names, per[:m], idx[:k], tokens[:k], loss_sum[:k])
        strings: dict[str, tuple[list[int], str]] = {}
        for name, (per, text) in self._strings.items():
            if name not in cols:
                k = sum(per[:m])
                strings[name] = (per[:m], SEP.join(text.split(SEP, k)[:k]) if k else "")
        for name, (column, rows) in self._picks.items():
            if name not in cols:  # cut now: a head is kept (the incident series' ring), its batch is not
                strings[name] = column.cut(rows[:m])
        return StepFrame(m, cols, flat_sources=flat, strings=strings)

    def kept(self) -> StepFrame:
        """This frame, its columns still to be cut from its batch (when read) cut now: a frame kept
        after its batch is gone (the incident series' ring) holds nothing of the batch."""
        for name in list(self._picks):
            self._joined(name)
        return self

    def _uniform_sources(self) -> bool:
        """``_uniform_names`` of the flat sources, read once (a batch's steps are each cut from it)."""
        if self._uniform is None:
            assert self._flat is not None
            self._uniform = _uniform_names(self._flat[1], self._flat[2])
        return self._uniform

    def _column(self, name: str, per: list[int], text: str) -> Joined:
        """The flat string column ``name`` as one ``Joined`` that every cut of this frame shares (each
        step of a batch is one), so its text is split once, however many steps read it."""
        got = self._shared.get(name)
        if got is None:
            got = self._shared[name] = Joined(per, text)
        return got

    # -- the records ----------------------------------------------------------------------------
    def records(self) -> list[Record]:
        """The ``Record`` of every row, built once."""
        if self._records is None:
            parts: list[Any] = []
            for name in FIELDS:
                if not self.has(name):
                    parts.append(_absent(name, self._n))
                elif name in _BOOLS:  # the wire sends flags as 0/1
                    parts.append([None if v is None else bool(v) for v in self.col(name)])
                else:
                    parts.append(self.col(name))
            self._records = list(map(Record, *parts))
        return self._records

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        return self.records()[i]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __bool__(self) -> bool:
        return self._n > 0

    def __repr__(self) -> str:
        return f"StepFrame({self._n} records)"


def _absent(name: str, n: int) -> Any:
    if name == "events":
        return ([] for _ in range(n))
    if name == "attrs":
        return ({} for _ in range(n))
    return repeat(_DEFAULTS.get(name), n)


def split_joined(per: Sequence[int], joined: str) -> list[list[str]]:
    """Per-record lists from a flat column joined by ``SEP`` and the per-record counts."""
    flat = joined.split(SEP) if joined else []
    ends = list(accumulate(per))
    return [flat[e - k : e] for k, e in zip(per, ends, strict=True)]


def source_views(flat: Flat) -> list[Any]:
    """Per-record source mappings over a flat column (``SourceView``; a dict where a record names a
    source twice, whose last value counts, as in the dict it was sent as)."""
    names, per, index, tokens, loss_sum = flat
    ends = list(accumulate(per))
    views: list[Any] = [SourceView(names, index, tokens, loss_sum, e - k, e) if k else None for k, e in zip(per, ends, strict=True)]  # fmt: skip
    if not _uniform_names(per, index):
        views = [v if v is None or len(set(v)) == len(v) else v.as_dict() for v in views]
    return views


def _uniform_names(per: list[int], index: Sequence[int]) -> bool:
    """True when every record lists the same distinct names in the same order (so none names a source
    twice, and a name's values are every k-th); False decides nothing (each record is then read)."""
    k = per[0] if per else 0
    return per.count(k) == len(per) and list(index) == list(index[:k]) * len(per) and len(set(index[:k])) == k


def _take_uniform(flat: Flat, index: range) -> Flat:
    """The sources of the records at ``index`` (step > 0) where every record lists the same names:
    cut in slices."""
    names, per, idx, tokens, loss_sum = flat
    k = per[0] if per else 0
    if not k:
        return names, [0] * len(index), [], [], []
    return (names, [k] * len(index), list(idx[:k]) * len(index), _pick_uniform(tokens, k, index),
            _pick_uniform(loss_sum, k, index))  # fmt: skip


def _gather(index: Sequence[int]) -> Any:
    """A function that takes a column to the list of its values at ``index`` (``itemgetter``, which
    takes at least one index and returns a lone one's value itself)."""
    if len(index) < 2:
        return lambda col: [col[i] for i in index]
    get = itemgetter(*index)
    return lambda col: list(get(col))


def _picked(name: str, col: Column, pick: Any) -> list[Any]:
    """``pick`` (``_gather``) of a column: a list, flags as bools whatever form the column had."""
    values: list[Any] = pick(col)
    return list(map(bool, values)) if type(col) is array and name in _BOOLS else values


def _take_rows(flat: Flat, ends: list[int], index: Sequence[int]) -> Flat:
    """The sources of the records at ``index`` (``ends``: where each record's sources end)."""
    names, per, idx, tokens, loss_sum = flat
    spans = [(ends[i] - per[i], ends[i]) for i in index]
    return (names, [per[i] for i in index], [x for a, b in spans for x in idx[a:b]],
            [x for a, b in spans for x in tokens[a:b]], [x for a, b in spans for x in loss_sum[a:b]])  # fmt: skip


class Joined:
    """A flat string column (per-record counts, values joined by ``SEP``) whose cuts split its text
    only as far as the furthest record any of them reaches, and once: the steps of a batch are each
    cut from it, and without the shared split each would split the batch up to its own rows again."""

    __slots__ = ("per", "text", "_values", "_k", "_ends")

    def __init__(self, per: Sequence[int], text: str) -> None:
        self.per, self.text = per, text
        self._values: list[str] = []
        self._k: int | None = None
        """Every record's count when all are the same (-1: they differ), once known."""
        self._ends: list[int] | None = None

    def cut(self, index: Sequence[int]) -> tuple[list[int], str]:
        """The records at ``index`` (counts, values joined by ``SEP``)."""
        if not len(index):
            return [], ""
        per = self.per
        if self._k is None:
            k = per[0]
            self._k = k if per.count(k) == len(per) else -1
        strided = isinstance(index, range) and index.step > 0
        last = index[-1] if strided else max(index)
        if len(index) <= FEW_ROWS and not strided:
            found = self._found(index, last, self._k)
            if found is not None:
                return found
        if self._k >= 0:
            values = self._split((last + 1) * self._k)
            if strided:
                return [self._k] * len(index), SEP.join(_pick_uniform(values, self._k, index))  # type: ignore[arg-type]
            chosen = [values[i * self._k : (i + 1) * self._k] for i in index]
        else:
            if self._ends is None:
                self._ends = list(accumulate(per))
            ends = self._ends
            values = self._split(ends[last])
            chosen = [values[ends[i] - per[i] : ends[i]] for i in index]
        return [len(v) for v in chosen], SEP.join(chain.from_iterable(chosen))

    def _found(self, index: Sequence[int], last: int, k: int) -> tuple[list[int], str] | None:
        """A few records' values (``k`` each; -1: counts differ) found in the text where it was not
        split that far, without splitting what comes before them (None: split, it is as cheap):
        the sample IDs of a step's named ranks, far into a batch of a thousand."""
        per = self.per
        if k < 0 and self._ends is None:
            self._ends = list(accumulate(per))
        ends = self._ends or []
        reach = (last + 1) * k if k >= 0 else ends[last]
        if reach <= len(self._values) or reach < SPLIT_REACH:
            return None
        total = len(per) * k if k >= 0 else ends[-1]
        chosen: list[list[str]] = []
        for i in index:
            first = i * k if k >= 0 else ends[i] - per[i]
            chosen.append(self._values_at(self._offset(first, total), per[i]) if per[i] else [])
        return [len(v) for v in chosen], SEP.join(chain.from_iterable(chosen))

    def _offset(self, n: int, total: int) -> int:
        """Where value ``n`` (of ``total``) begins: after the text's ``n``-th separator, looked for
        where an even spread of the values puts it, then one separator at a time."""
        text = self.text
        if n == 0:
            return 0
        pos = len(text) * n // total
        # Separators before ``pos``, counted over the shorter side (the text holds ``total - 1``).
        seen = text.count(SEP, 0, pos) if 2 * pos <= len(text) else total - 1 - text.count(SEP, pos)
        if seen < n:
            for _ in range(n - seen):
                pos = text.index(SEP, pos) + 1
            return pos
        for _ in range(seen - n + 1):
            pos = text.rindex(SEP, 0, pos)
        return pos + 1

    def _values_at(self, start: int, count: int) -> list[str]:
        """``count`` values from character ``start`` on."""
        text, out = self.text, []
        for _ in range(count):
            end = text.find(SEP, start)
            end = len(text) if end < 0 else end
            out.append(text[start:end])
            start = end + 1
        return out

    def _split(self, upto: int) -> list[str]:
        """The first ``upto`` values (the rest stays joined); a longer reach splits at least twice as
        far as the last, so a run of growing reaches splits each value a bounded number of times."""
        if len(self._values) < upto:
            want = max(upto, 2 * len(self._values))
            self._values = self.text.split(SEP, want)[:want]
        return self._values


def _pick_uniform(flat: Sequence[Any], k: int, index: range) -> list[Any]:
    """The values of the records at ``index`` (a range, step > 0) in a flat column where every
    record has ``k`` of them, in slices."""
    out: list[Any] = [None] * (len(index) * k)
    if out:
        stop = (index[-1] + 1) * k
        for q in range(k):
            out[q::k] = flat[index.start * k + q : stop : index.step * k]
    return out
