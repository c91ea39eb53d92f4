"""Scenario files: the shipped ones load and cover every fault; bad ones fail naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.drills.scenario import SCENARIO_DIR, find_scenarios, load_scenario, scenario_paths
from supervisor.drills.specs import FAULT_KINDS
from supervisor.errors import ConfigError

BASE = {
    "name": "b",
    "entrypoint": "examples.tinylm.train:main",
    "storage": {"path": "x"},
    "max_steps": 50,
    "resources": {"num_workers": 2},
}


def _write(tmp_path: Path, name: str, body: dict) -> Path:
    (tmp_path / "_base.yaml").write_text(yaml.safe_dump(BASE))
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(body))
    return p


def test_shipped_scenarios_load_and_cover_every_fault_kind() -> None:
    scenarios = find_scenarios(["all"])
    assert {s.name for s in scenarios} >= {"clean", "garbage_batch", "logging_bug", "mixture_shift"}
    used = {f.kind for s in scenarios for f in s.faults}
    assert used == set(FAULT_KINDS), f"no drill for {set(FAULT_KINDS) - used}"
    for s in scenarios:
        job = s.job_spec(Path("/tmp/x"))
        assert job.resources.num_workers == 2 and job.max_steps <= 300, s.name
        assert job.checkpoint.every_steps <= 50, s.name


def test_no_rollback_for_metric_artifacts_and_benign_shifts() -> None:
    for name in ("logging_bug", "mixture_shift"):
        (s,) = find_scenarios([name])
        assert "rollback" in s.expect.no_actions


def test_reference_twin_has_the_same_training_config_and_no_fault() -> None:
    (s,) = find_scenarios(["garbage_batch"])
    twin = s.without_faults("reference_x")
    assert twin.config_hash() == s.config_hash() and not twin.faults and not twin.job_data["faults"]
    assert twin.expect.incident is False and twin.expect.final_loss_tolerance is None
    (clean,) = find_scenarios(["clean"])
    assert clean.config_hash() == s.config_hash()  # most drills share the clean run as reference


def test_job_overrides_merge_into_the_base(tmp_path: Path) -> None:
    p = _write(tmp_path, "d1", {"name": "d1", "description": "x", "job": {"max_steps": 80, "resources": {"cpus_per_worker": 0.5}},
                                "faults": [{"kind": "garbage_batch", "step": 40}]})  # fmt: skip
    s = load_scenario(p)
    job = s.job_spec(tmp_path / "st")
    assert job.max_steps == 80 and job.resources.num_workers == 2 and job.resources.cpus_per_worker == 0.5
    assert job.name == "drill-d1" and job.storage.path == str(tmp_path / "st")
    assert [f.kind for f in job.faults] == ["garbage_batch"] and s.first_fault_step == 40


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"job": {"max_steps": 0}}, "job.max_steps", "must be >= 1"),
        ({"faults": [{"kind": "gremlins", "step": 3}]}, "faults[0].kind", "unknown fault kind 'gremlins'"),
        ({"faults": [{"kind": "lr_spike", "step": 3, "factor": -1}]}, "faults[0].factor", "must be > 1"),
        ({"expect": {"actions": ["reboot"]}}, "expect.actions", "unknown action 'reboot'"),
        ({"expect": {"phenotype": "wobbly"}}, "expect.phenotype.0", "must be one of"),
        ({"name": "other"}, "name", "must equal the file name 'd2'"),
    ],
)
def test_bad_scenarios_name_file_and_field(tmp_path: Path, body: dict, field: str, message: str) -> None:
    p = _write(tmp_path, "d2", {"name": "d2", "description": "x", **body})
    with pytest.raises(ConfigError) as exc:
        load_scenario(p)
    assert str(exc.value).startswith(f"{p}: {field}: "), str(exc.value)
    assert message in str(exc.value)


def test_unknown_drill_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid: all, .*garbage_batch"):
        find_scenarios(["nope"])
    assert all(not p.name.startswith("_") for p in scenario_paths(SCENARIO_DIR))
