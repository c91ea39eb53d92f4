"""Score the engine and three baselines on the labelled corpus, side by side.

    python -m bench.detection.score [CORPUS_DIR]

Baselines (on the reported global loss per step — the mean over ranks, what a dashboard shows;
a non-finite loss counts as flagged for all of them):

* ``killspike``: loss >= 2x the mean of the previous W steps for 5 consecutive steps,
  W = max(100, 5% of the run) (KillLossSpike-style);
* ``6sigma``: loss > mean + 6 std of the previous 128 steps (needs 32 steps of history);
* ``10x_early``: loss >= 10x the maximum of the early steps (the first 10% of the run).

A harmful trace counts as detected when an incident's onset is within 2 steps of the label;
on clean and benign traces any incident is a false alarm.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Diagnosis
from supervisor.traces import read_trace

CORPUS = Path(__file__).parent / "corpus"
ONSET_TOLERANCE = 2
TARGETS = {"detected": 1.0, "false_alarms": 0, "phenotype": 0.9, "cause": 0.8}


@dataclass
class Row:
    name: str
    label: dict[str, Any]
    engine: list[Diagnosis]
    baselines: dict[str, list[int]]
    benign_shifts: int = 0
    matched: Diagnosis | None = None
    notes: list[str] = field(default_factory=list)


def loss_series(records: list[Any]) -> list[tuple[int, float]]:
    by_step: dict[int, list[float]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r.loss)
    # A replayed step (after a resume) keeps its last values, as a dashboard would.
    return [(s, sum(v) / len(v)) for s, v in by_step.items()]


def _runs(flags: list[tuple[int, bool]], merge: int = 10) -> list[int]:
    """Onsets of flagged runs; flags closer than ``merge`` steps belong to one incident."""
    onsets: list[int] = []
    last: int | None = None
    for step, flagged in flags:
        if not flagged:
            continue
        if last is None or step - last > merge:
            onsets.append(step)
        last = step
    return onsets


def killspike(series: list[tuple[int, float]]) -> list[int]:
    window = max(100, int(0.05 * len(series)))
    flags, streak = [], 0
    for i, (step, loss) in enumerate(series):
        hist = [v for _, v in series[max(0, i - window) : i] if math.isfinite(v)]
        hit = not math.isfinite(loss) or (len(hist) >= 10 and loss >= 2 * statistics.fmean(hist))
        streak = streak + 1 if hit else 0
        flags.append((series[i - 4][0] if streak >= 5 else step, streak >= 5))
    return _runs(flags)


def six_sigma(series: list[tuple[int, float]]) -> list[int]:
    flags = []
    for i, (step, loss) in enumerate(series):
        hist = [v for _, v in series[max(0, i - 128) : i] if math.isfinite(v)]
        hit = not math.isfinite(loss) or (
            len(hist) >= 32 and loss > statistics.fmean(hist) + 6 * statistics.pstdev(hist)
        )
        flags.append((step, hit))
    return _runs(flags)


def ten_x_early(series: list[tuple[int, float]]) -> list[int]:
    early = [v for _, v in series[: max(1, len(series) // 10)] if math.isfinite(v)]
    ref = max(early) if early else math.inf
    return _runs([(s, not math.isfinite(v) or v >= 10 * ref) for s, v in series])


BASELINES = {"killspike": killspike, "6sigma": six_sigma, "10x_early": ten_x_early}


def evaluate(corpus: Path = CORPUS) -> list[Row]:
    labels = json.loads((corpus / "labels.json").read_text())
    rows = []
    for name, label in labels.items():
        data = read_trace(corpus / f"{name}.jsonl.gz", "jsonl")
        result = analyze_records(data.records)
        series = loss_series(data.records)
        row = Row(name, label, result.incidents, {k: f(series) for k, f in BASELINES.items()})
        row.benign_shifts = len(result.benign_shifts)
        if label["harmful"]:
            row.matched = next(
                (d for d in result.incidents if abs(d.onset_step - label["onset"]) <= ONSET_TOLERANCE), None
            )
        rows.append(row)
    return rows


def summarize(rows: list[Row]) -> dict[str, Any]:
    harmful = [r for r in rows if r.label["harmful"]]
    quiet = [r for r in rows if not r.label["harmful"]]
    out: dict[str, Any] = {"harmful": len(harmful), "quiet": len(quiet)}
    hit = [(r, r.matched) for r in harmful if r.matched is not None]
    ranked = [(r, d) for r, d in hit if r.label["first_rank"] is not None]
    out["engine"] = {
        "detected": len(hit) / max(1, len(harmful)),
        "false_alarms": sum(len(r.engine) for r in quiet),
        "extra_incidents": sum(len(r.engine) - (r.matched is not None) for r in harmful),
        "phenotype": sum(d.phenotype.value == r.label["phenotype"] for r, d in hit) / max(1, len(harmful)),
        "cause": sum(d.top_cause is not None and d.top_cause.value == r.label["cause"] for r, d in hit)
        / max(1, len(harmful)),
        "first_rank": sum(d.first_rank == r.label["first_rank"] for r, d in ranked)
        / max(1, sum(r.label["first_rank"] is not None for r in harmful)),
    }
    for name in BASELINES:
        det = sum(
            any(abs(o - r.label["onset"]) <= ONSET_TOLERANCE for o in r.baselines[name]) for r in harmful
        )
        out[name] = {
            "detected": det / max(1, len(harmful)),
            "false_alarms": sum(len(r.baselines[name]) for r in quiet),
        }
    return out


def _fmt_engine(r: Row) -> str:
    if r.label["harmful"]:
        d = r.matched
        if d is None:
            got = ",".join(str(x.onset_step) for x in r.engine) or "-"
            return f"MISSED (onsets {got})"
        ok_p = "ok" if d.phenotype.value == r.label["phenotype"] else "WRONG"
        ok_c = "ok" if d.top_cause and d.top_cause.value == r.label["cause"] else "WRONG"
        extra = f" +{len(r.engine) - 1} extra" if len(r.engine) > 1 else ""
        cause = d.top_cause.value if d.top_cause else "?"
        return f"{d.onset_step} {d.phenotype.value}({ok_p}) {cause}({ok_c}) r{d.first_rank}{extra}"
    return f"{len(r.engine)} incidents, {r.benign_shifts} benign shifts"


def _fmt_baseline(r: Row, name: str) -> str:
    onsets = r.baselines[name]
    if not r.label["harmful"]:
        return f"{len(onsets)} alarms"
    hit = any(abs(o - r.label["onset"]) <= ONSET_TOLERANCE for o in onsets)
    return ("hit" if hit else "miss") + (f" ({len(onsets)})" if onsets else "")


def main(argv: list[str]) -> int:
    corpus = Path(argv[0]) if argv else CORPUS
    rows = evaluate(corpus)
    head = f"{'trace':26} {'label':38} {'engine':58} " + " ".join(f"{n:>11}" for n in BASELINES)
    print(head)
    print("-" * len(head))
    for r in rows:
        lab = r.label
        label = (
            f"{lab['onset']} {lab['phenotype']}/{lab['cause']} r{lab['first_rank']}"
            if lab["harmful"]
            else "quiet"
        )
        print(
            f"{r.name:26} {label:38} {_fmt_engine(r):58} "
            + " ".join(f"{_fmt_baseline(r, n):>11}" for n in BASELINES)
        )
    s = summarize(rows)
    print()
    e = s["engine"]
    print(
        f"engine:    detected {e['detected']:.0%} (onset within {ONSET_TOLERANCE}), false alarms {e['false_alarms']}, "
        f"phenotype {e['phenotype']:.0%}, top cause {e['cause']:.0%}, first rank {e['first_rank']:.0%}, "
        f"extra incidents {e['extra_incidents']}"
    )
    for name in BASELINES:
        b = s[name]
        print(f"{name + ':':10} detected {b['detected']:.0%}, false alarms {b['false_alarms']}")
    ok = (
        e["detected"] >= TARGETS["detected"]
        and e["false_alarms"] <= TARGETS["false_alarms"]
        and e["phenotype"] >= TARGETS["phenotype"]
        and e["cause"] >= TARGETS["cause"]
    )
    print(
        f"targets (all detected, 0 false alarms, phenotype >= 90%, cause >= 80%): {'MET' if ok else 'NOT MET'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
