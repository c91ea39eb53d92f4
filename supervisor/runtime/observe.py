"""Per-step aggregates of every rank's records, a baseline before an onset, and the verdict on an
observation window against it under the policy's pass criteria (pure functions)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from supervisor.core.frame import StepFrame
from supervisor.core.records import Record
from supervisor.core.summary import scaler_skipped


@dataclass(frozen=True, slots=True)
class StepStats:
    step: int
    loss: float
    grad_norm: float | None = None
    update_ratio: float | None = None
    tokens_per_s: float | None = None
    lr: float | None = None
    nonfinite: bool = False
    ranks: int = 1
    #: The AMP loss scaler skipped this step on a rank (``core.summary.scaler_skipped``): its scaled
    #: gradients overflowed, the loss stayed finite and no weight changed -- the fp16 loop working.
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        # Every field is a scalar: no deep copy (``asdict``'s took 24 ms per state write at 1000 steps).
        return {name: getattr(self, name) for name in _STEP_FIELDS}


_STEP_FIELDS = tuple(f.name for f in fields(StepStats))


def aggregate(step: int, records: Sequence[Record]) -> StepStats:
    """Token-weighted global loss (when ranks report loss_sum and tokens), mean of the rest."""
    f = StepFrame.of(records)
    sums, toks = f.col("loss_sum"), f.col("tokens")
    weighted = None not in sums and all(toks)  # every rank says its tokens and loss sum
    loss = sum(sums) / max(1, sum(toks)) if weighted else sum(f.col("loss")) / len(f)
    upd, par = f.col("update_norm"), f.col("param_norm")
    ratios = [None if u is None or p is None else u / (p + 1e-12) for u, p in zip(upd, par, strict=True)]
    overflow = any(f.col("overflow"))
    return StepStats(
        step=step,
        loss=float(loss),
        grad_norm=_mean(f.col("grad_norm")),
        update_ratio=_mean(ratios),
        tokens_per_s=_sum(f.col("tokens_per_s")),
        lr=_mean(f.col("lr")),
        # The AMP scaler's skip is read per record, and only on a step where a rank overflowed.
        nonfinite=any(r.is_nonfinite and not scaler_skipped(r) for r in f) if overflow else _nonfinite(f),
        ranks=len(f),
        skipped=overflow and any(scaler_skipped(r) for r in f),
    )


def _nonfinite(f: StepFrame) -> bool:
    """Some record's probe flagged NaN/Inf, or its loss or grad norm is not finite."""
    finite = math.isfinite
    return (any(f.col("nonfinite")) or not all(map(finite, f.col("loss")))
            or not all(map(finite, [g for g in f.col("grad_norm") if g is not None])))  # fmt: skip


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _sum(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


@dataclass(frozen=True, slots=True)
class Baseline:
    steps: int
    loss_median: float
    loss_mad: float
    grad_norm: float | None
    update_ratio: float | None
    tokens_per_s: float | None
    #: The LR the ranks reported and the update ratio per unit of it (None in a baseline stored
    #: before they were kept, or when the ranks report no LR).
    lr: float | None = None
    update_per_lr: float | None = None
    #: How many ranks its steps were analysed with (the median; None in a baseline stored before).
    ranks: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Baseline:
        return cls(**d)


def baseline(history: list[StepStats]) -> Baseline | None:
    finite = [h for h in history if not h.nonfinite and not h.skipped and math.isfinite(h.loss)]
    if len(finite) < 5:
        return None
    losses = [h.loss for h in finite]
    med = statistics.median(losses)
    mad = statistics.median(abs(x - med) for x in losses)
    return Baseline(
        steps=len(finite),
        loss_median=med,
        loss_mad=max(mad, 1e-6 * max(1.0, abs(med))),
        grad_norm=_median([h.grad_norm for h in finite]),
        update_ratio=_median([h.update_ratio for h in finite]),
        tokens_per_s=capacity([h.tokens_per_s for h in finite]),
        lr=_median([h.lr for h in finite]),
        update_per_lr=_median([_per_lr(h) for h in finite]),
        ranks=_median([float(h.ranks) for h in finite]),
    )


def _per_lr(h: StepStats) -> float | None:
    return h.update_ratio / h.lr if h.update_ratio is not None and h.lr else None


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(vals) if vals else None


CAPACITY_QUANTILE = 0.9


def capacity(xs: list[float | None]) -> float | None:
    """Sustained throughput: the 90th percentile of per-step tokens/s, not the median. Step-time
    noise is one-sided (a busy neighbour, a GC pause, an I/O stall only slow a step down): the
    median falls with the share of disturbed steps, the fast end stays at the job's own speed until
    nearly every step is slowed, as a real regression (precision, a starving loader) does."""
    vals = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not vals:
        return None
    return vals[round(CAPACITY_QUANTILE * (len(vals) - 1))]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    value: float | None
    limit: float | None
    detail: str


def evaluate(
    base: Baseline, window: list[StepStats], criteria: dict[str, Any], *, from_start: bool = False
) -> list[Check]:
    """Each pass criterion of an ``observe`` action, on the window against the baseline: loss
    *below* median + N x 1.4826 MAD (lower is fine: training goes on improving); grad norm and
    update ratio medians under N x baseline (``_update``: per unit of LR under a higher LR);
    ``capacity`` over N x baseline unless ``throughput`` is false. A metric nobody reports passes.
    ``from_start``: the window re-trains the model from its initialization (a rollback to the run's
    start), whose grad norm moves with training, not its health: not bounded, as after a warm-up
    baseline."""
    w_loss = statistics.median(h.loss for h in window)
    limit = base.loss_median + criteria.get("loss_within_mads", 3.0) * 1.4826 * base.loss_mad
    loss = Check("loss", w_loss <= limit, w_loss, limit, f"window median {w_loss:.4g} vs limit {limit:.4g}")
    grad = _median([h.grad_norm for h in window])
    if from_start:
        grad_check = Check("grad_norm", True, grad, None, "not judged (the window re-trains the model from "
                           "its initialization, whose grad norm moves with training, not its health)")  # fmt: skip
    elif warm := _warm_up_baseline(base, window):
        grad_check = Check("grad_norm", True, grad, None, f"not judged ({warm})")
    else:
        widen, why = _fewer_ranks(base, window)
        grad_check = _ratio(
            "grad_norm", base.grad_norm, grad, criteria, "grad_norm_ratio_max", True, widen, why
        )
    speed = capacity([h.tokens_per_s for h in window])
    if criteria.get("throughput") is False:
        speed_check = Check("throughput", True, speed, None, "not judged (the policy turned it off)")
    else:
        speed_check = _ratio("throughput", base.tokens_per_s, speed, criteria, "throughput_min_ratio", False)
    return [_finite(window), loss, grad_check, _update(base, window, criteria), speed_check]


def _fewer_ranks(base: Baseline, window: list[StepStats]) -> tuple[float, str]:
    """How far the grad norm's bound widens when the window ran on fewer ranks than the baseline (a
    group restarted on the ranks left, ``resources.min_workers``), and why. Each rank's batch is the
    same, so the mean gradient is over fewer samples: its noise part grows by sqrt(before / now), the
    most a smaller batch can add to the grad norm. More ranks only lower it: the bound stays."""
    now = _median([float(h.ranks) for h in window])
    if base.ranks is None or now is None or now <= 0 or now >= base.ranks:
        return 1.0, ""
    return math.sqrt(base.ranks / now), (
        f"; the window ran on {now:g} of the baseline's {base.ranks:g} ranks: a gradient averaged over "
        f"the smaller batch is noisier, by up to sqrt({base.ranks:g}/{now:g})"
    )


def _warm_up_baseline(base: Baseline, window: list[StepStats]) -> str:
    """Why the grad norm has no bound in the baseline ("" when it has): the window runs a higher LR
    than the baseline's steps, taken in a warm-up. Just out of its initialization a model's grad norm
    moves with training, not its health (a byte-level LM starts near a uniform output, small
    gradients; under Lion, ``lr * sign(.)``, weight and grad norms grow with every step at the peak
    LR). The loss, the update per unit of LR and the detector's checks still judge the window."""
    lr = _median([h.lr for h in window])
    if base.lr is None or lr is None or lr <= base.lr:
        return ""
    return f"the baseline's steps ran at {base.lr / lr:.3g}x the window's LR, in a warm-up: no bound on its grad norm"


def _update(base: Baseline, window: list[StepStats], criteria: dict[str, Any]) -> Check:
    """The update-ratio check. Every optimizer's update follows the LR (Lion ``lr * sign(.)``, SGD
    ``lr * buf``, Adam about ``lr * m / sqrt(v)``): under a higher LR than the baseline's (taken in a
    warm-up) it is compared per unit of LR, where a broken optimizer state still fails. Under an LR
    no higher (the supervisor's ``lr_scale`` or re-warm, a decay) it is compared as it is: Adam's
    update per unit of LR grows when steps are small, the weights' step does not. Whether the LR
    itself is right is the detector's (an LR fault back in the window fails the recurrence check)."""
    raw = _ratio("update_ratio", base.update_ratio, _median([h.update_ratio for h in window]),
                 criteria, "update_ratio_max", True)  # fmt: skip
    lr = _median([h.lr for h in window])
    if base.lr is None or base.update_per_lr is None or lr is None or lr <= base.lr or raw.passed:
        return raw
    per = _ratio("update_ratio", base.update_per_lr, _median([_per_lr(h) for h in window]),
                 criteria, "update_ratio_max", True)  # fmt: skip
    if per.limit is None or raw.value is None:
        return raw
    why = f"{per.detail} per unit of LR (the window's LR {lr / base.lr:.3g}x the baseline's; {raw.value:.3g}x as it is)"
    return Check("update_ratio", per.passed, per.value, per.limit, why)


def evaluate_young(window: list[StepStats], history_steps: int) -> list[Check]:
    """The criteria for a window with fewer than 5 finite steps before the onset (a fault in a run's
    first steps): values finite, and the loss not rising (its second half's median at most its
    first half's: a young run that learns falls steeply); the ratios are listed as not judged."""
    checks = [_finite(window)]
    losses = [h.loss for h in window if math.isfinite(h.loss)]
    half = len(losses) // 2
    if half >= 2:
        first, second = statistics.median(losses[:half]), statistics.median(losses[half:])
        checks.append(
            Check("loss", second <= first, second, first,
                  f"second-half median {second:.4g} vs first-half {first:.4g} (no baseline before the onset)")
        )  # fmt: skip
    why = f"not judged ({history_steps} step(s) before the onset: no baseline)"
    checks += [Check(name, True, None, None, why) for name in ("grad_norm", "update_ratio", "throughput")]
    return checks


#: The largest share of a window's steps the AMP loss scaler may skip: a scaler that skips more is
#: not training (fp16's scaler skips a step when it raises its scale, one in its growth interval).
SKIPPED_SHARE_MAX = 0.25


def _finite(window: list[StepStats]) -> Check:
    """Every step finite; one the AMP loss scaler skipped counts as finite (the fp16 loop working)
    unless it skipped more than ``SKIPPED_SHARE_MAX`` of the window."""
    bad = [h.step for h in window if h.nonfinite or not math.isfinite(h.loss)]
    if bad:
        return Check("finite", False, float(len(bad)), 0.0, f"non-finite at steps {bad[:5]}")
    skipped = [h.step for h in window if h.skipped]
    if window and len(skipped) > SKIPPED_SHARE_MAX * len(window):
        detail = (
            f"the AMP loss scaler skipped {len(skipped)} of {len(window)} steps "
            f"(more than {SKIPPED_SHARE_MAX:.0%}: not training), from step {skipped[0]}"
        )
        return Check("finite", False, float(len(skipped)), 0.0, detail)
    detail = "all finite"
    if skipped:
        detail += (
            f" ({len(skipped)} step(s) the AMP loss scaler skipped, the fp16 loop working: {skipped[:5]})"
        )
    return Check("finite", True, 0.0, 0.0, detail)


def _ratio(
    name: str,
    base: float | None,
    value: float | None,
    criteria: dict[str, Any],
    key: str,
    upper: bool,
    widen: float = 1.0,
    why: str = "",
) -> Check:
    """``value`` against ``base`` times the criterion's bound (``widen`` times it, for ``why``)."""
    if base is None or value is None or base <= 0:
        return Check(name, True, value, None, "not reported")
    ratio = value / base
    bound = float(criteria.get(key, 2.0 if upper else 0.8)) * widen
    ok = ratio <= bound if upper else ratio >= bound
    sign = "<=" if upper else ">="
    return Check(name, ok, ratio, bound, f"{ratio:.3g}x baseline (must be {sign} {bound:.3g}x{why})")
