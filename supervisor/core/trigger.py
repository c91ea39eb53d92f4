"""When to open an incident, and where it really began.

``decide`` returns the ``Trigger`` (the rule that fired) for one step with no incident open, or
None; ``locate_first`` walks back for the first abnormal quantity (earliest step, rank and metric
out of band), often a grad norm or update ratio a few steps before the loss peak. The rules, in
order, with their rationale: docs/detection.md, "When an incident opens". A source that does not
learn (``learning.SourceLearning``) is asked by the analyzer when no rule here fired.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from supervisor.core.detect import DetectorSettings, Signals, rank_rose
from supervisor.core.model import FirstAnomaly
from supervisor.core.stats import median


@dataclass(frozen=True, slots=True)
class Trigger:
    rule: str  # nonfinite | checksum | loss | loss_only | trend | metric | rank | resume | grad | source
    immediate: bool  # ready to act on at once (facts, not shapes)
    source: str | None = None  # rule "source": the source that left its band


def _ge(x: float | None, t: float) -> bool:
    return x is not None and not math.isnan(x) and x >= t


def decide(sig: Signals, recent: Sequence[Signals], st: DetectorSettings) -> Trigger | None:
    s = sig.summary
    if s.nonfinite:
        return Trigger("nonfinite", True)
    if s.checksum_minority:
        return Trigger("checksum", True)
    if incomplete_resume(s.events):
        return Trigger("resume", True)  # seen where the state was loaded: no optimizer dynamics needed
    if _rank_out(sig, st):
        return Trigger("rank", False)
    young = young_source_jump(sig, recent)
    if young is not None:
        return Trigger("source", False, young.name)
    if not sig.ready:
        return None
    co = _co_moving(sig, recent)
    loss_hi = sig.loss_z >= st.z_threshold and sig.jump >= st.min_loss_jump
    if loss_hi and co is not None and co >= st.grad_z_threshold:
        return Trigger("loss", False)
    if loss_hi and co is None and sig.loss_unprecedented:  # no grad metrics logged: demand more of the loss
        return Trigger("loss", False)
    metric_evidence = bool(s.collapsed_ranks) or (bool(s.misreported) and not misreport_before(sig, recent))
    if loss_hi and metric_evidence:
        return Trigger("metric", True)
    if loss_hi and sig.jump >= st.loss_only_jump and sig.loss_unprecedented:
        return Trigger("loss_only", False)
    bad_source = source_off(sig, recent, st)
    if bad_source is not None:
        return Trigger("source", False, bad_source)
    if _rising(sig, st) and (co is None or co >= st.band_z):
        return Trigger("trend", False)
    reported_jump = s.loss_true is not None and s.loss > s.loss_true * (1 + st.min_loss_jump)
    if sig.reported_z >= st.z_threshold and reported_jump and not loss_hi:
        return Trigger("metric", True)
    if _rank_far(sig, st):
        # One micro-batch far out once is heavy-tailed noise, unless this step's gradients moved
        # with it (the update before moved every rank alike) or the same rank is out twice in a row.
        if sig.rank_unprecedented and _ge(sig.co_z, st.band_z):
            return Trigger("rank", False)
        prev = list(recent)[-2] if len(recent) >= 2 else None
        same = prev is not None and prev.summary.worst_rank == s.worst_rank and _contiguous([prev, sig])
        if prev is not None and same and _rank_far(prev, st) and prev.rank_unprecedented:
            return Trigger("rank", False)
    if (s.events & RESUME_EVENTS or _recent_resume(recent, st)) and _ge(sig.update_z, st.grad_z_threshold):
        return Trigger("resume", False)
    if co is not None and co >= st.grad_z_threshold and len(recent) >= 3:
        last3 = list(recent)[-3:]
        if all(_ge(r.co_z, st.grad_z_threshold) for r in last3) and _contiguous(last3):
            return Trigger("grad", False)
    return None


RESUME_EVENTS = frozenset({"resumed", "restored"})
#: Event prefix of a restore that left a state component behind (``resume_incomplete:optimizer``,
#: ``...:scheduler``, ``...:loader``; ``checkpoint.training_state.resume_check``).
RESUME_INCOMPLETE = "resume_incomplete"


def incomplete_resume(events: set[str] | frozenset[str]) -> list[str]:
    """The state components a restore says it did not bring back (empty: none, or no restore)."""
    found = (e for e in events if e == RESUME_INCOMPLETE or e.startswith(RESUME_INCOMPLETE + ":"))
    return sorted(e.partition(":")[2] or "state" for e in found)


def _co_moving(sig: Signals, recent: Sequence[Signals]) -> float | None:
    """The gradient-side z that confirms this step's loss: this step's grad norm / update ratio, or
    the update of the step before (the loss of step s is computed on the weights update s - 1 made,
    by when the gradients have often calmed again)."""
    co = sig.co_z
    prev = list(recent)[-2] if len(recent) >= 2 and recent[-1] is sig else None
    if prev is None or not _contiguous([prev, sig]) or prev.update_z is None or math.isnan(prev.update_z):
        return co
    return prev.update_z if co is None else max(co, prev.update_z)


def _rising(sig: Signals, st: DetectorSettings) -> bool:
    """The loss level rose over each of the last two level windows beyond the noise of a difference
    of medians, by >= 2x ``min_loss_jump`` in all: a divergence too slow for any step to stand out.
    A step change (a harder data mix) rises over one window only; one heavy step barely moves a median."""
    if sig.loss_trend is None or not sig.loss_excess > 0:
        return False
    d1, d2, se = sig.loss_trend
    return min(d1, d2) >= st.band_z * se and d1 + d2 >= math.log1p(2 * st.min_loss_jump)


def _rank_far(sig: Signals, st: DetectorSettings) -> bool:
    s = sig.summary
    return (
        _ge(sig.rank_z, st.rank_z_threshold)
        and _ge(sig.rank_tail_z, st.z_threshold)
        and s.worst_dev >= math.log1p(st.min_loss_jump)
        and rank_rose(sig, st)
    )


#: The worst rank's loss at least this many times the other ranks' median (healthy 2-rank runs of
#: mixed 8-sample batches split 1.3-1.45x now and then; a garbage batch on one is 1.8-2.2x).
SPLIT_MIN = math.log(1.5)


def _rank_out(sig: Signals, st: DetectorSettings) -> bool:
    """One rank beyond every split seen so far (``_rank_far``, after ``min_history`` steps of splits),
    with evidence in time too, so no co-moving gradient is needed: the **rank split** (the step's loss
    out of its band, lifted ``min_loss_jump`` above the other ranks' median by it), or the rank alone
    ``z_threshold`` out of its own band and ``min_loss_jump`` above its own level, which keeps its
    sensitivity with the number of ranks (one rank lifts the mean by about (ratio - 1) / N)."""
    s = sig.summary
    if sig.rank_history < st.min_history or s.worst_dev < SPLIT_MIN or not sig.rank_unprecedented:
        return False
    if not _rank_far(sig, st):
        return False
    others = s.ranks_median_loss or 0.0
    if sig.loss_z >= st.band_z and others > 0.0 and s.loss_main >= others * (1.0 + st.min_loss_jump):
        return True  # the split
    own = sig.rank_own(st.level_window, st.loss_floor)
    return own is not None and own[1] >= st.z_threshold and own[0] >= math.log1p(st.min_loss_jump)


#: A logged loss this far from its ``loss_sum / tokens``, either way, is no rounding, auxiliary term
#: or per-sample mean: a sum over ranks not divided (2x at 2 ranks), a mean over padding.
MISREPORT_MIN = math.log(1.5)
#: ``standing_misreport``: steps in a row (this step's included) the logged loss is that far off.
MISREPORT_PERSIST = 3


def standing_misreport(sig: Signals, recent: Sequence[Signals]) -> bool:
    """The logged loss is at least ``MISREPORT_MIN`` off its ``loss_sum / tokens`` on some rank at this
    step and the ``MISREPORT_PERSIST - 1`` steps before it: a logging error that needs no band, for
    one that was there before the logged loss had a band to leave (from the first step on)."""
    last = list(recent)[-MISREPORT_PERSIST:]
    return (
        len(last) == MISREPORT_PERSIST
        and last[-1] is sig
        and _contiguous(last)
        and all(_far_misreport(r.summary.misreported) for r in last)
    )


def misreport_before(sig: Signals, recent: Sequence[Signals]) -> bool:
    """The logged loss was already off its ``loss_sum / tokens`` at the step before this one: a
    standing logging error, no evidence of what happens at this step."""
    prev = list(recent)[-2] if len(recent) >= 2 and recent[-1] is sig else None
    return prev is not None and _contiguous([prev, sig]) and bool(prev.summary.misreported)


def _far_misreport(misreported: list[tuple[int, float, float]]) -> bool:
    return any(
        rep > 0 and true > 0 and abs(math.log(rep / true)) >= MISREPORT_MIN for _r, rep, true in misreported
    )


#: ``source_off``: appearances of a source in a row (this step's included) with its own loss out of band.
SOURCE_PERSIST = 3


def source_off(sig: Signals, recent: Sequence[Signals], st: DetectorSettings) -> str | None:
    """The one source out of its own band (``band_z`` and ``min_loss_jump`` over its level) at its
    last ``SOURCE_PERSIST`` appearances, ``z_threshold`` out at one of them (its level learns the bad
    values until an incident opens), while every other source with a baseline of its own is in band
    (docs/detection.md, "a source-local fault")."""
    own = sig.source_own
    if len(own) < 2:
        return None  # no other source to compare with
    zs = sig.source_z
    name = max(own, key=zs.__getitem__)
    if not (zs[name] >= st.band_z and own[name] >= math.log1p(st.min_loss_jump)):
        return None
    if any(zs[n] >= st.band_z for n in own if n != name):
        return None
    run = [zs[name]]
    for r in reversed(recent):
        if r is sig or name not in r.source_own:
            continue
        if len(run) >= SOURCE_PERSIST or not r.source_z[name] >= st.band_z:
            break
        run.append(r.source_z[name])
    return name if len(run) >= SOURCE_PERSIST and max(run) >= st.z_threshold else None


#: ``young_source_jump``: appearances that give a source's offset to the others, and the least jump
#: (log units) of its offset and own loss: beyond what different learning speeds move in a few steps
#: (at most ~0.27 over the sampler's clean runs and other faults; a garbage source jumped 0.55-0.75).
YOUNG_BEFORE = 5
YOUNG_JUMP = math.log(1.4)
YOUNG_NOISE = 4.0
YOUNG_NOISE_STEPS = 12
#: Above this many sources in one step the cross-source look-back is not made (its cost per step
#: grows with the square of the sources; a mixture that wide is judged on each source's own band).
YOUNG_MAX_SOURCES = 32


@dataclass(frozen=True, slots=True)
class SourceJump:
    name: str
    step: int  # the first appearance out
    loss: float
    before: float  # the source's own loss level before it (not log)
    offset: float  # its log offset to the other sources' median before the jump


def source_offsets(sig: Signals, name: str) -> tuple[float, float, float] | None:
    """(log loss of ``name``, log median loss of the other sources, the difference) at one step."""
    srcs = sig.summary.sources
    if name not in srcs or len(srcs) < 3 or srcs[name][1] <= 0:
        return None
    others = [math.log(v[1]) for n, v in srcs.items() if n != name and v[1] > 0]
    if len(others) < 2:
        return None
    own, med = math.log(srcs[name][1]), median(others)
    return own, med, own - med


def young_source_jump(sig: Signals, recent: Sequence[Signals]) -> SourceJump | None:
    """A source with no baseline of its own yet (a young run) whose log offset to the other sources'
    median jumped at each of its last ``SOURCE_PERSIST`` appearances, its own loss rising as much and
    the others not (docs/detection.md, "a young run's bad source")."""
    srcs = sig.summary.sources
    if not 3 <= len(srcs) <= YOUNG_MAX_SOURCES or all(n in sig.source_own for n in srcs):
        return None
    seq = [r for r in recent if r is not sig and r.step < sig.step] + [sig]
    for name in sorted(srcs):
        if name in sig.source_own:
            continue  # scored against its own band by ``source_off``
        rows = [(r, o) for r in seq if (o := source_offsets(r, name)) is not None]
        if len(rows) < YOUNG_BEFORE + SOURCE_PERSIST:
            continue
        earlier, cur = rows[:-SOURCE_PERSIST][-YOUNG_NOISE_STEPS:], rows[-SOURCE_PERSIST:]
        pre = earlier[-YOUNG_BEFORE:]
        off0 = median([o[2] for _, o in pre])
        # The offsets' step-to-step noise: a warm-up drifts them (the sources are learned at
        # different speeds), which a spread around one median would count as noise.
        steps = [abs(b[1][2] - a[1][2]) for a, b in zip(earlier, earlier[1:], strict=False)]
        noise = 1.4826 * median(steps) / math.sqrt(2)
        own0 = median([o[0] for _, o in pre])
        others0 = median([o[1] for _, o in pre])
        need = max(YOUNG_JUMP, YOUNG_NOISE * noise)
        if all(
            o[2] - off0 >= need and o[0] - own0 >= YOUNG_JUMP and o[1] - others0 < YOUNG_JUMP / 2
            for _, o in cur
        ):
            first = cur[0][0]
            return SourceJump(name, first.step, first.summary.sources[name][1], math.exp(own0), off0)
    return None


def _recent_resume(recent: Sequence[Signals], st: DetectorSettings) -> bool:
    """A restore from a checkpoint within ``resume_window`` steps: a fresh optimizer shows in the update ratio."""
    last = list(recent)[-(st.resume_window + 1) :]
    return any(r.summary.events & RESUME_EVENTS for r in last)


def _contiguous(sigs: Sequence[Signals], max_gap: int = 1) -> bool:
    steps = [s.step for s in sigs]
    return all(0 < b - a <= max_gap for a, b in zip(steps, steps[1:], strict=False))


def _metric_z(sig: Signals, metric: str, st: DetectorSettings) -> float | None:
    if metric != "rank_loss":
        return {"loss": sig.loss_z, "grad_norm": sig.grad_z, "update_ratio": sig.update_z}[metric]
    # Out of band only when also beyond the usual worst rank of a step, and its own loss rose.
    return sig.rank_z if _ge(sig.rank_tail_z, 3.0) and rank_rose(sig, st) else None


def _value(sig: Signals, metric: str) -> tuple[float | None, float | None, int | None]:
    """(value, baseline, rank) of ``metric`` at this step, for the report."""
    s = sig.summary
    if metric == "grad_norm" and s.grad_norm is not None and sig.grad_excess is not None:
        return s.grad_norm, s.grad_norm / math.exp(sig.grad_excess), None
    if metric == "update_ratio" and s.update_ratio is not None and sig.update_excess is not None:
        return s.update_ratio, s.update_ratio / math.exp(sig.update_excess), None
    if metric == "rank_loss" and s.worst_rank is not None:
        return math.exp(s.rank_log_loss[s.worst_rank]), s.ranks_median_loss, s.worst_rank
    if math.isfinite(sig.loss_excess):
        return s.loss_main, s.loss_main / math.exp(sig.loss_excess), None
    return s.loss_main, None, None


def locate_first(
    recent: Sequence[Signals], st: DetectorSettings, rule: str, interval: int = 1
) -> FirstAnomaly:
    """The earliest step/metric of an unbroken out-of-band run ending at (or just before) detection;
    ``interval``: the usual distance between logged steps."""
    det = recent[-1]
    if rule == "nonfinite" and not _rose(recent, st):
        s = det.summary
        rank = s.nonfinite_ranks[0] if s.nonfinite_ranks else None
        return FirstAnomaly(step=det.step, metric=s.nonfinite_at or "loss", rank=rank, value=s.loss_main)
    band = {"loss": st.band_z, "grad_norm": st.band_z, "update_ratio": st.band_z}
    band["rank_loss"] = max(st.band_z, st.rank_z_threshold / 2)
    best: tuple[int, float, str, Signals] | None = None
    for metric in ("rank_loss", "loss", "grad_norm", "update_ratio"):
        first = _run_start(recent, metric, band[metric], st, interval)
        if first is None:
            continue
        # Earliest step first; at the same step the quantity furthest out of its band.
        strength = -(_metric_z(first, metric, st) or 0.0) / band[metric]
        if best is None or (first.step, strength) < (best[0], best[1]):
            best = (first.step, strength, metric, first)
    if best is None:
        metric = {"checksum": "param_checksum", "metric": "reported_loss"}.get(rule, "loss")
        s = det.summary
        rank = s.checksum_minority[0] if rule == "checksum" and s.checksum_minority else None
        return FirstAnomaly(step=det.step, metric=metric, rank=rank, value=s.loss_main)
    _, _, metric, sig = best
    value, baseline, rank = _value(sig, metric)
    z = _metric_z(sig, metric, st)
    return FirstAnomaly(
        step=sig.step,
        metric=metric,
        rank=rank,
        value=value,
        baseline=baseline,
        z=round(z, 2) if z is not None and math.isfinite(z) else None,
    )


def _run_start(
    recent: Sequence[Signals], metric: str, band: float, st: DetectorSettings, interval: int
) -> Signals | None:
    """The first step of ``metric``'s out-of-band run, walking back from detection."""
    seq = list(recent)[-(st.lookback + 1) :]
    first: Signals | None = None
    prev_step: int | None = None
    for i, sig in enumerate(reversed(seq)):
        if prev_step is not None and prev_step - sig.step > interval and first is not None:
            break
        if _ge(_metric_z(sig, metric, st), band):
            first = sig
        elif i > 0:  # the detection step may be calm: an oversized update at s shows in the loss at s + 1
            break
        prev_step = sig.step
    return first


def _rose(recent: Sequence[Signals], st: DetectorSettings) -> bool:
    """Something was already out of band in the steps before a non-finite value."""
    prior = list(recent)[-4:-1]
    return any(
        _ge(r.loss_z, st.band_z) or _ge(r.grad_z, st.grad_z_threshold) or _ge(r.update_z, st.grad_z_threshold)
        for r in prior
    )


#: A loss back below its level by this robust z ends a slow rise (the ``trend`` incident's band).
RISE_Z = 1.0

#: Page's CUSUM on the loss's robust z dates where a sustained rise began (docs/detection.md,
#: "Loss-only traces"): allowance, one step's cap, the sum a rise must reach by the onset, and the
#: drop below the level that ends a run (an earlier healthy bump must not pull the date back).
CUSUM_K = 0.5
CUSUM_CLIP = 3.0
CUSUM_MIN = 5.0
CUSUM_BREAK = 1.0


def rise_start(zs: Iterable[tuple[int, float]], onset: int, interval: int = 1) -> int | None:
    """The first step of the CUSUM run leading into ``onset``, when it had reached ``CUSUM_MIN`` by
    the step before; None otherwise (an abrupt jump at ``onset`` is its own start).

    ``zs``: (step, loss z) in step order, each against the level the detector had then, centred on
    their own median: the level of a falling loss lags it, so a healthy stretch can sit above zero
    for hundreds of steps and an uncentred sum would drift up through it. A gap wider than
    ``interval`` resets the sum."""
    seq = [(step, z) for step, z in zs if step < onset and not math.isnan(z)]
    if not seq:
        return None
    center = median([min(max(z, -CUSUM_CLIP), CUSUM_CLIP) for _, z in seq])
    total, start, prev = 0.0, None, None
    for step, z in seq:
        if prev is not None and step - prev > interval:
            total, start = 0.0, None
        prev = step
        dz = z - center
        total = max(0.0, total + min(dz, CUSUM_CLIP) - CUSUM_K) if dz > -CUSUM_BREAK else 0.0
        if total == 0.0:
            start = None
        elif start is None:
            start = step
    return start if start is not None and total >= CUSUM_MIN else None
