"""The real controller feeds observability (tests/runtime/harness.py: real controller, detector,
policy engine, incident and checkpoint stores; fake workers): after a NaN, a rollback and an
observation window, the incident holds per-rank rows and the new timeline, the report draws it,
and the metrics count the actions."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from supervisor.checkpoint.training_state import save_training_state
from supervisor.incidents import IncidentState
from supervisor.incidents.postmortem import build_postmortem
from supervisor.incidents.render.plots import panel_figure
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm

LEAN = str(Path(__file__).parents[1] / "runtime" / "policies" / "lean.yaml")


@pytest.mark.slow
def test_rollback_incident_leaves_both_timelines_and_counts_in_the_metrics(tmp_path: Path) -> None:
    fired: list[int] = []

    def nan_once(step: int, rank: int) -> float:
        if step == 81 and not fired:
            fired.append(step)
            return math.nan
        return calm(step, rank)

    job = make_job(tmp_path, "wired", max_steps=400, policy=LEAN, resources={"num_workers": 1})
    ranks = FakeRanks(1, 400, nan_once)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    model = torch.nn.Linear(4, 4)
    for step in (20, 40, 60):  # the file first, then the record that announces it
        save_training_state(ctl.checkpoints, step, rank=0, world_size=1, model=model,
                            optimizer=torch.optim.AdamW(model.parameters()))  # fmt: skip
        ranks.train(ctl, 20, checkpoint_every=20)
    ranks.run(ctl, lambda: any(i.state.is_terminal for i in ctl.incidents.list_incidents(job="wired")))
    (inc,) = ctl.incidents.list_incidents(job="wired")
    assert inc.state is IncidentState.RESOLVED

    rows = ctl.incidents.series(inc.id, replay=None)
    again = [r for r in rows if r.get("replay") == 1]
    first = [r for r in rows if not r.get("replay")]
    assert {r["step"] for r in first if r.get("rank") == 0} >= set(range(60, 82))  # per-rank, from the ring
    assert min(r["step"] for r in again) == 41 and max(r["step"] for r in again) >= 101  # new timeline
    pm = build_postmortem(ctl.incidents, inc.id)
    fig = panel_figure(pm, "loss", "Loss", False)
    assert fig is not None
    try:
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert "new timeline (after the rollback)" in labels and "observation window (new timeline)" in labels
        assert any(label.startswith("loss limit") for label in labels)
    finally:
        plt.close(fig)
    texts = [t for _, t in pm.timeline]
    assert "Froze the single rank at step 82." in texts
    assert any(t.startswith("Rolled back from step 82 to healthy checkpoint 40") for t in texts), texts

    ctl.observability._refreshed = 0.0
    ranks.train(ctl, 1)
    text = ctl.observability.metrics.render().decode()
    assert 'spike_supervisor_actions_total{action="rollback",status="done",training_job="wired"} 1.0' in text
    assert "spike_supervisor_incidents{phenotype=" in text and 'state="resolved"' in text
