"""Hand-damaged rows of an incident database: one line naming the file and the row, exit 2 (issue 29, 8)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from tests.incidents.builders import full_incident

DEEP = "[" * 100_000 + "]" * 100_000
DAMAGE = {
    "payload-malformed": ("UPDATE events SET payload = '{\"a\": ' WHERE id = 2", "events id 2"),
    "payload-deep": (f"UPDATE events SET payload = '{DEEP}' WHERE id = 2", "events id 2"),
    "result-malformed": ("UPDATE events SET result = 'nope' WHERE id = 2", "events id 2"),
    "kind-unknown": ("UPDATE events SET kind = 'exploded' WHERE id = 2", "events id 2"),
    "diagnosis-malformed": ("UPDATE incidents SET diagnosis = '{oops' WHERE id = 1", "incidents id 1"),
    "diagnosis-list": ("UPDATE incidents SET diagnosis = '[1, 2]' WHERE id = 1", "incidents id 1"),
    "state-unknown": ("UPDATE incidents SET state = 'on fire' WHERE id = 1", "incidents id 1"),
    "series-malformed": ("UPDATE series SET data = '{' WHERE step = 100", "series step 100"),
    "series-deep": (f"UPDATE series SET data = '{DEEP}' WHERE step = 100", "series step 100"),
    "meta-malformed": ("UPDATE artifacts SET meta = 'x'", "artifacts id"),
}


@pytest.fixture
def damaged_db(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str]:
    path = tmp_path / "incidents.sqlite"
    with IncidentStore(path) as store:
        full_incident(store)
        store.add_artifact(1, "snapshot", "s3://b/x", {"step": 100})
    sql, where = DAMAGE[request.param]
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    return path, where


@pytest.mark.parametrize("damaged_db", sorted(DAMAGE), indirect=True)
@pytest.mark.parametrize("command", [["show", "1"], ["report", "1", "--format", "json"], ["list"]])
def test_a_damaged_row_is_one_line(damaged_db: tuple[Path, str], command: list[str]) -> None:
    path, where = damaged_db
    result = CliRunner().invoke(cli, ["--log-level", "error", "incidents", *command, "--db", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 0:  # `list` reads only what it shows; a diagnosis that is no longer one is dropped
        assert command == ["list"] or "series" in where or "artifacts" in where or where == "incidents id 1"
        return
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert str(path) in errors[0] and where in errors[0]


def test_a_series_row_without_a_step_keeps_its_step(tmp_path: Path) -> None:
    """Reported: a series row whose JSON has no ``step`` was a KeyError traceback in reports."""
    path = tmp_path / "incidents.sqlite"
    with IncidentStore(path) as store:
        inc = full_incident(store)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE series SET data = json_remove(data, '$.step', '$.rank')")
    conn.commit()
    conn.close()
    with IncidentStore(path, read_only=True) as store:
        rows = store.series(inc)
        assert rows and all(isinstance(r["step"], int) for r in rows)
        assert any("rank" in r for r in rows)
    result = CliRunner().invoke(cli, ["incidents", "report", str(inc), "--db", str(path), "--format", "md"])
    assert result.exit_code == 0, result.output


def test_an_html_report_of_1e308_values_has_its_plots(tmp_path: Path) -> None:
    """Reported (issue 29): plots of a series holding +-1e308 raised LinAlgError (singular matrix)."""
    from tests.incidents.builders import telemetry

    path = tmp_path / "incidents.sqlite"
    with IncidentStore(path) as store:
        inc = full_incident(store)
        rows = telemetry()
        for r in rows:
            for key in ("loss", "grad_norm", "update_norm", "param_norm"):
                r[key] = 1e308 if r["step"] % 2 else -1e308
        store.attach_series(inc, rows)
    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        cli, ["incidents", "report", str(inc), "--db", str(path), "--format", "html", "-o", str(out)]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0 and "<img" in out.read_text()


def test_series_records_without_a_usable_step_are_dropped(tmp_path: Path) -> None:
    """Reported (issue 29): a series row without a step (or with 1e400, 2**70) was a traceback."""
    from tests.incidents.builders import diagnosis

    with IncidentStore(tmp_path / "incidents.sqlite") as store:
        inc = store.open_incident("j", diagnosis())
        hostile = [{"loss": 1.0}, {"step": "x", "loss": 2.0}, {"step": 1e400, "loss": 1.0}, {"step": 2**70, "loss": 1.0},
                   {"step": 5, "rank": 1e400, "loss": 1.0}, {"step": 6.0, "rank": 1, "loss": 2**1100}]  # fmt: skip
        assert store.attach_series(inc.id, hostile) == 2
        assert store.series(inc.id) == [{"step": 5, "loss": 1.0}, {"step": 6, "rank": 1}]
