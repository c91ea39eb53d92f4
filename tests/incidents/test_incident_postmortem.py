"""The postmortem value: impact, detection gap, the earlier signal, measures, plot markers."""

from __future__ import annotations

import pytest

from supervisor.core.model import Diagnosis
from supervisor.incidents import IncidentStore
from supervisor.incidents.measures import suggest
from supervisor.incidents.postmortem import build_postmortem
from supervisor.incidents.signals import first_crossings
from tests.incidents.builders import diagnosis, full_incident, telemetry


def test_impact_counts_lost_steps_recompute_time_and_excluded_data(store: IncidentStore) -> None:
    pm = build_postmortem(store, full_incident(store))
    im = pm.impact
    assert (im.steps_lost, im.rollback_from, im.rollback_to) == (23, 103, 80)
    assert im.recompute_s == pytest.approx(23 * 0.5)
    assert im.downtime_s is not None and im.downtime_s >= 0
    # The excluded samples are the suspects: named once (under root cause), referred to here.
    assert im.data_excluded == ["the 2 suspect samples (IDs under root cause)", "batches of steps 100–104"]


def test_detection_gap_names_the_signal_that_moved_first(store: IncidentStore) -> None:
    pm = build_postmortem(store, full_incident(store))
    det = pm.detection
    assert (det.first_step, det.first_metric, det.first_rank, det.detected_step) == (100, "loss", 1, 103)
    assert det.gap_steps == 3 and det.gap_s == pytest.approx(1.5)
    assert det.earlier_signal is not None
    assert (det.earlier_signal.signal, det.earlier_signal.step) == ("grad_norm", 95)
    assert "5 steps before the loss did (step 100)" in det.note and "8 steps earlier" in det.note


def test_no_earlier_signal_when_grad_norm_moves_with_the_loss() -> None:
    crossings = first_crossings(telemetry(grad_lead=0), reference_step=100)
    assert {c.step for c in crossings} == {100}
    assert {c.label for c in crossings} >= {"loss", "loss[rank 1]", "grad_norm[rank 1]"}
    assert "loss[rank 0]" not in {c.label for c in crossings}


def test_too_little_history_finds_no_crossing() -> None:
    assert first_crossings(telemetry(first=95), reference_step=100) == []


def test_markers_carry_the_landmarks_of_the_plots(store: IncidentStore) -> None:
    m = build_postmortem(store, full_incident(store)).markers
    assert (m.onset_step, m.first_rank, m.detected_step, m.rollback_to) == (100, 1, 103, 80)
    assert m.excluded == [(100, 104)] and m.observation == (80, 130)


@pytest.mark.parametrize(
    ("cause", "attrs", "kind"),
    [
        ("data", {}, "data_rule"),
        ("optimizer", {"rank_local": False, "source_local": None}, "update_ratio_alert"),
        ("numeric", {"nonfinite": True, "nonfinite_at": "blocks.3.attn"}, "numeric_unit_test"),
        ("distributed", {}, "per_rank_monitor"),
        ("resume_state", {"after_resume": True}, "checkpoint_check"),
        ("metric_artifact", {"rank_local": False, "source_local": None}, "metric_fix"),
    ],
)
def test_measures_follow_the_top_cause(cause: str, attrs: dict[str, object], kind: str) -> None:
    d = Diagnosis.from_json(diagnosis(causes=[{"cause": cause, "score": 0.9, "evidence": []}], **attrs))
    measures = suggest(d)
    assert measures[0].kind == kind
    assert len({m.kind for m in measures}) == len(measures)


def test_measures_are_filled_in_from_the_diagnosis() -> None:
    d = Diagnosis.from_json(diagnosis(nonfinite=True, nonfinite_at="blocks.3.attn"))
    text = " ".join(m.action for m in suggest(d, earlier_signal="grad_norm"))
    assert "source `web`" in text and "the 2 suspect samples (IDs under root cause)" in text
    assert "web-000017" not in text and "`blocks.3.attn`" in text  # the IDs are listed once, under root cause
    assert "Alert on grad_norm" in text


def test_an_incident_without_series_or_actions_still_has_a_postmortem(store: IncidentStore) -> None:
    inc = store.open_incident("j", diagnosis())
    pm = build_postmortem(store, inc.id)
    assert pm.impact.steps_lost == 0 and pm.impact.recompute_s is None and pm.detection.crossings == []
    assert pm.summary.startswith(f"Incident {inc.id} of job j: high transient loss spike")
    assert pm.to_json()["detection_gap"]["gap_steps"] == 3


def test_replayed_steps_are_plotted_but_not_analysed(store: IncidentStore) -> None:
    pm = build_postmortem(store, full_incident(store))
    assert len(pm.series) == 280 and len(pm.replayed) == 102 and {r["replay"] for r in pm.replayed} == {1}
    assert pm.detection.earlier_signal is not None and pm.detection.earlier_signal.step == 95
