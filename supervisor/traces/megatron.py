"""Megatron-LM / Megatron-DeepSpeed iteration lines, wherever they appear (logs, Markdown logbooks).

    [default7]: iteration 31219/ 115311 | ... | learning rate: 5.279E-05 | lm loss: 5.098124E+00 |
    loss scale: 4096.0 | grad norm: 960.351 | number of skipped iterations: 0 | ...

What the lines mean and how they are read:

* ``[defaultN]:`` and timestamp prefixes are ignored; only the last pipeline stage prints these
  lines, so every record is rank 0 of a world of 1 (the metrics are already global).
* An iteration without ``lm loss`` (a skipped step) yields no record; it is noted.
* ``OVERFLOW! ... Skipping step`` (DeepSpeed) belongs to the next iteration line: that record is
  marked ``overflow`` and its grad norm dropped, because a skipped step re-prints the previous
  step's grad norm. A grad norm equal to the previous line's to the last printed digit is
  dropped for the same reason, and ``grad norm: 0.000`` means "not computed".
* ``number of skipped iterations`` > 0 marks ``overflow``; ``number of nan iterations`` > 0
  marks ``nonfinite``.
* Logbooks paste excerpts out of order, sometimes twice: records are sorted by iteration and a
  repeated iteration keeps its last line. Gaps between excerpts stay gaps (the analyzer does not
  treat them as history).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, finite_or_none, lines_of, parse_float

ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
OVERFLOW = re.compile(r"OVERFLOW!.*Skipping step", re.IGNORECASE)
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z ()/_-]*?)\s*:\s*(\S+)\s*$")


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        m = _FIELD.match(part)
        if m:
            out[m.group(1).strip().lower()] = m.group(2)
    return out


def parse_megatron(text: str | Iterable[str]) -> TraceData:
    by_step: dict[int, Record] = {}
    notes: list[str] = []
    skipped = 0
    pending_overflow = False
    prev_grad: str | None = None
    for line in lines_of(text):
        if not line.strip():
            continue
        if OVERFLOW.search(line):
            pending_overflow = True
            continue
        m = ITERATION.search(line)
        if m is None:
            skipped += 1
            continue
        step, total, f = int(m.group(1)), int(m.group(2)), _fields(m.group(3))
        grad_text = f.get("grad norm")
        loss = parse_float(f["lm loss"]) if "lm loss" in f else None
        if loss is None:
            skipped += 1
            scale = f.get("loss scale")
            notes.append(
                f"iteration {step}: no lm loss (skipped step)" + (f"; loss scale {scale}" if scale else "")
            )
            pending_overflow = False
            prev_grad = grad_text
            continue
        grad = parse_float(grad_text) if grad_text is not None else None
        stale = grad_text is not None and grad_text == prev_grad
        overflow = pending_overflow or _int(f.get("number of skipped iterations")) > 0
        rec = Record(step=step, loss=loss)
        rec.grad_norm = None if (stale or overflow or not grad) else finite_or_none(grad)
        rec.lr = parse_float(f["learning rate"]) if "learning rate" in f else None
        rec.loss_scale = parse_float(f["loss scale"]) if "loss scale" in f else None
        rec.step_time = parse_float(f.get("elapsed time per iteration (s)", "x"))
        rec.overflow = overflow or None
        if _int(f.get("number of nan iterations")) > 0:
            rec.nonfinite, rec.nonfinite_at = True, "loss"
        rec.attrs = {"total_iterations": total}
        if stale and not overflow:
            rec.attrs["stale_grad_norm"] = grad
        by_step[step] = rec
        pending_overflow = False
        prev_grad = grad_text
    records = [by_step[s] for s in sorted(by_step)]
    return TraceData(records, skipped, "megatron", notes)


def _int(text: str | None) -> int:
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 0


def looks_like_megatron(line: str) -> bool:
    return ITERATION.search(line) is not None
