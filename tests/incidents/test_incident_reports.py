"""Reports (Markdown, JSON, HTML) and the `supervisor incidents` commands, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.errors import IncidentStoreError
from supervisor.incidents import IncidentStore
from supervisor.incidents.render import render_report
from tests.incidents.builders import diagnosis, full_incident


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "store" / "incidents.sqlite"
    store = IncidentStore(path)
    incident_id = full_incident(store)
    other = store.open_incident("other-job", diagnosis(phenotype="divergence"))
    store.begin(other.id, "rolled_back", actor="runtime", step=103, payload={"to_step": 80})
    store.close()
    return path, incident_id


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_markdown_has_every_section_of_the_postmortem(db: tuple[Path, int]) -> None:
    md = render_report(IncidentStore(db[0]), db[1], "md")
    for heading in (
        "## Timeline",
        "## Root cause and evidence",
        "## Impact",
        "## Detection gap",
        "## Permanent measures",
    ):
        assert heading in md
    assert (
        "| 103 | Rolled back from step 103 to verified checkpoint 80 (step_00000080; 23 steps to train again). |"
        in md
    )
    assert "**Steps lost:** 23 (rollback 103 → 80)" in md
    assert "**Signal that would have caught it earlier:** grad_norm" in md


def test_json_report_is_strict_json_with_the_analysis(db: tuple[Path, int]) -> None:
    doc = json.loads(render_report(IncidentStore(db[0]), db[1], "json"), parse_constant=pytest.fail)
    assert doc["incident"]["state"] == "resolved" and doc["root_cause"]["top_cause"] == "data"
    assert (
        doc["impact"]["steps_lost"] == 23 and doc["detection_gap"]["earlier_signal"]["signal"] == "grad_norm"
    )
    assert [m["kind"] for m in doc["measures"]][0] == "data_rule"
    assert doc["markers"]["observation"] == [80, 130]


def test_html_is_self_contained_with_one_plot_per_panel(db: tuple[Path, int]) -> None:
    html = render_report(IncidentStore(db[0]), db[1], "html")
    assert html.count('<img class="plot"') == 4 and html.count("data:image/png;base64,") == 4
    assert "http://" not in html and "https://" not in html and "<link" not in html


def test_unknown_format_lists_the_valid_ones(db: tuple[Path, int]) -> None:
    with pytest.raises(IncidentStoreError, match="unknown report format 'pdf'; valid: md, html, json"):
        render_report(IncidentStore(db[0]), db[1], "pdf")


def test_cli_list_filters_and_prints_json(db: tuple[Path, int]) -> None:
    code, out = _run("incidents", "list", "--db", str(db[0]), "--json")
    assert code == 0 and [i["job"] for i in json.loads(out)] == ["other-job", "tinylm"]
    code, out = _run("incidents", "list", "--db", str(db[0]), "--state", "resolved", "--json")
    assert [i["id"] for i in json.loads(out)] == [db[1]]
    code, out = _run("incidents", "list", "--db", str(db[0]), "--job-name", "other-job")
    assert code == 0 and "other-job" in out and "tinylm" not in out


def test_cli_finds_the_database_through_job_yaml(db: tuple[Path, int], tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: tinylm\nentrypoint: examples.tinylm.train:main\nmax_steps: 10\nstorage:\n  path: {db[0].parent}\n"
    )
    code, out = _run("incidents", "list", "--job", str(job), "--json")
    assert code == 0 and [i["job"] for i in json.loads(out)] == ["tinylm"]


def test_cli_show_marks_pending_actions(db: tuple[Path, int]) -> None:
    code, out = _run("incidents", "show", "2", "--db", str(db[0]))
    assert code == 0 and "Rolling back from step 103 to checkpoint 80." in " ".join(out.split())
    code, out = _run("incidents", "show", "2", "--db", str(db[0]), "--json")
    assert json.loads(out)["timeline"][-1]["status"] == "pending"


def test_cli_report_writes_each_format(db: tuple[Path, int], tmp_path: Path) -> None:
    for fmt in ("md", "html", "json", "text"):
        target = tmp_path / f"report.{fmt}"
        code, _ = _run(
            "incidents", "report", str(db[1]), "--db", str(db[0]), "--format", fmt, "-o", str(target)
        )
        assert code == 0 and target.stat().st_size > 500
    assert "Permanent measures" in (tmp_path / "report.text").read_text()


def test_cli_errors_are_one_line_with_exit_code_2(db: tuple[Path, int], tmp_path: Path) -> None:
    code, out = _run("incidents", "show", "42", "--db", str(db[0]))
    assert code == 2 and out.strip() == f"error: {db[0]}: no incident 42"
    code, out = _run("incidents", "list", "--db", str(tmp_path / "missing.sqlite"))
    assert code == 2 and "no incident database here" in out and not (tmp_path / "missing.sqlite").exists()
    code, out = _run("incidents", "list")
    assert code == 2 and "pass --db PATH or --job job.yaml" in out
