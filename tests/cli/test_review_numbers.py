"""The numbers and values the review commands print, each checked against an independent
computation: nothing cut when stdout is not a terminal, steps lost per rollback and summed,
incident counts, excluded ranges named in one unit everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from tests.incidents.builders import diagnosis, rollback_incident


def test_incidents_list_piped_prints_every_cell_whole(tmp_path: Path) -> None:
    db = tmp_path / "incidents.sqlite"
    with IncidentStore(db) as store:
        ids = [rollback_incident(store, job=f"a-rather-long-job-name-{i}-pretraining-7b") for i in range(2)]
        expected = [inc.to_json() for inc in store.list_incidents()]
    res = CliRunner().invoke(cli, ["incidents", "list", "--db", str(db)])  # stdout is not a terminal
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    for row in expected:  # the same values `--json` gives, each whole on the incident's line
        line = next(ln for ln in res.output.splitlines() if f" {row['id']} " in f" {ln.strip('│ ')} ")
        for key in ("job", "state", "phenotype", "severity", "top_cause"):
            assert str(row[key]) in line, (key, line)
    assert sorted(r["id"] for r in expected) == sorted(ids)
    res_json = CliRunner().invoke(cli, ["incidents", "list", "--db", str(db), "--json"])
    assert [r["state"] for r in json.loads(res_json.output)] == [r["state"] for r in expected]


def test_two_rollbacks_are_named_and_summed(tmp_path: Path) -> None:
    from supervisor.incidents.postmortem import build_postmortem
    from supervisor.incidents.render.text import impact_lines

    db = tmp_path / "incidents.sqlite"
    with IncidentStore(db) as store:
        inc = store.open_incident("j", diagnosis(), key=1).id
        rollbacks = [(300, 257), (343, 300)]
        for src, dst in rollbacks:
            ev = store.begin(inc, "rolled_back", actor="runtime", step=src, payload={"params": {}})
            store.finish(ev.id, result={"from_step": src, "to_step": dst})
        pm = build_postmortem(store, inc)
    total = sum(src - dst for src, dst in rollbacks)  # independent: 43 + 43
    line = dict(impact_lines(pm))
    label = next(k for k in line if k.startswith("Steps lost"))
    text = line[label]
    assert str(total) in text and "2 rollbacks" in text
    for src, dst in rollbacks:
        assert f"{src} → {dst} ({src - dst})" in text, text
    assert f"Steps lost: {total} in total over 2 rollbacks: 300 → 257 (43), 343 → 300 (43)." in pm.summary


@pytest.mark.slow
def test_the_live_count_of_incidents_is_the_number_of_incidents(tmp_path: Path) -> None:
    """A fault that comes back reopens its incident (a second detector key, the same incident):
    the live display's "N so far" counts incidents, as `incidents list` does."""
    from supervisor.cli.display import render_table
    from supervisor.runtime.controller import Controller
    from tests.runtime.conftest import FAST, make_job
    from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

    policy = str(Path(__file__).parents[1] / "runtime" / "policies" / "reopen.yaml")
    job = make_job(tmp_path, "back", max_steps=260, policy=policy, resources={"num_workers": 1})
    ranks = FakeRanks(1, 260, spikes_once(130, 170), grads_follow_loss=True)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    store = ctl.incidents

    def reopened() -> bool:
        found = store.list_incidents(job="back")
        return bool(found) and found[0].onset_step == 170 and not found[0].state.is_active

    ranks.run(ctl, reopened, checkpoint_every=25)
    ranks.run(ctl, lambda: ctl.status()["incident"] is None, checkpoint_every=25)
    listed = len(store.list_incidents(job="back"))  # independent: what the database holds
    assert listed == 1
    st = ctl.status()
    assert st["incidents_total"] == listed
    text = " ".join(str(c) for c in render_table(st).columns[1]._cells)
    assert f"({listed} so far)" in text


def test_the_excluded_range_reads_the_same_in_the_launch_summary_and_the_timeline(tmp_path: Path) -> None:
    """The policy asks for the batches of steps 130-131; the runtime applies them as batch indices
    (the loader's count, here one behind the step). Both places name the steps, in those words."""
    import io

    from rich.console import Console

    from supervisor.cli.outcome import print_outcome
    from supervisor.config.job import JobSpec
    from supervisor.incidents.postmortem import build_postmortem
    from tests.incidents.builders import _act

    db = tmp_path / "incidents.sqlite"
    steps, indices = [130, 131], [[129, 130]]
    with IncidentStore(db) as store:
        inc = store.open_incident("j", diagnosis(onset_step=130), key=1).id
        _act(store, inc, "fix_applied", "apply", 132, {"exclude": {"samples": "suspects", "batch_range": steps}},
             {"directive": {"id": "a"}},
             {"overrides": {"kind": "apply", "exclusions": {"samples": ["web-000017"], "sources": [],
                                                            "batch_ranges": indices}}, "acked_at_step": 132})  # fmt: skip
        timeline = " ".join(t for _, t in build_postmortem(store, inc).timeline)
        job = JobSpec.model_validate({"name": "j", "entrypoint": "examples.tinylm.train:main", "max_steps": 200,
                                      "storage": {"path": str(tmp_path / "s")}})  # fmt: skip
        buf = io.StringIO()
        print_outcome(job, store, {"phase": "finished", "step": 200, "max_steps": 200}, 0.0,
                      Console(file=buf, width=300, no_color=True))  # fmt: skip
    launch = buf.getvalue()
    expected = f"batches of steps {steps[0]}–{steps[1]}"
    assert expected in timeline, timeline
    assert expected in launch, launch
    assert f"batches {indices[0][0]}–{indices[0][1]}" not in timeline  # never the indices as if steps
