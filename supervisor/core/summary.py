"""One step across all ranks, reduced to aggregates and this step's outliers.

Linear in the number of ranks (plus two sorts of one float per rank), no history (that is
``detect.Detector``'s), and written as list comprehensions rather than one branchy loop: at 1,024
ranks per step the per-record cost bounds throughput. Metric truth is computed here: the
token-weighted loss from ``loss_sum``/``tokens``, and the ranks that disagree with it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import gt, mul, sub, truediv
from typing import cast

from supervisor.core.frame import StepFrame
from supervisor.core.records import Record
from supervisor.core.stats import median, sorted_median


@dataclass(slots=True)
class StepSummary:
    """What one step looks like across all ranks."""

    step: int
    records: Sequence[Record]  # a ``StepFrame``: a record is built when one is read
    loss: float  # reported: plain mean of the ranks' `loss` (what a dashboard shows)
    loss_true: float | None  # sum(loss_sum) / sum(tokens), the token-weighted truth
    tokens: float | None
    grad_norm: float | None
    update_ratio: float | None
    lr: float | None
    loss_scale: float | None
    overflow: bool
    nonfinite_ranks: list[int]
    nonfinite_at: str | None
    rank_log_loss: dict[int, float]
    worst_rank: int | None
    worst_dev: float  # log(loss of worst rank) - log(median of the other ranks)
    rank_spread: float | None  # median |dev| across ranks this step
    ranks_median_loss: float | None  # median loss of the ranks other than the worst
    misreported: list[tuple[int, float, float]]  # (rank, reported loss, loss_sum / tokens)
    collapsed_ranks: list[tuple[int, float, float]]  # (rank, tokens, median tokens of ranks)
    batch_mean_gap: tuple[int, float, float] | None  # (rank, batch_mean_loss, loss) with the largest gap
    sources: dict[str, tuple[float, float]]  # name -> (tokens, token-weighted loss)
    checksum_minority: list[int]  # ranks whose param_checksum disagrees with the majority
    events: set[str] = field(default_factory=set)
    n_records: int | None = None  # records of the step when ``records`` holds only some (a saved state's)

    @property
    def record_count(self) -> int:
        """How many records the step had."""
        return len(self.records) if self.n_records is None else self.n_records

    @property
    def loss_main(self) -> float:
        """The loss the detector trusts: recomputed when possible, reported otherwise."""
        return self.loss_true if self.loss_true is not None else self.loss

    @property
    def nonfinite(self) -> bool:
        return bool(self.nonfinite_ranks)

    def record_of(self, rank: int | None) -> Record | None:
        return next((r for r in self.records if r.rank == rank), None)


_ZERO = 0.0


def summarize(step: int, records: Sequence[Record]) -> StepSummary:
    """Reduce the ranks' records of ``step`` (their order does not matter): a ``StepFrame``, read
    column by column, or a list of records (read as one)."""
    f = StepFrame.of(records)
    n = len(f)
    losses = f.col("loss")
    loss_sum_total = sum(losses)
    sums = f.col("loss_sum")
    toks = f.col("tokens")
    have_truth = n > 0 and None not in sums and all(toks)
    if have_truth:
        own = [ls / t for ls, t in zip(sums, toks, strict=True)]
        tok_total = float(sum(toks))
        loss_true: float | None = sum(sums) / tok_total
    else:
        own, tok_total, loss_true = losses, 0.0, None
    ranks = f.col("rank")
    nonfinite_ranks, nonfinite_at = _nonfinite(f, loss_sum_total)
    bad = set(nonfinite_ranks)
    if not bad and all(map(_ZERO.__lt__, own)):  # every rank's loss counts (NaN fails the test)
        rank_log = dict(zip(ranks, map(math.log, own), strict=True))
    else:
        rank_log = {rk: math.log(v) for rk, v in zip(ranks, own, strict=True) if v > 0.0 and rk not in bad}
    # A step the AMP scaler skipped has no gradient measurement (the scaled gradients overflowed)
    # and no update (zero by the skip): neither is evidence of the weights' state.
    overflow = f.col("overflow")
    any_overflow = any(overflow)
    gnorms = f.col("grad_norm")
    if any_overflow:
        skipped = [scaler_skipped(r) for r in f]
        grads = [g for g, sk in zip(gnorms, skipped, strict=True) if g is not None and g > 0.0 and not sk]
    else:
        grads = [g for g in gnorms if g is not None and g > 0.0]
    upds = [
        u / (p + 1e-12)
        for u, p, o in zip(f.col("update_norm"), f.col("param_norm"), overflow, strict=True)
        if u is not None and p and not o
    ]
    worst_rank, worst_dev, spread, ranks_med = _cross_rank(rank_log)
    lrs = [x for x in f.col("lr") if x is not None]
    scales = [x for x in f.col("loss_scale") if x is not None]
    checksums = f.col("param_checksum")
    checks = Counter(c for c in checksums if c is not None)
    return StepSummary(
        step=step,
        records=f,
        loss=loss_sum_total / n if n else math.nan,
        loss_true=loss_true,
        tokens=tok_total if have_truth else None,
        grad_norm=median(grads) if grads else None,
        update_ratio=median(upds) if upds else None,
        lr=lrs[-1] if lrs else None,
        loss_scale=min(scales) if scales else None,
        overflow=any_overflow,
        nonfinite_ranks=nonfinite_ranks,
        nonfinite_at=nonfinite_at,
        rank_log_loss=rank_log,
        worst_rank=worst_rank,
        worst_dev=worst_dev,
        rank_spread=spread,
        ranks_median_loss=ranks_med,
        misreported=_misreported(ranks, losses, own) if have_truth else [],
        collapsed_ranks=_collapsed(ranks, toks) if have_truth else [],
        batch_mean_gap=_batch_mean_gap(ranks, f.col("batch_mean_loss"), own)
        if f.has("batch_mean_loss")
        else None,
        sources={k: (v[0], v[1] / v[0]) for k, v in f.source_totals().items() if v[0] > 0},
        checksum_minority=_checksum_minority(ranks, checksums, checks) if len(checks) > 1 else [],
        events=f.all_events(),
    )


def scaler_skipped(r: Record) -> bool:
    """The AMP loss scaler found inf/NaN in this rank's scaled gradients, skipped the step and lowered
    its scale -- the fp16 loop working: the loss is finite, only the (scaled) gradients overflowed,
    and no weight changed. A loss that went non-finite, or a module the probe localised, is not."""
    return bool(r.overflow) and not _loss_nonfinite(r) and not _localised(r)


def _loss_nonfinite(r: Record) -> bool:
    return not math.isfinite(r.loss) or (r.loss_sum is not None and not math.isfinite(r.loss_sum))


def _localised(r: Record) -> bool:
    """The probe localised a non-finite value in this rank's own forward or backward."""
    return bool(r.nonfinite) and r.nonfinite_at not in (None, "grad_norm", "unknown")


