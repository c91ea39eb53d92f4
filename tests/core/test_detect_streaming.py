"""The streaming analyzer as the runtime uses it: checkpointed state, rollbacks, replays."""

from __future__ import annotations

import json

from supervisor.core.analysis import StreamingAnalyzer, analyze_records, group_steps
from supervisor.core.detect import DetectorSettings
from supervisor.traces.synthetic import at, set_loss, synthetic_records


def _spiky(seed: int = 0):  # type: ignore[no-untyped-def]
    recs = synthetic_records(400, 4, seed=seed)
    for r in at(recs, 330):
        set_loss(r, r.loss * 2)
        r.grad_norm = (r.grad_norm or 1.0) * 10
    return recs


def test_state_dict_round_trip_gives_the_same_result() -> None:
    recs = _spiky(1)
    steps = list(group_steps(recs))
    whole = analyze_records(recs).to_json()
    first = StreamingAnalyzer()
    for step, batch in steps[:200]:
        first.observe_step(step, batch)
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON (it is stored)
    second = StreamingAnalyzer()
    second.load_state_dict(state)
    for step, batch in steps[200:]:
        second.observe_step(step, batch)
    assert second.finish().to_json() == whole


def test_state_dict_mid_incident_round_trip() -> None:
    recs = _spiky(2)
    steps = list(group_steps(recs))
    whole = analyze_records(recs).to_json()
    a = StreamingAnalyzer()
    for step, batch in steps:
        a.observe_step(step, batch)
        if step == 331:
            break
    assert a.open is not None
    b = StreamingAnalyzer()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for step, batch in steps:
        if step > 331:
            b.observe_step(step, batch)
    assert b.finish().to_json() == whole


def test_rollback_accepts_replayed_steps_without_double_counting() -> None:
    recs = synthetic_records(300, 2, seed=3)
    steps = list(group_steps(recs))
    a = StreamingAnalyzer()
    for step, batch in steps:
        a.observe_step(step, batch)
    history_before = a.detector.loss.history
    a.notify_rollback(250)
    assert a.detector.loss.history == history_before - 50
    for step, batch in steps[250:]:
        assert a.observe_step(step, batch) == []
    assert a.finish().incidents == []


def test_rollback_closes_the_open_incident_and_a_replayed_spike_opens_a_new_one() -> None:
    recs = _spiky(4)
    steps = list(group_steps(recs))
    a = StreamingAnalyzer()
    for step, batch in steps[:331]:
        a.observe_step(step, batch)
    assert a.open is not None
    updates = a.notify_rollback(300)
    assert [u.kind for u in updates][-1] == "closed"
    kinds = [u.kind for step, batch in steps[300:] for u in a.observe_step(step, batch)]
    assert kinds.count("opened") == 1


def test_settings_from_job_telemetry() -> None:
    from supervisor.config.job import Telemetry

    s = DetectorSettings.from_telemetry(Telemetry(window=200, min_history=20, z_threshold=5.0))
    assert (s.window, s.min_history, s.z_threshold) == (200, 20, 5.0)


def test_a_trace_written_rank_by_rank_is_read_step_by_step() -> None:
    recs = _spiky(5)
    by_rank = sorted(recs, key=lambda r: (r.rank, r.step))
    assert analyze_records(by_rank).to_json() == analyze_records(recs).to_json()


def test_each_ranks_own_history_survives_a_checkpoint_and_forgets_rolled_back_steps() -> None:
    """The band of each rank's own loss (what tells the rank that rose from the one that fell) is
    stored with the analyzer's state and rewound with a rollback, as every other baseline is."""
    a = StreamingAnalyzer()
    for step, batch in group_steps(synthetic_records(120, 2, seed=4)):
        a.observe_step(step, batch)
    own = a.detector.rank_losses
    assert own[-1][0] == 120 and set(own[-1][1]) == {0, 1}
    b = StreamingAnalyzer()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert list(b.detector.rank_losses) == list(own)
    b.notify_rollback(100)
    assert b.detector.rank_losses[-1][0] == 100
