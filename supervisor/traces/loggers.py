"""Experiment-tracker exports: W&B run history (CSV or JSON) and Lightning ``CSVLogger`` files.

Both are tables of named metrics with a step column; names go to trace fields through
``FieldMap`` (``--map FIELD=NAME`` overrides).

* W&B, ``run.history()`` / ``scan_history()`` saved as CSV or JSON (a list of rows, or one JSON
  object per line, as ``wandb-history.jsonl``): a ``_step`` column, metrics by their logged names.
* W&B, a panel's "Export CSV": ``Step`` plus ``<run name> - <metric>`` columns (and ``__MIN`` /
  ``__MAX`` companions, ignored); with several runs in one file the first run is read.
* Lightning ``CSVLogger`` ``metrics.csv``: ``epoch``, ``step`` and one column per logged name;
  every ``log`` call writes its own row, so rows of one step are merged (``train_loss_step`` and
  ``lr-AdamW`` arrive on separate rows).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.traces.base import TraceData, json_loads
from supervisor.traces.metrics import STEP_NAMES, FieldMap, norm, rows_to_records, to_float

_RUN_SEP = " - "


def parse_wandb(text: str, fmap: FieldMap | None = None) -> TraceData:
    body = text.lstrip()
    if body.startswith(("[", "{")):
        return _parse_wandb_json(text, fmap or FieldMap())
    return _parse_table(text, fmap or FieldMap(), "wandb")


def parse_lightning(text: str | Iterable[str], fmap: FieldMap | None = None) -> TraceData:
    return _parse_table(text, fmap or FieldMap(), "lightning")


def _parse_wandb_json(text: str, fmap: FieldMap) -> TraceData:
    """A JSON list of rows, a pandas ``to_json()`` column map, or one JSON object per line."""
    try:
        whole: Any = json_loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, list):
        rows = [r for r in whole if isinstance(r, dict)]
        return _records(rows, fmap, "wandb", len(whole) - len(rows))
    if isinstance(whole, dict) and whole and all(isinstance(v, dict) for v in whole.values()):
        by_row: dict[str, dict[str, Any]] = {}
        for col, cells in whole.items():
            for idx, v in cells.items():
                by_row.setdefault(str(idx), {})[col] = v
        return _records(list(by_row.values()), fmap, "wandb", 0)
    rows, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json_loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            skipped += 1
    return _records(rows, fmap, "wandb", skipped)


def _parse_table(text: str | Iterable[str], fmap: FieldMap, fmt: str) -> TraceData:
    # A text, or streamed lines given back their ends (a quoted cell may span lines).
    reader = csv.DictReader(io.StringIO(text) if isinstance(text, str) else (line + "\n" for line in text))
    header = [h for h in (reader.fieldnames or []) if h]
    rename, notes = _wandb_panel_columns(header)
    rows: list[dict[str, Any]] = []
    skipped = 0
    try:
        for row in reader:
            if None in row:  # more cells than header columns
                skipped += 1
                continue
            rows.append({rename.get(k, k): v for k, v in row.items() if k})
    except csv.Error:
        skipped += 1
    data = _records(rows, fmap, fmt, skipped)
    data.notes[:0] = notes
    return data


def _wandb_panel_columns(header: list[str]) -> tuple[dict[str, str], list[str]]:
    """``<run> - metric`` columns of a panel export -> ``metric`` (first run only)."""
    runs = [h.split(_RUN_SEP, 1)[0] for h in header if _RUN_SEP in h]
    if not runs:
        return {}, []
    first = runs[0]
    rename = {h: h.split(_RUN_SEP, 1)[1] for h in header if h.startswith(first + _RUN_SEP)}
    rename = {h: m for h, m in rename.items() if not m.endswith(("__MIN", "__MAX"))}
    others = sorted(set(runs) - {first})
    notes = [f"W&B export with {len(others) + 1} runs: reading {first!r}"] if others else []
    return rename, notes


def _records(rows: list[dict[str, Any]], fmap: FieldMap, fmt: str, skipped: int) -> TraceData:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    step_col = _step_column(columns)
    if step_col is None:
        return TraceData(
            [], skipped + len(rows), fmt, [f"no step column (looked for {', '.join(STEP_NAMES)})"]
        )
    chosen, notes = fmap.resolve(c for c in columns if c != step_col)
    if "loss" not in chosen:
        return TraceData([], skipped + len(rows), fmt, [*notes, "no loss column (use --map loss=NAME)"])
    parsed: list[tuple[int, Mapping[str, float]]] = []
    for r in rows:
        step = to_float(r.get(step_col))
        if step is None or step != step or step < 0:
            skipped += 1
            continue
        vals = {col: v for col in chosen.values() if (v := to_float(r.get(col))) is not None}
        parsed.append((int(step), vals))
    records = rows_to_records(parsed, chosen)
    # Rows that carried none of the chosen metrics (e.g. validation-only rows) are not errors.
    notes.insert(0, "fields: " + ", ".join(f"{f}<-{c!r}" for f, c in chosen.items()))
    return TraceData(records, skipped, fmt, notes)


def _step_column(columns: list[str]) -> str | None:
    by_norm = {norm(c): c for c in columns}
    for name in (*STEP_NAMES, "Step"):
        if norm(name) in by_norm:
            return by_norm[norm(name)]
    return None


def looks_like_wandb(text: str) -> bool:
    head = text.lstrip()[:4096]
    if head.startswith(("[", "{")):
        return '"_step"' in head
    first = head.split("\n", 1)[0]
    cols = [c.strip().strip('"') for c in first.split(",")]
    return "_step" in cols or ("Step" in cols and any(_RUN_SEP in c for c in cols))


def looks_like_lightning(first_line: str) -> bool:
    cols = [c.strip() for c in first_line.split(",")]
    return "step" in cols and "epoch" in cols
