"""nanoGPT and llm.c style training lines.

    iter 120: loss 3.2145, time 35.12ms, mfu 12.3%                (nanoGPT)
    step   12/5000 | train loss 3.2145 | norm 1.0312 | lr 6.0e-04 | ...   (llm.c, stdout)
    s:12 trl:3.2145 lr:0.000600 norm:1.03                         (llm.c main.log)

Evaluation lines (``step N: train loss X, val loss Y``, ``s:N tel:X``) are not training steps and
count as skipped, like any other line that matches none of the forms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, finite_or_none, lines_of, parse_float

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf))"
NANOGPT = re.compile(rf"\biter\s+(\d+)\s*:\s*loss\s+{_NUM}")
LLMC = re.compile(rf"\bstep\s+(\d+)\s*/\s*\d+\s*[|:]\s*(?:train\s+)?loss\s+{_NUM}")
LLMC_LOG = re.compile(rf"\bs:(\d+)\s+trl:{_NUM}")
_NORM = re.compile(rf"\bnorm[:\s]\s*{_NUM}")
_LR = re.compile(rf"\blr[:\s]\s*{_NUM}")
_TIME = re.compile(r"\btime\s+([\d.]+)\s*ms")


def parse_nanogpt(text: str | Iterable[str]) -> TraceData:
    records: list[Record] = []
    skipped = 0
    for line in lines_of(text):
        if not line.strip():
            continue
        m = NANOGPT.search(line) or LLMC.search(line) or LLMC_LOG.search(line)
        loss = parse_float(m.group(2)) if m else None
        if m is None or loss is None:
            skipped += 1
            continue
        rec = Record(step=int(m.group(1)), loss=loss)
        tail = line[m.end() :]
        if (n := _NORM.search(tail)) is not None:
            rec.grad_norm = parse_float(n.group(1))
        if (lr := _LR.search(tail)) is not None:
            rec.lr = finite_or_none(parse_float(lr.group(1)))
        if (t := _TIME.search(tail)) is not None:
            rec.step_time = (parse_float(t.group(1)) or 0.0) / 1000.0
        records.append(rec)
    return TraceData(records, skipped, "nanogpt")


def looks_like_nanogpt(line: str) -> bool:
    return bool(NANOGPT.search(line) or LLMC.search(line) or LLMC_LOG.search(line))
