"""The TensorBoard sink writes real event files: one run per timeline, steps never go back within
a run, incidents marked as text; read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.config.observability import ObservabilitySettings
from supervisor.incidents import IncidentStore
from supervisor.observability.hub import Observability
from tests.incidents.builders import diagnosis
from tests.observability.test_metrics import _aggregate, _records

pytest.importorskip("tensorboard")


def _read(run: Path) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = []
    for tag in acc.Tags()["tensors"]:
        for e in acc.Tensors(tag):
            texts.append((e.step, b"".join(e.tensor_proto.string_val).decode()))
    return scalars, texts


@pytest.mark.slow
def test_tensorboard_runs_per_timeline_with_incident_markers(tmp_path: Path) -> None:
    settings = ObservabilitySettings.model_validate({"tensorboard": {"logdir": str(tmp_path / "tb")}})
    with IncidentStore(tmp_path / "incidents.sqlite") as store:
        obs = Observability(SimpleNamespace(name="tinylm"), store, None, settings)
        for step in range(1, 31):
            if step == 25:
                store.open_incident("tinylm", diagnosis(onset_step=24, detected_step=25), key=1)
                obs._refreshed = 0.0
            recs = _records(step, spike_rank=1 if step >= 24 else None)
            obs.on_step(step, recs, _aggregate(recs))
        for step in range(11, 21):  # rolled back to 10
            if step == 20:
                store.transition(1, "resolved", "observation passed", actor="supervisor")
                obs._refreshed = 0.0
            recs = _records(step)
            obs.on_step(step, recs, _aggregate(recs))
        obs.close()

    runs = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert runs == ["timeline-0", "timeline-1"]
    first, first_text = _read(tmp_path / "tb" / "timeline-0")
    second, second_text = _read(tmp_path / "tb" / "timeline-1")
    assert [s for s, _ in first["loss"]] == list(range(1, 31))
    assert [s for s, _ in second["loss"]] == list(range(11, 21))  # the new timeline, its own run
    assert {"loss/rank_0", "loss/rank_1", "grad_norm", "tokens_per_s", "incidents/open"} <= set(first)
    assert dict(first["incidents/open"])[30] == 1 and dict(first["incidents/open"])[24] == 0
    assert dict(second["incidents/open"])[20] == 0
    assert any(
        s == 25 and "incident #1: transient spike" in t and "onset step 24" in t for s, t in first_text
    )
    assert (10, "rolled back: training continues from step 10") in second_text
    assert any(s == 20 and t == "incident #1 resolved" for s, t in second_text)
