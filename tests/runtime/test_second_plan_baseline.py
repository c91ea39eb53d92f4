"""A later plan of an incident judges its observation window against the run before the incident,
as the first plan did, not against the re-run the first plan's fix trained.

On the real controller with fake workers (tests/runtime/harness.py), one rank: the loss spikes at
130; the first plan rolls back to 100, clips, and observes 101-150. Every re-run of a step trains
at 3x the grad norm its first run had (a fix that does not cure): the window fails on its grad
norm and a second plan of the same onset rolls back to 100 again. By then the history has been
cut back at 100 and steps 101-129 are the first re-run's: a baseline taken from it holds the
failure the first window found, and the second window, as high, would pass against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.incidents import Artifact, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.incidents import PreOnset, kept_pre_onset
from supervisor.runtime.observe import Baseline, StepStats
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

REOPEN = str(Path(__file__).parent / "policies" / "reopen.yaml")
ONSET = 130


class ReRunHigher(FakeRanks):
    """Ranks whose every re-run of a step has 3x the grad norm the step's first run had, at a
    lower LR (as under a re-warm)."""

    seen: set[tuple[int, int]]

    def record(self, step: int, rank: int, events: list[str] | None = None) -> dict[str, Any]:
        rec = super().record(step, rank, events)
        if (step, rank) in self.seen:
            rec["grad_norm"] *= 3.0
            rec["lr"] *= 0.5
        self.seen.add((step, rank))
        return rec


def setup(tmp_path: Path) -> tuple[Any, ReRunHigher, FakeWorkers, Controller]:
    job = make_job(tmp_path, "again", max_steps=300, policy=REOPEN, resources={"num_workers": 1})
    ranks = ReRunHigher(1, 300, spikes_once(ONSET), grads_follow_loss=True)
    ranks.seen = set()
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    return job, ranks, workers, ctl


def plans(ctl: Controller) -> list[dict[str, Any]]:
    """Incident 1's plan artifacts, oldest first (none before it opens)."""
    if not ctl.incidents.list_incidents():
        return []
    return [a.meta for a in ctl.incidents.artifacts(1) if a.kind == "plan"]


def plans_made(ctl: Controller, n: int) -> Callable[[], bool]:
    return lambda: len(plans(ctl)) >= n


def observing(ctl: Controller) -> bool:
    incs = ctl.incidents.list_incidents()
    return bool(incs) and incs[0].state is IncidentState.OBSERVING


def grad_norm_bound(meta: dict[str, Any]) -> float:
    """The grad norm a plan's window is judged against (its reference, as ``plan_baseline`` set it)."""
    g = Baseline.from_json(meta["baseline"]).grad_norm
    assert g is not None
    return g


def test_a_fix_that_does_not_cure_fails_its_second_window_too(tmp_path: Path) -> None:
    _, ranks, _, ctl = setup(tmp_path)
    ranks.run(ctl, plans_made(ctl, 2), checkpoint_every=25)
    first, second = plans(ctl)
    assert [a["name"] for a in second["plan"]["actions"]][-2:] == ["observe", "resume"]
    rerun = [h.grad_norm for h in ctl.history if 100 < h.step < ONSET]
    assert rerun and min(g for g in rerun if g is not None) > 2.0  # the history holds the first re-run
    assert second["baseline"] == first["baseline"], (first["baseline"], second["baseline"])
    assert second["grad_norm_reference"] == first["grad_norm_reference"]  # the same window, 101-150
    assert grad_norm_bound(second) == pytest.approx(1.0, abs=0.1)  # the run before the incident
    kept = first["pre_onset"]  # what the first plan took from the run before the onset
    assert kept["onset"] == ONSET and [s for s, _ in kept["grad_norms"]] == list(range(1, ONSET))
    assert first["baseline_from"] == second["baseline_from"] == "plan-1" and "pre_onset" not in second
    # The grad norm the policy plans with (a clip where the job has none) is the same run's too.
    assert second["job_state"]["grad_norm"] == first["job_state"]["grad_norm"] == pytest.approx(1.0, abs=0.1)
    # And the LR its fix is written against: the run's before the onset, not the re-run's 5e-4.
    assert (second["job_state"]["lr"], first["job_state"]["lr"], kept.get("lr")) == (1e-3, 1e-3, 1e-3)
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    inc = ctl.incidents.get(1)
    assert inc.state is IncidentState.ESCALATED, ctl.status()  # two windows failed on the grad norm
    assert len(plans(ctl)) == 3 and "max_observation_failures=2" in plans(ctl)[-1]["plan"]["escalate_reason"]


