"""Hugging Face Trainer ``trainer_state.json``: the ``log_history`` list.

Entries with a ``loss`` are training steps (``grad_norm``, ``learning_rate`` when logged);
evaluation and summary entries (``eval_loss``, ``train_loss``) count as skipped.
"""

from __future__ import annotations

from typing import Any

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, finite_or_none, json_loads


def parse_hf_trainer(text: str) -> TraceData:
    try:
        obj: Any = json_loads(text)
    except ValueError:
        return TraceData([], sum(1 for line in text.splitlines() if line.strip()), "hf_trainer", ["not JSON"])
    history = obj.get("log_history") if isinstance(obj, dict) else obj
    if not isinstance(history, list):
        return TraceData([], 1, "hf_trainer", ["no `log_history` list"])
    records: list[Record] = []
    skipped = 0
    for entry in history:
        if not isinstance(entry, dict) or "loss" not in entry or "step" not in entry:
            skipped += 1
            continue
        try:
            rec = Record(step=int(entry["step"]), loss=float(entry["loss"]))
            gn = entry.get("grad_norm")
            rec.grad_norm = finite_or_none(float(gn)) if gn is not None else None
            if gn is not None and rec.grad_norm is None:
                rec.nonfinite, rec.nonfinite_at = True, "grad_norm"
            lr = entry.get("learning_rate")
            rec.lr = float(lr) if lr is not None else None
            if "epoch" in entry:
                rec.attrs = {"epoch": entry["epoch"]}
        except (TypeError, ValueError):
            skipped += 1
            continue
        records.append(rec)
    return TraceData(records, skipped, "hf_trainer")


def looks_like_hf_trainer(text: str) -> bool:
    head = text.lstrip()[:4096]
    return head.startswith("{") and '"log_history"' in text