def _nonfinite(f: StepFrame, loss_total: float) -> tuple[list[int], str | None]:
    """Ranks with NaN/Inf in loss or grad norm, or flagged by the probe; and where it was seen first.
    Ranks whose own loss (or localised module) went non-finite come first: a grad norm is
    all-reduced, so one rank's NaN makes every rank's grad norm NaN, while its loss stays its own."""
    grads_total = sum(g for g in f.col("grad_norm") if g is not None)
    flagged = any(f.col("nonfinite"))
    if math.isfinite(loss_total) and math.isfinite(grads_total) and not flagged:
        return [], None  # the common case: one check of two sums instead of one per rank
    own: list[Record] = []
    shared: list[Record] = []
    for r in f:
        if _loss_nonfinite(r) or _localised(r):
            own.append(r)
        elif scaler_skipped(r):
            continue  # handled by the scaler (a collapsing scale is the detector's overflow rule)
        elif r.nonfinite or (r.grad_norm is not None and not math.isfinite(r.grad_norm)):
            shared.append(r)
    bad = sorted(own, key=lambda r: r.rank) + sorted(shared, key=lambda r: r.rank)
    where = None
    if bad:
        where = bad[0].nonfinite_at or ("loss" if not math.isfinite(bad[0].loss) else "grad_norm")
    return [r.rank for r in bad], where


