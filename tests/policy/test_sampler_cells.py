"""Planning failures the scenario sampler found (bench/sampler/README.md), each as the diagnosis
and job state the runtime handed the engine, reproduced before the fix.

- a shard that recurs on one rank was escalated as a bad rank by the rank count alone, although
  every occurrence's evidence was its data (``rank_offenders`` counts only what points at the rank);
- a one-rank non-finite step in a run too young to have a checkpoint was escalated for the lack of
  a rollback target, although a transient needs no rollback to go on.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.core.model import Cause, CauseScore, Diagnosis, FirstAnomaly, Phenotype, Severity
from supervisor.core.policy import Policy, plan

from .conftest import state

SHARD_SAMPLES = [f"docstrings:shard7.py:{i}" for i in range(16)]


def recurring_shard(onset: int = 135, every: int = 40, **kw: object) -> Diagnosis:
    """The third occurrence of a bad shard on rank 0, as the detector states it (``kw``: fields
    that differ)."""
    period = every
    onsets = [onset - 2 * period, onset - period, onset]
    fields: dict[str, object] = {
        "onset_step": onset,
        "peak_step": onset,
        "end_step": None,
        "phenotype": Phenotype.PERIODIC,
        "period": period,
        "rank_local": True,
        "first_rank": 0,
        "source_local": "docstrings",
        "causes": [
            CauseScore(
                Cause.DATA,
                0.9,
                [
                    f"recurs every {period} steps (onsets {onsets})",
                    f"rank 0 loss 4.64 vs ranks' median 3.08 at step {onsets[0]}",
                    "source `docstrings` loss 6.01 (robust z 10.8); other sources in band",
                ],
            ),
            CauseScore(Cause.METRIC_ARTIFACT, 0.35, [f"grad norm 1.68x at the loss peak (step {onset})"]),
        ],
        "suspect_samples": SHARD_SAMPLES,
        "severity": Severity.HIGH,
        "detected_step": onset,
    }
    fields.update(kw)
    return Diagnosis(**fields)  # type: ignore[arg-type]


def shard_on_rank_1_with_update(onset: int, every: int, rank_line: str, ratio: float) -> Diagnosis:
    """The third occurrence of a bad shard on rank 1 whose batch lifted the update ratio ``ratio``x:
    rule ``bad_batch_step`` (``rank_line``: the rank's evidence as the detector states it)."""
    onsets = [onset - 2 * every, onset - every, onset]
    return recurring_shard(
        onset=onset,
        every=every,
        first_rank=1,
        source_local=None,
        causes=[
            CauseScore(Cause.DATA, 0.6, [f"recurs every {every} steps (onsets {onsets})", rank_line]),
            CauseScore(Cause.OPTIMIZER, 0.3, [f"update ratio {ratio}x its level at step {onset}"]),
        ],
    )


def shard_state(onset: int = 135, period: int = 40) -> object:
    """The job as the runtime saw it: two earlier occurrences on rank 0, each planned by rank_local."""
    return state(
        step=onset + 2,
        attempts={"rank_local": 2},
        incident_attempt=2,
        rank_incidents=[(onset - 2 * period, 0), (onset - period, 0)],
        steps_since_last_incident=period,
        checkpoints=tuple((s, "healthy") for s in range(20, onset, 20)),
    )


def test_a_shard_that_recurs_on_one_rank_is_excluded_where_it_recurs_not_escalated(
    default_policy: Policy,
) -> None:
    """Cell 24667:698633: 'rank 0 deviated first in 3 incidents ... hardware suspect' although the
    incidents recur at the data's period and their samples were named each time."""
    d = recurring_shard()
    p = plan(d, shard_state(), default_policy)  # type: ignore[arg-type]
    assert not p.escalates, p.escalate_reason
    applies = [a.params for a in p.actions if a.name == "apply"]
    assert applies and applies[0]["exclude"]["samples"] == SHARD_SAMPLES  # this occurrence's samples
    assert any("rank_offenders" in n and "data" in n for n in p.notes), p.notes


def test_a_rank_that_goes_non_finite_again_and_again_is_still_a_hardware_suspect(
    default_policy: Policy,
) -> None:
    """What points at the rank itself (non-finite values on it, no data evidence) still counts,
    periodic or not."""
    for phenotype, period in ((Phenotype.TRANSIENT, None), (Phenotype.PERIODIC, 40)):
        d = recurring_shard(
            phenotype=phenotype,
            period=period,
            source_local=None,
            nonfinite=True,
            nonfinite_at="forward:blocks.0.fc2",
            causes=[CauseScore(Cause.NUMERIC, 0.8, ["non-finite values first at step 135 on ranks [0]"])],
            suspect_samples=[],
        )
        p = plan(d, shard_state(), default_policy)  # type: ignore[arg-type]
        assert p.escalates and "hardware suspect" in (p.escalate_reason or ""), (phenotype, p.escalate_reason)


def young_run_nan(**kw: object) -> Diagnosis:
    """Cell 558570:470549: NaN on rank 0 at step 10, diagnosed at that very step (the next step,
    which shows the loss finite again, not yet seen), with every rank's step skipped by the SDK."""
    fields: dict[str, object] = {
        "onset_step": 10,
        "peak_step": 10,
        "end_step": None,
        "phenotype": Phenotype.TRANSIENT,
        "nonfinite": True,
        "nonfinite_at": "forward:inp",
        "rank_local": True,
        "first_rank": 0,
        "causes": [
            CauseScore(
                Cause.NUMERIC,
                0.7,
                [
                    "non-finite values first at step 10 in `forward:inp` on ranks [0, 1]",
                    "nothing was out of band before it",
                ],
            ),
            CauseScore(
                Cause.DATA,
                0.6,
                ["loss 5.35 -> nan at step 10; back in band within 0 steps", "rank 0 deviated first"],
            ),
        ],
        "suspect_samples": [f"web:page{i:03d}:33" for i in range(18)],
        "severity": Severity.HIGH,
        "first_anomaly": FirstAnomaly(
            metric="forward:inp", step=10, rank=0, value=None, baseline=None, z=None
        ),
        "detected_step": 10,
    }
    fields.update(kw)
    return Diagnosis(**fields)  # type: ignore[arg-type]


def test_a_transient_in_a_run_with_no_checkpoint_yet_is_excluded_and_observed_not_escalated(
    default_policy: Policy,
) -> None:
    """'no healthy checkpoint before the onset 10 (known checkpoints: none)' stopped a run at step
    10: a transient needs no rollback to go on; its batch is kept out and a window judges the state
    (a state that did take the non-finite step fails it at once)."""
    d = young_run_nan()
    p = plan(d, state(step=10, checkpoints=(), state_maybe_nonfinite=True), default_policy)
    assert not p.escalates, p.escalate_reason
    assert "rollback" not in p.action_names
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"]["samples"] == d.suspect_samples
    assert "warmup_steps" not in apply.params and "lr_scale" not in apply.params
    names = p.action_names
    assert "observe" in names and names.index("apply") < names.index("observe")
    assert names[-1] in ("observe", "resume")
    assert any("no checkpoint" in n.lower() or "no healthy checkpoint" in n for n in p.notes), p.notes


def test_a_divergence_with_no_checkpoint_still_escalates(default_policy: Policy) -> None:
    """A state that kept going wrong needs the rollback it cannot have: a person decides."""
    d = young_run_nan(phenotype=Phenotype.DIVERGENCE, rank_local=False, first_rank=None, end_step=None)
    p = plan(d, state(step=14, checkpoints=(), state_maybe_nonfinite=True), default_policy)
    assert p.escalates and "no healthy checkpoint before the onset" in (p.escalate_reason or "")


def test_each_occurrence_of_a_data_recurrence_is_excluded_where_it_recurs_past_the_recurrence_bound(
    default_policy: Policy,
) -> None:
    """A shard every 40 steps from step 25 recurs 4 times in 150 steps: the 4th occurrence came
    after 3 fixes that each held (their samples never came back), so recurrence.max_attempts
    (fixes that do not hold) does not stop it; the rule's own max_attempts still bounds it."""
    onset, period = 145, 40
    d = recurring_shard(onset=onset)
    js = state(
        step=onset + 2,
        attempts={"rank_local": 3},
        incident_attempt=3,
        rank_incidents=[(onset - k * period, 0) for k in (3, 2, 1)],
        steps_since_last_incident=period,
        checkpoints=tuple((s, "healthy") for s in range(20, onset, 20)),
    )
    assert default_policy.recurrence.max_attempts == 3
    p = plan(d, js, default_policy)
    assert not p.escalates, p.escalate_reason
    assert any("recurrence.max_attempts" in n for n in p.notes), p.notes
    assert p.action("apply") is not None
    rule_max = next(r for r in default_policy.rules if r.name == p.rule).max_attempts
    assert rule_max is not None
    worn = plan(d, replace(js, attempts={p.rule: rule_max}), default_policy)
    assert worn.escalates and "max_attempts" in (worn.escalate_reason or "")
    # A recurrence that is not the data's (no period kept, no samples) is still bounded.
    other = plan(recurring_shard(onset=onset, phenotype=Phenotype.TRANSIENT, period=None), js, default_policy)
    assert other.escalates and "recurrence.max_attempts=3" in (other.escalate_reason or "")


def test_a_fix_whose_window_failed_is_not_repeated_unchanged_the_state_is_rolled_back(
    default_policy: Policy,
) -> None:
    """Cell 928894:474540 (an LR bug from the warm-up, read as a data transient at step 73): the
    exclusion's window failed (grad norm 3.3x its baseline, the spike back), and the second plan
    was the same exclusion, whose window failed again: escalated at 1.35x the clean loss. The
    weights trained on through a failed window are no state to go on from: the next attempt
    restores one from before the onset."""
    d = Diagnosis(
        onset_step=73,
        peak_step=73,
        end_step=76,
        phenotype=Phenotype.TRANSIENT,
        causes=[CauseScore(Cause.DATA, 0.3, ["loss 3.49 -> 13.2 at step 73; back in band within 0 steps"])],
        suspect_samples=[f"code:x.py:{i}" for i in range(18)],
        severity=Severity.HIGH,
        detected_step=73,
    )
    checkpoints = tuple((s, "healthy") for s in range(20, 80, 20))
    first = plan(d, state(step=78, checkpoints=checkpoints), default_policy)
    assert first.rule == "transient" and "rollback" not in first.action_names
    again = plan(d, state(step=130, checkpoints=checkpoints, observation_failures=1), default_policy)
    assert not again.escalates, again.escalate_reason
    names = again.action_names
    assert "rollback" in names and names.index("freeze") < names.index("rollback") < names.index("observe")
    assert again.action("rollback").params["target_step"] < d.onset_step  # type: ignore[union-attr]
    assert any("observation window failed" in n for n in again.notes), again.notes
    # the bound stands: a second failed window escalates
    assert plan(d, state(step=150, checkpoints=checkpoints, observation_failures=2), default_policy).escalates


def shard_again_with_update(onset: int = 113, rank: int = 1, **kw: object) -> Diagnosis:
    """Cell 364272:122380: the shard's second occurrence on rank 1 (50 steps after the first, at 63),
    read as a transient whose one garbage batch moved the update ratio -- bad_batch_step."""
    fields: dict[str, object] = {
        "onset_step": onset,
        "peak_step": onset,
        "end_step": onset + 1,
        "phenotype": Phenotype.TRANSIENT,
        "rank_local": True,
        "first_rank": rank,
        "causes": [
            CauseScore(
                Cause.DATA,
                0.6,
                [
                    f"loss 2.68 -> 3.74 at step {onset}; back in band within 1 steps",
                    f"rank {rank} loss 6.17 vs ranks' median 2.52 at step {onset}",
                ],
            ),
            CauseScore(Cause.OPTIMIZER, 0.3, [f"update ratio 1.93x its level at step {onset}"]),
        ],
        "suspect_samples": [f"web:page{i:03d}:{onset}" for i in range(16)],
        "severity": Severity.MEDIUM,
        "detected_step": onset,
    }
    fields.update(kw)
    return Diagnosis(**fields)  # type: ignore[arg-type]


def test_a_recurring_data_fault_is_not_rolled_back_over_its_own_earlier_occurrence(
    default_policy: Policy,
) -> None:
    """Cells 364272:122380 and 271676:628637: an occurrence whose batch moved the update ratio was
    planned bad_batch_step and rolled back to checkpoint 40, the newest healthy one (every checkpoint
    within healthy_after_steps of an occurrence stays unhealthy), before the shard's earlier
    occurrence (63; 65 and 105). The re-run met the data there again inside the window, the window
    failed on it, and the re-plan escalated on recurrence.max_attempts. A rollback re-serves the data
    in the same order: it must not go back over an occurrence of the same data fault; the occurrence
    is kept out where it recurs and a window judges the state, as for a transient with no target."""
    ckpts = ((20, "healthy"), (40, "healthy"), (60, "verified"), (80, "verified"), (100, "verified"))
    js = state(step=116, attempts={"rank_local": 1}, incident_attempt=1, rank_incidents=[(63, 1)],
               checkpoints=ckpts, earlier_onsets=(63,))  # fmt: skip
    d = shard_again_with_update()
    p = plan(d, js, default_policy)
    assert not p.escalates, p.escalate_reason
    assert "rollback" not in p.action_names, [a.params for a in p.actions if a.name == "rollback"]
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"]["samples"] == d.suspect_samples
    assert "warmup_steps" not in apply.params and "lr_scale" not in apply.params
    assert "observe" in p.action_names
    assert any("earlier occurrence" in n and "63" in n for n in p.notes), p.notes

    # The periodic reading of 271676:628637 (onsets 25, 65, 105, 145; healthy 20, 40 only): the same.
    periodic = recurring_shard(onset=145, every=40, first_rank=0, suspect_samples=SHARD_SAMPLES,
                               causes=[*recurring_shard(onset=145).causes,
                                       CauseScore(Cause.OPTIMIZER, 0.3, ["update ratio 1.73x its level at step 145"])])  # fmt: skip
    js145 = replace(js, step=148, attempts={"rank_local": 2}, incident_attempt=2,
                    rank_incidents=((65, 0), (105, 0)), earlier_onsets=(65, 105),
                    checkpoints=(*ckpts, (120, "verified"), (140, "verified")))  # fmt: skip
    p = plan(periodic, js145, default_policy)
    assert not p.escalates and "rollback" not in p.action_names, (p.escalate_reason, p.action_names)

    # A healthy checkpoint after the earlier occurrence is a target that re-runs none of it: kept.
    kept = plan(d, replace(js, checkpoints=(*ckpts[:3], (80, "healthy"), (100, "verified"))), default_policy)
    rollback = kept.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 80
    # A one-off bad batch (no earlier occurrence) is rolled back as before.
    once = plan(d, replace(js, earlier_onsets=(), incident_attempt=0, rank_incidents=()), default_policy)
    assert once.rule == "bad_batch_step" and once.action("rollback") is not None
    # What is no data fault (NaN/Inf not skipped) keeps its rollback, whatever came before it.
    nan = shard_again_with_update(nonfinite=True, nonfinite_at="forward:blocks.0",
                                  causes=[CauseScore(Cause.NUMERIC, 0.8, ["non-finite values first at step 113 on ranks [1]"])])  # fmt: skip
    assert plan(nan, js, default_policy).action("rollback") is not None


def test_a_recurring_shard_with_no_healthy_checkpoint_goes_on_without_the_rollback(
    default_policy: Policy,
) -> None:
    """Cell 117597:263588 (moe, AdamW, a checkpoint every 50; a bad shard on rank 1 every 50 steps
    from 17): its third occurrence, at 117 of 120, lifted the update ratio 1.94x, so rule
    ``bad_batch_step`` asked for a rollback; 50 and 100 were verified but never healthy (each had an
    occurrence within its healthy window), and the job was escalated although every occurrence came
    back in band at once. A periodic spike is a transient that recurs: its source is kept out and a
    window judges the state, as for a transient (a state that took a broken step fails it at once)."""
    d = shard_on_rank_1_with_update(117, 50, "rank 1 loss 5.74 vs ranks' median 2.66 at step 67", 1.94)
    js = state(
        step=118,
        attempts={"rank_local": 1},
        incident_attempt=2,
        rank_incidents=[(67, 1)],
        steps_since_last_incident=50,
        checkpoints=((50, "verified"), (100, "verified")),
        checkpoint_every=50,
        healthy_after=20,
    )
    p = plan(d, js, default_policy)
    assert p.rule == "bad_batch_step"  # the update jump: the rule that rolls back past a bad step
    assert not p.escalates, p.escalate_reason
    assert "rollback" not in p.action_names
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"]["samples"] == SHARD_SAMPLES
    assert "observe" in p.action_names
    assert any("rollback dropped" in n and "recurs" in n for n in p.notes), p.notes
    # With a healthy checkpoint before it, the rollback stays.
    healthy = replace(js, checkpoints=((50, "healthy"), (100, "verified")))
    rolled = plan(d, healthy, default_policy).action("rollback")
    assert rolled is not None and rolled.params["target_step"] == 50


def test_a_periodic_divergence_with_no_target_still_escalates(default_policy: Policy) -> None:
    """Only an occurrence back in band goes on without its rollback: one still out of band when
    planned has a trend to undo that no window can judge away."""
    d = recurring_shard(
        onset=117,
        every=50,
        causes=[CauseScore(Cause.OPTIMIZER, 0.6, ["update ratio 30x its level at step 117"])],
        end_step=None,
        peak_step=125,
    )
    js = state(
        step=128, checkpoints=((50, "verified"), (100, "verified")), checkpoint_every=50, healthy_after=20
    )
    p = plan(d, js, default_policy)
    assert p.escalates, p.action_names


def test_a_data_recurrence_past_its_rules_attempts_goes_on_without_the_rollback(
    default_policy: Policy,
) -> None:
    """Cell 4106:31934 (moe, AdamW, a checkpoint every 50; a bad shard on rank 1 every 60 steps
    from step 4, in the warm-up, unseen): each occurrence lifted the update ratio, so rule
    ``bad_batch_step`` rolled back at 64 (to the run's start) and at 124 (to 100), and each fix
    held. The third, at 184, was escalated: the rule's two attempts were spent. A recurrence of the
    data is fresh data each time, and a rollback at every period re-trains a period's worth: past
    the rule's attempts it is kept out where it recurs, with no rollback, and a window judges the
    state. What is not the data's, or a plan with no rollback to drop, still escalates there."""
    d = shard_on_rank_1_with_update(184, 60, "rank 1 loss 5.95 vs ranks' median 3.17 at step 64", 1.88)
    js = state(
        step=187,
        attempts={"bad_batch_step": 2},
        incident_attempt=2,
        rank_incidents=[(64, 1), (124, 1)],
        steps_since_last_incident=60,
        checkpoints=((50, "healthy"), (100, "healthy"), (150, "healthy")),
    )
    p = plan(d, js, default_policy)
    assert p.rule == "bad_batch_step"
    assert not p.escalates, p.escalate_reason
    assert "rollback" not in p.action_names and "observe" in p.action_names, p.action_names
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"]["samples"] == d.suspect_samples
    assert any("max_attempts=2" in n and "rollback dropped" in n for n in p.notes), p.notes
    # One attempt left: the rollback stands.
    fresh = plan(d, replace(js, attempts={"bad_batch_step": 1}), default_policy)
    assert fresh.action("rollback") is not None and not fresh.escalates
    # Not a recurrence of the data (no period kept): the rule's attempts still escalate.
    lone = replace(d, phenotype=Phenotype.TRANSIENT, period=None, rank_local=False, first_rank=None)
    worn = plan(lone, js, default_policy)
    assert worn.escalates and "defaults.max_attempts=2" in (worn.escalate_reason or "")
