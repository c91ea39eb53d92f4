"""A checkpoint is never marked healthy while its healthy window holds an incident's onset, however
late the incident was detected: the rule is keyed on where the fault began, not on the step the
detector saw it (a fault dated back to its first abnormal step can be detected after the window
of a checkpoint whose mark is still to be settled -- here one saved asynchronously, reported with
``checkpoint_saved:<step>`` in a later record)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.core.analysis import IncidentUpdate
from supervisor.core.model import Cause, CauseScore, Diagnosis, HealthMark, Phenotype, Severity
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver

SAVED, ONSET, DETECTED, REPORTED = 25, 28, 36, 40  # FAST: healthy_after_steps = 5


def dated_back(onset: int, detected: int, cause: Cause = Cause.OPTIMIZER) -> Diagnosis:
    return Diagnosis(onset_step=onset, peak_step=detected, end_step=None, phenotype=Phenotype.SLOW_RECOVERY,
                     first_rank=None, causes=[CauseScore(cause, 1.0, ["update ratio rose"])],
                     severity=Severity.LOW, detected_step=detected)  # fmt: skip


def run_to_report(tmp_path: Path, onset: int, causes: tuple[Cause, ...] = (Cause.OPTIMIZER,)) -> Controller:
    """The incident opens at ``DETECTED`` with ``causes[0]`` on top, refined a step later to each next one."""
    job = make_job(tmp_path, "near", max_steps=200, resources={"num_workers": 1})
    ranks = FakeRanks(1, 200)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    observe = ctl.flow.analyzer.observe_step

    def detector(step: int, records: list[Any]) -> list[IncidentUpdate]:
        i = step - DETECTED
        kind = "opened" if i == 0 else "refined"
        extra = (
            [IncidentUpdate(kind, 999, dated_back(onset, step, causes[i]))] if 0 <= i < len(causes) else []
        )
        return [*observe(step, records), *extra]

    ctl.flow.analyzer.observe_step = detector  # type: ignore[method-assign]
    ranks.train(ctl, SAVED)
    saver(ctl)(SAVED)  # committed now, its event rides on a later record
    ranks.train(ctl, REPORTED - SAVED - 1)
    ranks.step += 1
    ranks.send(ctl, 0, [ranks.record(ranks.step, 0, [f"checkpoint_saved:{SAVED}"])])
    ctl.iterate()
    assert ctl.current_step == REPORTED and SAVED in ctl.state.checkpoints_verified
    return ctl


def test_a_checkpoint_whose_window_holds_a_late_detected_onset_is_not_marked_healthy(tmp_path: Path) -> None:
    ctl = run_to_report(tmp_path / "inside", ONSET)
    assert ctl.checkpoints.manifest(SAVED).health is HealthMark.VERIFIED


def test_an_onset_outside_the_window_leaves_the_checkpoint_to_be_marked(tmp_path: Path) -> None:
    ctl = run_to_report(tmp_path / "outside", SAVED + 5 + 3)  # began after the window ended
    assert ctl.checkpoints.manifest(SAVED).health is HealthMark.HEALTHY


def test_a_logging_error_near_a_checkpoint_leaves_it_to_be_marked(tmp_path: Path) -> None:
    """A metric artifact says the numbers are wrong and the training is sound: no evidence against
    the checkpoints around it (a lasting logging bug would otherwise keep every one from turning
    healthy, and a real fault after it would find no rollback target)."""
    ctl = run_to_report(tmp_path / "metric", ONSET, (Cause.METRIC_ARTIFACT,))
    assert ctl.checkpoints.manifest(SAVED).health is HealthMark.HEALTHY


def test_a_logging_error_that_turns_out_a_real_fault_keeps_the_checkpoint_unmarked(tmp_path: Path) -> None:
    ctl = run_to_report(tmp_path / "refined", ONSET, (Cause.METRIC_ARTIFACT, Cause.OPTIMIZER))
    assert ctl.checkpoints.manifest(SAVED).health is HealthMark.VERIFIED
