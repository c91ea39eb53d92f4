"""The analyzer's short memory in its saved state: the last steps' ``Signals`` (the lookback buffer
an onset is dated in and its batch read from) as plain values.

A supervisor killed between a fault's onset and its detection restores an analyzer that dates the
onset, names the rank and reads the suspect samples as the one that never stopped, instead of
dating the fault at its own restart. What is kept of a step is bounded whatever the ranks: every
aggregate and score, the worst rank's own loss (the only per-rank loss read from an earlier step),
and what is read of the records of the ranks the step names -- its worst, non-finite,
checksum-minority, misreporting, collapsed and batch-gap ranks -- and its first (``RECORD_KEPT``),
with the count of all.

The state file carries NaN and the infinities as such (``runtime.state``); tuples come back as lists.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from supervisor.core.detect import Signals
from supervisor.core.frame import StepFrame
from supervisor.core.records import Record
from supervisor.core.summary import StepSummary

#: Fields saved as they are; the ones left out here are saved and read back by hand (tuples, sets).
_SIG_KEPT = tuple(f.name for f in fields(Signals) if f.name not in ("summary", "_own", "loss_trend"))
_SUM_KEPT = tuple(
    f.name for f in fields(StepSummary) if f.name not in ("records", "rank_log_loss", "misreported",
                                                          "collapsed_ranks", "batch_mean_gap", "sources",
                                                          "events", "n_records")
)  # fmt: skip


#: What a restored step's records are read for: their rank, whether their own loss or a module went
#: non-finite (``summary.nonfinite_origin``, ``scaler_skipped``), and their batch's sample IDs (the
#: suspects of an onset at that step).
RECORD_KEPT = (
    "step",
    "rank",
    "loss",
    "loss_sum",
    "grad_norm",
    "overflow",
    "nonfinite",
    "nonfinite_at",
    "samples",
)


def _tuples(v: Any) -> Any:
    return [tuple(x) for x in v]


def _named(s: StepSummary) -> set[int | None]:
    """The ranks a step names: whose records a restored analyzer may read."""
    gap = s.batch_mean_gap
    return {
        s.worst_rank, *s.nonfinite_ranks, *s.checksum_minority, *(m[0] for m in s.misreported),
        *(c[0] for c in s.collapsed_ranks), gap[0] if gap else None,
    }  # fmt: skip


def signals_state(sig: Signals) -> tuple[dict[str, Any], dict[str, Any]]:
    """``sig`` as the saved state holds it: (its scores, its step's summary)."""
    s = sig.summary
    out: dict[str, Any] = {name: getattr(sig, name) for name in _SIG_KEPT}
    out["loss_trend"] = sig.loss_trend
    summ: dict[str, Any] = {name: getattr(s, name) for name in _SUM_KEPT}
    summ |= {"misreported": s.misreported, "collapsed_ranks": s.collapsed_ranks,
             "batch_mean_gap": s.batch_mean_gap, "sources": s.sources}  # fmt: skip
    w = s.worst_rank
    summ["rank_log_loss"] = [[w, s.rank_log_loss[w]]] if w in s.rank_log_loss else []
    summ["events"] = sorted(s.events)
    frame = StepFrame.of(s.records)
    ranks = frame.col("rank")
    index = sorted({0, *(ranks.index(r) for r in _named(s) if r is not None and r in ranks)}) if ranks else []
    summ["records"] = [
        {f: v for f in RECORD_KEPT if (v := getattr(r, f)) is not None} for r in frame.take(index)
    ]
    summ["n_records"] = s.record_count
    return out, summ


def signals_of(state: Any) -> Signals:
    """The ``Signals`` ``signals_state`` saved (raises on a state it did not write)."""
    sig_d, summ = state
    gap, trend = summ["batch_mean_gap"], sig_d["loss_trend"]
    summary = StepSummary(
        **{name: summ[name] for name in _SUM_KEPT},
        records=StepFrame.of([Record.from_dict(r) for r in summ["records"]]),
        rank_log_loss={int(k): float(v) for k, v in summ["rank_log_loss"]},
        misreported=_tuples(summ["misreported"]),
        collapsed_ranks=_tuples(summ["collapsed_ranks"]),
        batch_mean_gap=tuple(gap) if gap else None,
        sources={k: tuple(v) for k, v in summ["sources"].items()},
        events=set(summ["events"]),
        n_records=int(summ["n_records"]),
    )
    return Signals(
        summary=summary,
        **{name: sig_d[name] for name in _SIG_KEPT},
        loss_trend=tuple(trend) if trend is not None else None,
    )
