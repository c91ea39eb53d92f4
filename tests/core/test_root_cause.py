"""The root cause is the first abnormal quantity (issue 24 point 2): the postmortem's headline and
its permanent measures come from the earliest evidence that explains the spike, later symptoms
are listed as its consequences."""

from __future__ import annotations

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.model import Cause, CauseScore, Diagnosis, Phenotype, Severity
from supervisor.incidents.measures import root_cause, suggest
from supervisor.traces.synthetic import set_loss, synthetic_records


def test_an_lr_jump_is_the_root_even_when_later_symptoms_score_higher() -> None:
    d = Diagnosis(
        onset_step=221,
        peak_step=226,
        end_step=None,
        phenotype=Phenotype.TRANSIENT,
        causes=[
            CauseScore(
                Cause.DATA,
                0.9,
                [
                    "loss 2.1 -> 3.3 at step 226; back in band within 2 steps",
                    "rank 1 loss 3.9 vs ranks' median 2.2 at step 224",
                ],
            ),
            CauseScore(
                Cause.OPTIMIZER,
                0.6,
                [
                    "learning rate changed 25x from the previous step at step 221",
                    "update ratio 24x its level at step 222",
                ],
            ),
        ],  # fmt: skip
        severity=Severity.HIGH,
    )
    root = root_cause(d)
    assert root is not None and root.cause is Cause.OPTIMIZER and root.step == 221
    assert "learning rate changed 25x" in root.headline()
    assert root.consequences[0].startswith("optimizer: update ratio") and any(
        "rank 1" in c for c in root.consequences
    )
    assert suggest(d)[0].kind == "update_ratio_alert"  # the root's measure first


def test_the_detected_lr_bug_is_headlined_by_the_lr_change() -> None:
    a = StreamingAnalyzer()
    for step, batch in group_steps(synthetic_records(260, 2, seed=0)):
        if step >= 221:
            for r in batch:
                r.lr = (r.lr or 0.0) * 25
                r.update_norm = (r.update_norm or 0.0) * 25
                if step >= 223:
                    set_loss(r, r.loss * 1.6)
                    r.grad_norm = (r.grad_norm or 0.0) * 4
        a.observe_step(step, batch)
    d = a.finish().incidents[0]
    root = root_cause(d)
    assert root is not None and root.cause is Cause.OPTIMIZER and root.step == 221, (root, d.to_json())
    assert "learning rate" in root.evidence
