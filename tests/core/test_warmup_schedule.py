"""A scheduled LR ramp is not an LR fault, and an update that only follows it is no update jump.

Sampler cell 653924:126246 (gpt2, hand-written Lion, warm-up over 15 steps, NaN in rank 1's forward
at step 4, skipped by the SDK): the warm-up's own LR (x2 from step 3 to step 6) and Lion's update,
whose size is ``lr * sqrt(d)`` and so rises with it (3x its level of the first steps by step 6),
were read as an LR rise and an update-ratio jump; the incident became a `slow_recovery` under
`optimizer_state`, which asked for a rollback that a run of 4 steps has no checkpoint for, and
escalated. The update of an Adam-like or momentum optimizer follows the LR just as well
(``lr * |m / sqrt(v)|``, ``lr * |buf|``): what counts is the update per unit of LR, whenever the LR
moved as the schedule did just before the onset.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.analysis import StreamingAnalyzer, group_steps, trace_order
from supervisor.core.model import Diagnosis, Phenotype
from supervisor.core.policy import load_policy, plan
from supervisor.core.policy.evidence import findings
from supervisor.core.records import Record
from supervisor.traces import read_trace
from supervisor.traces.synthetic import set_loss, synthetic_records
from tests.policy.conftest import state

DATA = Path(__file__).resolve().parent / "data"


def _diagnoses(records: list[Record]) -> list[Diagnosis]:
    """Every diagnosis the runtime may plan from (opened, ready, refined, closed), in order."""
    a = StreamingAnalyzer()
    out: list[Diagnosis] = []
    for step, batch in group_steps(trace_order(records)):
        out += [u.diagnosis for u in a.observe_step(step, batch)]
    return out


def _assert_skipped_transient(diags: list[Diagnosis]) -> None:
    assert diags
    policy = load_policy("default")
    for d in diags:
        found = findings(d)
        assert "lr_jump" not in found and "update_jump" not in found, (d.detected_step, found)
        assert d.phenotype is Phenotype.TRANSIENT, d.to_json()
        p = plan(
            d, state(step=d.detected_step or d.onset_step, checkpoints=(), state_maybe_nonfinite=True), policy
        )
        assert p.rule == "skipped_nonfinite" and not p.escalates, (p.rule, p.escalate_reason)
        assert "rollback" not in p.action_names


def test_the_sampler_cell_lion_nan_in_the_warm_up_is_a_skipped_transient() -> None:
    _assert_skipped_transient(_diagnoses(read_trace(DATA / "sampler_lion_warmup_nan.jsonl.gz").records))


def _warm_up_nan(onset: int, lr_fault: float = 1.0, update: bool = True) -> list[Record]:
    """A linear warm-up over 20 steps whose update is proportional to the LR (as Lion's is, and
    Adam's nearly); one rank's forward goes non-finite at ``onset`` and the SDK skips the step
    everywhere. ``lr_fault``: the LR (and so the update) multiplied from the onset on; ``update``:
    whether the update norm is logged."""
    recs = synthetic_records(40, 2, seed=7)
    for r in recs:
        if not update:
            r.update_norm = None
        if r.step >= onset and r.lr is not None and r.update_norm is not None:
            r.lr, r.update_norm = r.lr * lr_fault, r.update_norm * lr_fault
        if r.step == onset:
            r.grad_norm, r.nonfinite, r.update_norm = float("nan"), True, 0.0
            r.events = ["step_skipped_nonfinite"]
            if r.rank == 1:
                set_loss(r, float("nan"))
    return recs


@pytest.mark.parametrize("onset", [4, 8, 12])
def test_a_skipped_nan_inside_a_warm_up_is_not_an_lr_or_update_fault(onset: int) -> None:
    """The update rises with the LR step after step, 2-3x its level of the first steps."""
    _assert_skipped_transient(_diagnoses(_warm_up_nan(onset)))


@pytest.mark.parametrize("update", [True, False])
def test_an_exponential_warm_up_is_no_lr_jump(update: bool) -> None:
    """A warm-up that multiplies the LR by 1.6 at every step up to step 12: at the onset it rose 1.6x
    from the step before, as it did at each of the steps before (no faster)."""
    recs = _warm_up_nan(9, update=update)
    for r in recs:
        scale = 1.6 ** (min(r.step, 12) - 12)
        r.lr = 1e-3 * scale
        if r.update_norm:
            r.update_norm = 0.2 * scale
    _assert_skipped_transient(_diagnoses(recs))


def test_an_lr_fault_inside_a_warm_up_is_still_an_lr_and_update_jump() -> None:
    """The same warm-up with the LR x20 from the onset on: faster than the schedule ever rose."""
    diags = _diagnoses(_warm_up_nan(8, lr_fault=20.0))
    assert diags
    last = findings(diags[-1])
    assert "lr_jump" in last, last
