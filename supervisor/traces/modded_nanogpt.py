"""modded-nanogpt speedrun logs.

    step:12/1750 train_loss:4.2145 train_time:2389ms step_avg:97.12ms
    step:125/1750 val_loss:4.0123 train_time:12389ms step_avg:99.11ms

The file usually starts with the training script itself (its ``print`` lines contain the same
format strings, which never parse as numbers, so they are skipped and counted). ``train_time``
is cumulative; each record's ``step_time`` is the difference to the previous logged step.
Validation losses go to ``attrs["val_loss"]`` of the step's record. Some record logs print no
train loss at all (only ``val_loss`` every N steps and timings): then the validation loss is
the trace's loss, and a note says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from supervisor.core.records import Record
from supervisor.traces.base import TraceData, lines_of, parse_float

LINE = re.compile(r"^\s*step:(\d+)/(\d+)\s+(.*)$")
_KV = re.compile(r"(\w+):(\S+)")


def parse_modded_nanogpt(text: str | Iterable[str]) -> TraceData:
    train: dict[int, Record] = {}
    val: dict[int, float] = {}
    skipped = timing_only = 0
    last_time: tuple[int, float] | None = None
    for line in lines_of(text):
        m = LINE.match(line)
        kv = dict(_KV.findall(m.group(3))) if m else {}
        t = _ms(kv.get("train_time"))
        if m is None or ("train_loss" not in kv and "val_loss" not in kv and t is None):
            skipped += bool(line.strip())
            continue
        step = int(m.group(1))
        if "val_loss" in kv:
            v = parse_float(kv["val_loss"])
            if v is None:
                skipped += 1
            else:
                val[step] = v
            continue
        step_time = None
        if t is not None:
            if last_time is not None and step > last_time[0]:
                step_time = (t - last_time[1]) / 1000.0 / (step - last_time[0])
            last_time = (step, t)
        if "train_loss" not in kv:
            timing_only += 1
            continue
        loss = parse_float(kv["train_loss"])
        if loss is None:
            skipped += 1
            continue
        train[step] = Record(step=step, loss=loss, step_time=step_time)
    if train:
        for s, v in val.items():
            if s in train:
                train[s].attrs = {"val_loss": v}
        return TraceData([train[s] for s in sorted(train)], skipped + timing_only, "modded_nanogpt")
    records = [Record(step=s, loss=v) for s, v in sorted(val.items())]
    notes = [f"no train_loss in this log: analyzing val_loss ({len(records)} points)"] if records else []
    return TraceData(records, skipped + timing_only, "modded_nanogpt", notes)


def _ms(text: str | None) -> float | None:
    if text is None or not text.endswith("ms"):
        return None
    return parse_float(text[:-2])


def looks_like_modded_nanogpt(line: str) -> bool:
    m = LINE.match(line)
    return bool(m and re.search(r"\b(train_loss|val_loss|train_time):[-+0-9.naif]", m.group(3)))