def test_a_supervisor_restarted_between_the_plans_still_reuses_the_first_baseline(tmp_path: Path) -> None:
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: observing(ctl), checkpoint_every=25)
    assert len(plans(ctl)) == 1
    again = Controller(job, FAST, attach=True, workers=workers)  # the kill: nothing else is written
    again.boot()
    ranks.resend(again)
    ranks.run(again, plans_made(again, 2), checkpoint_every=25)
    first, second = plans(again)
    assert second["baseline"] == first["baseline"], (first["baseline"], second["baseline"])
    assert grad_norm_bound(second) == pytest.approx(1.0, abs=0.1)


def test_a_first_plan_stored_without_its_pre_onset_steps_falls_back_to_the_history(tmp_path: Path) -> None:
    """An incident whose first plan an older supervisor stored (no ``pre_onset``, no
    ``baseline_from``): the second plan takes its baseline from the history as it stands, as before,
    keeps what it took, and the incident goes on."""
    _, ranks, _, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: observing(ctl), checkpoint_every=25)
    [art] = [a for a in ctl.incidents.artifacts(1) if a.kind == "plan"]
    old = {k: v for k, v in art.meta.items() if k not in ("pre_onset", "baseline_from")}
    with ctl.incidents.transaction() as conn:
        conn.execute("UPDATE artifacts SET meta = ? WHERE id = ?", (json.dumps(old), art.id))
    ranks.run(ctl, plans_made(ctl, 2), checkpoint_every=25)
    first, second = plans(ctl)
    assert "pre_onset" not in first
    assert grad_norm_bound(second) == pytest.approx(3.0, abs=0.3)  # the first re-run's grad norm
    assert second["baseline_from"] == "plan-2" and second["pre_onset"]["onset"] == ONSET  # for a third plan
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    assert ctl.incidents.get(1).state is IncidentState.RESOLVED  # judged against the re-run, it passed


def plan_artifact(n: int, pre: PreOnset | None) -> Artifact:
    meta: dict[str, Any] = {"plan": {}, "baseline": None}
    if pre is not None:
        meta["pre_onset"] = json.loads(json.dumps(pre.to_json()))  # as the store gives it back
    return Artifact(n, 1, "plan", f"plan-{n}", meta, 0.0)


def pre_onset(onset: int, grad_norm: float) -> PreOnset:
    return PreOnset.of([StepStats(s, 3.0, grad_norm=grad_norm) for s in range(1, onset + 20)], onset)


def test_the_earliest_plan_kept_for_the_same_onset_is_reused() -> None:
    first, reopened = pre_onset(ONSET, 1.0), pre_onset(170, 2.0)
    arts = [plan_artifact(1, first), Artifact(2, 1, "snapshot", "s", {"pre_onset": {}}, 0.0),
            plan_artifact(3, None), plan_artifact(4, reopened), plan_artifact(5, pre_onset(170, 9.0))]  # fmt: skip
    assert kept_pre_onset(arts, ONSET) == (first, "plan-1")
    assert kept_pre_onset(arts, 170) == (reopened, "plan-4")  # a reopened incident's own onset
    assert kept_pre_onset(arts, 150) is None  # a diagnosis dated elsewhere: taken from the history
    assert kept_pre_onset([plan_artifact(1, None)], ONSET) is None  # stored by an older supervisor
    assert len(first.grad_norms) == ONSET - 1 and first.baseline is not None
    assert len(pre_onset(400, 1.0).grad_norms) == 200  # the last BASELINE_STEPS before the onset
