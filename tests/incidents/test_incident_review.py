"""Incident review a person can trust: the timeline in sentences (never memo dicts) at 80 columns
and in the HTML, plots that overlay the abandoned and the new timeline after a rollback with the
observation window and criteria on the new one, per-rank lines for a rank-local incident, suspect
samples only when the data is blamed, excluded samples listed once."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from supervisor.incidents.postmortem import build_postmortem
from supervisor.incidents.render import render_report
from supervisor.incidents.render.plots import panel_figure
from tests.incidents.builders import rollback_incident

DICTISH = re.compile(r"[{}]|\w+=\S|'\w+':|\"\w+\":|memo|payload")


def _db(tmp_path: Path, **kw: object) -> tuple[Path, int]:
    path = tmp_path / "incidents.sqlite"
    with IncidentStore(path) as store:
        return path, rollback_incident(store, **kw)  # type: ignore[arg-type]


def test_show_at_80_columns_reads_as_sentences(tmp_path: Path) -> None:
    path, inc = _db(tmp_path)
    res = CliRunner().invoke(cli, ["incidents", "show", str(inc), "--db", str(path)], terminal_width=80)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = " ".join(" ".join(line.strip("│ ").split()) for line in lines)
    for sentence in (
        "Froze all 2 ranks at step 104.",
        "Rolled back from step 104 to healthy checkpoint 80 (24 steps to train again).",
        "Applied the fix at step 80: re-warm the LR over 50 steps.",
        "Observation of steps 81–130 passed:",
        "Resumed training at step 130 and released `latest`.",
        "Policy rule r (attempt 1) plans: alert → freeze → rollback → apply → observe → resume.",
    ):
        assert sentence in text, (sentence, res.output)
    timeline = res.output.split("Timeline of incident", 1)[1]
    assert not DICTISH.search(timeline), DICTISH.search(timeline)


def test_runtime_shaped_events_never_print_dicts(tmp_path: Path) -> None:
    path, inc = _db(tmp_path, observation_ok=False)
    with IncidentStore(path) as store:
        store.record(inc, "worker_restarted", actor="supervisor", step=90,
                     payload={"reason": "rank 1 died (ActorDiedError)", "decision": "restart", "rank": 1,
                              "from_generation": 0})  # fmt: skip
        store.record(inc, "supervisor_resumed", actor="supervisor", step=95,
                     payload={"pending_actions": ["i7-p1-observe"], "workers_found": True})  # fmt: skip
        store.record(inc, "note", actor="supervisor", step=96, payload={"downtime_s": 3.25, "why": "frozen"})
        pm = build_postmortem(store, inc)
    texts = {ev.kind.value: text for ev, text in pm.timeline}
    assert texts["worker_restarted"] == (
        "Restarted the worker group (generation 0 → 1): rank 1 died (ActorDiedError)."
    )
    assert texts["supervisor_resumed"] == (
        "A new supervisor took over, finishing i7-p1-observe; its workers were still running."
    )
    assert texts["observation"].startswith("Observation of steps 81–130 failed: finite ok")
    assert "loss FAILED: window median 3.4 vs limit 2.939" in texts["observation"]
    assert "Training stood still for 3.2 s" in " ".join(texts.values()) or "3.3 s" in " ".join(texts.values())
    for _, text in pm.timeline:
        assert not DICTISH.search(text), text


def test_html_timeline_is_sentences_and_suspects_follow_the_cause(tmp_path: Path) -> None:
    path, optimizer = _db(tmp_path)
    with IncidentStore(path) as store:
        data = rollback_incident(store, job="other", rank_local=True, top_cause="data")
        html_opt = render_report(store, optimizer, "html")
        html_data = render_report(store, data, "html")
        md_data = render_report(store, data, "md")
    timeline = html_opt.split("<h2>Timeline</h2>", 1)[1].split("</table>", 1)[0]
    assert "Froze all 2 ranks at step 104." in timeline and not DICTISH.search(
        re.sub(r"<[^>]+>", " ", timeline)
    )
    assert "web-000017" not in html_opt  # an optimizer incident: its batch is not the story
    assert "Suspect samples" not in html_opt
    assert "excluded 2 samples" in html_data  # the timeline counts them, the root cause names them
    for doc in (html_data, md_data):  # a data incident: suspects named once, the exclusion refers to them
        assert doc.count("web-000017") == 1
        assert "the 2 suspect samples (IDs under root cause)" in doc


def _labels(fig: plt.Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_plots_overlay_the_new_timeline_with_the_window_and_criteria_on_it(tmp_path: Path) -> None:
    path, inc = _db(tmp_path)
    with IncidentStore(path) as store:
        pm = build_postmortem(store, inc)
    fig = panel_figure(pm, "loss", "Loss", False)
    assert fig is not None
    try:
        labels = _labels(fig)
        assert "all ranks" in labels and "abandoned timeline" in labels
        assert "new timeline (after the rollback)" in labels
        assert "observation window (new timeline)" in labels
        assert "loss limit (baseline median + MADs): passed" in labels
        ax = fig.axes[0]
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        new_steps = list(lines["new timeline (after the rollback)"].get_xdata())
        abandoned = list(lines["abandoned timeline"].get_xdata())
        assert new_steps[0] == 81 and new_steps[-1] == 130
        assert abandoned[0] == 80 and max(abandoned) == 107  # past the target, up to the freeze
        window = next(p for p in ax.patches if p.get_label() == "observation window (new timeline)")
        x0, x1 = window.get_x(), window.get_x() + window.get_width()  # type: ignore[attr-defined]
        assert (x0, x1) == (81, 130)
        limit = next(c for c in ax.collections if "loss limit" in str(c.get_label()))
        (segment,) = limit.get_segments()  # type: ignore[attr-defined]
        assert [p[0] for p in segment] == [81, 130] and segment[0][1] == pytest.approx(
            2.85 + 3 * 1.4826 * 0.02
        )
    finally:
        plt.close(fig)
    gfig = panel_figure(pm, "grad_norm", "Grad norm", True)
    assert gfig is not None
    try:
        assert "grad norm limit (2x baseline): passed" in _labels(gfig)
    finally:
        plt.close(gfig)


def test_a_rank_local_incident_is_drawn_rank_by_rank(tmp_path: Path) -> None:
    path, _ = _db(tmp_path)
    with IncidentStore(path) as store:
        local = build_postmortem(
            store, rollback_incident(store, job="other", rank_local=True, top_cause="data")
        )
        everywhere = build_postmortem(store, 1)
    fig, other = panel_figure(local, "loss", "Loss", False), panel_figure(everywhere, "loss", "Loss", False)
    assert fig is not None and other is not None
    try:
        labels = _labels(fig)
        assert "rank 0" in labels and "rank 1 (first)" in labels and "all ranks" not in labels
        first = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "rank 1 (first)")
        ys = dict(zip(first.get_xdata(), first.get_ydata(), strict=True))
        assert max(ys.values()) < 4  # up to the rollback target: the spike is on the abandoned part
        assert "rank 1 (first)" not in _labels(other) and "all ranks" in _labels(other)
    finally:
        plt.close(fig)
        plt.close(other)