def nonfinite_origin(s: StepSummary) -> list[int]:
    """The ranks whose own loss (or localised module) went non-finite, before any all-reduce."""
    recs = [(rank, s.record_of(rank)) for rank in s.nonfinite_ranks]
    return [rank for rank, r in recs if r is not None and (_loss_nonfinite(r) or _localised(r))]


def _misreported(ranks: list[int], losses: list[float], own: list[float]) -> list[tuple[int, float, float]]:
    """Ranks whose reported ``loss`` is not their ``loss_sum / tokens`` (a reduction bug)."""
    gaps = map(abs, map(sub, losses, own))
    bounds = map(mul, map(max, map(abs, own), repeat(1e-6)), repeat(1e-3))
    if not any(map(gt, gaps, bounds)):
        return []  # the common case, in C: no rank's loss is off its own (NaN and Inf are never off)
    return [
        (rk, x, o)
        for rk, x, o in zip(ranks, losses, own, strict=True)
        if abs(x - o) > 1e-3 * max(abs(o), 1e-6) and math.isfinite(x) and math.isfinite(o)
    ]


def _cross_rank(rank_log: dict[int, float]) -> tuple[int | None, float, float | None, float | None]:
    """(worst rank, its log excess over the other ranks' median, typical |deviation|, others' median loss)."""
    if len(rank_log) < 2:
        return None, 0.0, None, None
    vals = sorted(rank_log.values())
    m = sorted_median(vals)
    others = sorted_median(vals[:-1])  # the worst rank is the largest value
    worst = max(rank_log, key=rank_log.__getitem__)
    spread = median(list(map(abs, map(sub, vals, repeat(m)))))
    return worst, rank_log[worst] - others, spread, math.exp(others)


def _collapsed(ranks: list[int], tokens: list[int | None]) -> list[tuple[int, float, float]]:
    """Ranks whose effective tokens fell below a quarter of the ranks' median (padding, empty samples)."""
    if len(ranks) < 2:
        return []
    toks = (
        list(map(float, cast(list[int], tokens))) if None not in tokens else [float(t or 0) for t in tokens]
    )
    med = median(toks)
    if min(toks) >= 0.25 * med:
        return []  # the common case: no rank below the bound
    return [(rk, t, med) for rk, t in zip(ranks, toks, strict=True) if t < 0.25 * med]


def _batch_mean_gap(ranks: list[int], batch_means: list[float | None], own: list[float]) -> tuple[int, float, float] | None:  # fmt: skip
    """The rank whose batch-mean loss exceeds its token-weighted loss the most (short, hard samples)."""
    if ranks and None not in batch_means and all(map(_ZERO.__lt__, own)) and all(map(math.isfinite, own)):
        gaps = list(map(truediv, batch_means, own))  # every rank counts: the largest, the first of equals
        i = max(range(len(gaps)), key=gaps.__getitem__)
        return ranks[i], batch_means[i], own[i]  # type: ignore[return-value]
    best: tuple[int, float, float] | None = None
    for rk, bm, o in zip(ranks, batch_means, own, strict=True):
        if bm is None or not (o > 0.0) or not math.isfinite(o):
            continue
        if best is None or bm / o > best[1] / best[2]:
            best = (rk, bm, o)
    return best


def _checksum_minority(ranks: list[int], checksums: list[str | None], checks: Counter[str]) -> list[int]:
    majority, _ = checks.most_common(1)[0]
    return sorted(rk for rk, c in zip(ranks, checksums, strict=True) if c is not None and c != majority)
