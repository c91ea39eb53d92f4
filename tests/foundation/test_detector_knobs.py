"""One definition of each detector setting (docs/architecture.md, "One definition of each setting")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.config.detector import DetectorKnobs
from supervisor.config.job import Telemetry
from supervisor.core.detect import DetectorSettings

PKG = Path(__file__).resolve().parents[2] / "supervisor"
VALID = {
    "name": "tiny",
    "entrypoint": "examples.tinylm.train:main",
    "storage": {"path": "runs"},
    "max_steps": 100,
    "resources": {"num_workers": 2, "cpus_per_worker": 1},
}


def _declared(path: Path, cls: str) -> set[str]:
    """The field names a class body declares itself (annotated assignments)."""
    tree = ast.parse(path.read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_job_yaml_and_detector_hold_the_same_bounds() -> None:
    knobs = set(DetectorKnobs.model_fields)
    assert {"window", "min_history", "z_threshold"} <= knobs
    assert not knobs & _declared(PKG / "config" / "job.py", "Telemetry")
    assert not knobs & _declared(PKG / "core" / "detect.py", "DetectorSettings")
    for name in knobs:
        assert Telemetry.model_fields[name].metadata == DetectorSettings.model_fields[name].metadata, name
        assert Telemetry.model_fields[name].default == DetectorSettings.model_fields[name].default, name


def test_a_bound_is_the_same_online_and_offline() -> None:
    # min_history 1 was refused in job.yaml (ge=4) but taken by the detector (ge=1): one bound now.
    with pytest.raises(ValueError, match="min_history"):
        DetectorSettings(min_history=1)
    assert DetectorSettings.from_telemetry(Telemetry(min_history=2, window=8)).min_history == 2


@pytest.mark.parametrize(("field", "value", "words"), [("min_history", 1, "must be >= 2 (got 1)"),
                                                       ("z_threshold", 0, "must be > 0.0 (got 0)")])  # fmt: skip
def test_a_bad_knob_in_job_yaml_is_one_line_and_exit_2(
    tmp_path: Path, field: str, value: int, words: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(dict(VALID, telemetry={field: value})))
    res = CliRunner().invoke(cli, ["validate", str(path)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {path}: telemetry.{field}: {words}"
