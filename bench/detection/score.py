"""Score the engine and three baselines on the labelled corpus, side by side.

    python -m bench.detection.score [CORPUS_DIR]               # full telemetry, then loss only
    python -m bench.detection.score --write-loss-only [DIR]    # (re)write corpus/loss_only/*.csv.gz

Two views of every trace: the full per-rank telemetry, and its loss-only copy
(``corpus/loss_only/<name>.csv.gz``: ``step,loss``, the mean over ranks, as a dashboard or a
plain training log shows it). In the loss-only view a fault counts as detected when an incident's
onset is between 2 steps before the label and ``LOSS_ONLY_LAG`` steps after it (the loss shows an
LR or optimizer fault only once the weights have moved); the phenotype is scored, the cause is
not (the loss alone cannot tell them apart, and the engine says so). Labels with
``"loss_visible": false`` are faults the loss never shows (a silent replica split, lost optimizer
state): they are listed, and recall is given with and without them.

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

import gzip
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Diagnosis, Severity
from supervisor.core.records import Record
from supervisor.traces import read_trace

CORPUS = Path(__file__).parent / "corpus"
ONSET_TOLERANCE = 2
LOSS_ONLY_LAG = 20
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


def _mean_std(xs: list[float]) -> tuple[float, float]:
    """Population mean and standard deviation in floats (statistics.pstdev is exact but ~50x slower)."""
    m = math.fsum(xs) / len(xs)
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def six_sigma(series: list[tuple[int, float]]) -> list[int]:
    flags = []
    for i, (step, loss) in enumerate(series):
        hist = [v for _, v in series[max(0, i - 128) : i] if math.isfinite(v)]
        if not math.isfinite(loss):
            hit = True
        elif len(hist) >= 32:
            m, sd = _mean_std(hist)
            hit = loss > m + 6 * sd
        else:
            hit = False
        flags.append((step, hit))
    return _runs(flags)


def ten_x_early(series: list[tuple[int, float]]) -> list[int]:
    early = [v for _, v in series[: max(1, len(series) // 10)] if math.isfinite(v)]
    ref = max(early) if early else math.inf
    return _runs([(s, not math.isfinite(v) or v >= 10 * ref) for s, v in series])


BASELINES = {"killspike": killspike, "6sigma": six_sigma, "10x_early": ten_x_early}


def loss_only(records: list[Any]) -> list[Record]:
    """One record per step (in trace order, replays kept): the mean loss over ranks."""
    out: list[Record] = []
    step: int | None = None
    vals: list[float] = []
    for r in [*records, None]:
        if r is None or (step is not None and r.step != step):
            if step is not None:
                out.append(Record(step=step, loss=sum(vals) / len(vals)))
            vals = []
        if r is not None:
            step = r.step
            vals.append(r.loss)
    return out


def write_loss_only(corpus: Path = CORPUS) -> None:
    labels = json.loads((corpus / "labels.json").read_text())
    (corpus / "loss_only").mkdir(exist_ok=True)
    for name in labels:
        recs = loss_only(read_trace(corpus / f"{name}.jsonl.gz", "jsonl").records)
        text = "step,loss\n" + "".join(f"{r.step},{r.loss:.6g}\n" for r in recs)
        path = corpus / "loss_only" / f"{name}.csv.gz"
        if path.exists() and gzip.decompress(path.read_bytes()).decode() == text:
            continue  # unchanged: keep the file's bytes (and git's view of it) as they are
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))


def _matches(d: Diagnosis, onset: int, view: str) -> bool:
    lag = LOSS_ONLY_LAG if view == "loss_only" else ONSET_TOLERANCE
    return -ONSET_TOLERANCE <= d.onset_step - onset <= lag


def evaluate(corpus: Path = CORPUS, view: str = "full", names: list[str] | None = None) -> list[Row]:
    """Score every trace of ``corpus`` (or only ``names``) in one view: "full" or "loss_only"."""
    labels = json.loads((corpus / "labels.json").read_text())
    rows = []
    for name, label in labels.items():
        if names is not None and name not in names:
            continue
        if view == "full":
            records = read_trace(corpus / f"{name}.jsonl.gz", "jsonl").records
        else:
            records = read_trace(corpus / "loss_only" / f"{name}.csv.gz", "csv").records
        result = analyze_records(records)
        series = loss_series(records)
        row = Row(name, label, result.incidents, {k: f(series) for k, f in BASELINES.items()})
        row.benign_shifts = len(result.benign_shifts)
        if label["harmful"]:
            row.matched = next((d for d in result.incidents if _matches(d, label["onset"], view)), None)
        rows.append(row)
    return rows


def summarize(rows: list[Row], view: str = "full") -> dict[str, Any]:
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
    visible = [r for r in harmful if r.label.get("loss_visible", True)]
    out["engine"]["detected_visible"] = sum(r.matched is not None for r in visible) / max(1, len(visible))
    out["engine"]["medium_plus_false_alarms"] = sum(
        1 for r in quiet for d in r.engine if d.severity.rank >= Severity.MEDIUM.rank
    )
    lags = [d.onset_step - r.label["onset"] for r, d in hit]
    out["engine"]["onset_lag_mean"] = statistics.fmean(lags) if lags else 0.0
    lag = LOSS_ONLY_LAG if view == "loss_only" else ONSET_TOLERANCE
    for name in BASELINES:
        det = sum(
            any(-ONSET_TOLERANCE <= o - r.label["onset"] <= lag for o in r.baselines[name]) for r in harmful
        )
        out[name] = {
            "detected": det / max(1, len(harmful)),
            "false_alarms": sum(len(r.baselines[name]) for r in quiet),
        }
    return out


def _fmt_engine(r: Row, view: str = "full") -> str:
    if r.label["harmful"]:
        d = r.matched
        if d is None:
            got = ",".join(str(x.onset_step) for x in r.engine) or "-"
            return f"MISSED (onsets {got})"
        ok_p = "ok" if d.phenotype.value == r.label["phenotype"] else "WRONG"
        ok_c = "ok" if d.top_cause and d.top_cause.value == r.label["cause"] else "WRONG"
        if view == "loss_only":
            ok_c = "-"
        extra = f" +{len(r.engine) - 1} extra" if len(r.engine) > 1 else ""
        cause = d.top_cause.value if d.top_cause else "?"
        return f"{d.onset_step} {d.phenotype.value}({ok_p}) {cause}({ok_c}) r{d.first_rank}{extra}"
    return f"{len(r.engine)} incidents, {r.benign_shifts} benign shifts"


def _fmt_baseline(r: Row, name: str, view: str = "full") -> str:
    onsets = r.baselines[name]
    if not r.label["harmful"]:
        return f"{len(onsets)} alarms"
    lag = LOSS_ONLY_LAG if view == "loss_only" else ONSET_TOLERANCE
    hit = any(-ONSET_TOLERANCE <= o - r.label["onset"] <= lag for o in onsets)
    return ("hit" if hit else "miss") + (f" ({len(onsets)})" if onsets else "")


def _table(rows: list[Row], view: str) -> dict[str, Any]:
    head = f"{'trace':28} {'label':38} {'engine':58} " + " ".join(f"{n:>11}" for n in BASELINES)
    print(f"\n## {view}\n")
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
            f"{r.name:28} {label:38} {_fmt_engine(r, view):58} "
            + " ".join(f"{_fmt_baseline(r, n, view):>11}" for n in BASELINES)
        )
    s = summarize(rows, view)
    e = s["engine"]
    print()
    print(
        f"engine:    detected {e['detected']:.0%} ({e['detected_visible']:.0%} of the faults the loss shows), "
        f"false alarms {e['false_alarms']} ({e['medium_plus_false_alarms']} medium+), "
        f"phenotype {e['phenotype']:.0%}, top cause {e['cause']:.0%}, first rank {e['first_rank']:.0%}, "
        f"extra incidents {e['extra_incidents']}, mean onset lag {e['onset_lag_mean']:+.1f} steps"
    )
    for name in BASELINES:
        b = s[name]
        print(f"{name + ':':10} detected {b['detected']:.0%}, false alarms {b['false_alarms']}")
    return s


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write-loss-only"]:
        write_loss_only(Path(argv[1]) if len(argv) > 1 else CORPUS)
        return 0
    corpus = Path(argv[0]) if argv else CORPUS
    e = _table(evaluate(corpus, "full"), "full")["engine"]
    lo = _table(evaluate(corpus, "loss_only"), "loss_only")["engine"]
    ok = (
        e["detected"] >= TARGETS["detected"]
        and e["false_alarms"] <= TARGETS["false_alarms"]
        and e["phenotype"] >= TARGETS["phenotype"]
        and e["cause"] >= TARGETS["cause"]
    )
    print(
        f"\ntargets, full telemetry (all detected, 0 false alarms, phenotype >= 90%, cause >= 80%): {'MET' if ok else 'NOT MET'}"
    )
    lo_ok = lo["detected_visible"] >= 0.9 and lo["medium_plus_false_alarms"] == 0
    print(
        f"targets, loss only (>= 90% of what the loss shows, 0 medium+ false alarms): {'MET' if lo_ok else 'NOT MET'}"
    )
    return 0 if ok and lo_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
