"""Every runtime setting is reachable from job.yaml, `--set` overrides it, `validate` lists every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.config.job import JobSpec, load_job
from supervisor.config.runtime import RuntimeSection, RuntimeSettings, settings_for
from supervisor.errors import ConfigError
from supervisor.traces.rank_traces import RankTraces

VALID = {
    "name": "tiny",
    "entrypoint": "examples.tinylm.train:main",
    "storage": {"path": "runs"},
    "max_steps": 10,
}


def _job_file(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**VALID, **extra}))
    return path


def test_every_runtime_setting_has_a_job_yaml_spelling() -> None:
    """RuntimeSettings = job.yaml `runtime:` + `telemetry.trace` (trace_path) + log_level (also `runtime:`)."""
    in_yaml = set(RuntimeSection.model_fields)
    assert set(RuntimeSettings.model_fields) == in_yaml | {"trace_path"}
    schema = json.dumps(JobSpec.model_json_schema())
    for name in in_yaml:
        assert name in schema
    assert "observe_only" in schema and "no alert, freeze, rollback" in schema


def test_job_yaml_settings_reach_the_runtime(tmp_path: Path) -> None:
    runtime = {
        "directive_timeout_s": 7.5,
        "startup_timeout_s": 30,
        "max_group_restarts": 0,
        "healthy_after_steps": 5,
        "log_level": "debug",
    }
    job = load_job(_job_file(tmp_path, runtime=runtime, telemetry={"trace": "traces/run.jsonl"}))
    settings = settings_for(job)
    assert settings.directive_timeout_s == 7.5 and settings.startup_timeout_s == 30.0
    assert settings.max_group_restarts == 0 and settings.healthy_after_steps == 5
    assert settings.log_level == "debug" and settings.trace_path == "traces/run.jsonl"
    # Travels to the actor as a dict and back.
    assert RuntimeSettings.model_validate(settings.model_dump()) == settings
    default = settings_for(load_job(_job_file(tmp_path)))
    assert default.trace_path is None and default.directive_timeout_s == 120.0


@pytest.mark.parametrize(
    ("runtime", "field", "needle"),
    [
        ({"directive_timeout_s": 0}, "runtime.directive_timeout_s", "must be > 0"),
        ({"max_group_restarts": -1}, "runtime.max_group_restarts", "must be >= 0"),
        ({"startup_timeout_s": 1e308}, "runtime.startup_timeout_s", "must be <="),
        ({"trace_path": "x"}, "runtime.trace_path", "unknown key"),
        ({"log_level": "loud"}, "runtime.log_level", "must be one of"),
    ],
)
def test_bad_runtime_settings_name_the_field(tmp_path: Path, runtime: dict, field: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_job(_job_file(tmp_path, runtime=runtime))
    assert err.value.field == field and needle in err.value.message


def test_trace_is_split_per_rank(tmp_path: Path) -> None:
    traces = RankTraces(str(tmp_path / "t" / "run.jsonl"), world_size=2)
    traces.write(
        [{"step": 1, "rank": 0, "loss": 2.0}, {"step": 1, "rank": 1, "loss": 2.1}, {"control": True}]
    )
    traces.write([{"step": 2, "rank": 1, "loss": 2.0}])
    traces.close()
    rank0 = (tmp_path / "t" / "run.rank0.jsonl").read_text().splitlines()
    rank1 = (tmp_path / "t" / "run.rank1.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in rank0] == [1] and [json.loads(x)["step"] for x in rank1] == [1, 2]
    single = RankTraces(str(tmp_path / "one-{rank}.jsonl"), world_size=1)
    single.write([{"step": 1, "loss": 1.0}])
    single.close()
    assert (tmp_path / "one-0.jsonl").is_file()


def test_ray_address_local_is_accepted(tmp_path: Path) -> None:
    """Reported: `ray.address: local` was rejected by the schema."""
    assert load_job(_job_file(tmp_path, ray={"address": "local"})).ray.address == "local"
    for ok in ("auto", "10.0.0.1:6379", "ray://head:10001"):
        assert load_job(_job_file(tmp_path, ray={"address": ok})).ray.address == ok
    with pytest.raises(ConfigError, match="must be `local`, `auto`"):
        load_job(_job_file(tmp_path, ray={"address": "http://x"}))


def test_set_overrides_on_validate(tmp_path: Path) -> None:
    path = _job_file(tmp_path)
    res = CliRunner().invoke(
        cli,
        [
            "validate",
            str(path),
            "--json",
            "--set",
            "resources.num_workers=3",
            "--set",
            "runtime.max_group_restarts=1",
        ],
    )
    assert res.exit_code == 0 and json.loads(res.output)[0]["ok"], res.output
    assert load_job(path, ["resources.num_workers=3"]).resources.num_workers == 3
    bad = CliRunner().invoke(cli, ["validate", str(path), "--set", "resources.num_workers=0"])
    assert bad.exit_code == 2 and "resources.num_workers: must be >= 1 (got 0)" in bad.output
    for junk, needle in (
        ("nokey", "expected KEY=VALUE"),
        ("name.x=1", "not a mapping"),
        ("a..b=1", "KEY=VALUE"),
    ):
        res = CliRunner().invoke(cli, ["validate", str(path), "--set", junk])
        assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    """Reported: only the first error; `policy: ../../../../etc/passwd`, an unknown fault kind and
    `num_workers: 1e12` passed."""
    path = _job_file(
        tmp_path,
        policy="../../../../../../../../etc/passwd",
        resources={"num_workers": 10**12, "cpus_per_worker": float("inf")},
        faults=[{"kind": "no_such_fault", "step": 3}, {"kind": "lr_spike", "step": -1}],
        checkpoint={"every_steps": 0},
    )
    res = CliRunner().invoke(cli, ["validate", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert all(line.startswith(f"error: {path}: ") for line in lines)
    fields = [line.split(": ")[2] for line in lines]
    assert fields == [
        "resources.num_workers",
        "resources.cpus_per_worker",
        "checkpoint.every_steps",
        "faults.1.step",
        "policy",
        "faults.0.kind",
    ], lines
    assert "outside the allowed folders" in lines[4] and "/etc/passwd" in lines[4]
    assert "valid: " in lines[5]


def test_policy_inside_allowed_folders_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.core.policy.loader import shipped_dir

    shipped = shipped_dir()
    assert shipped is not None
    own = tmp_path / "policies" / "mine.yaml"
    own.parent.mkdir()
    own.write_bytes((shipped / "default.yaml").read_bytes())
    monkeypatch.chdir(tmp_path)
    for policy in ("default", "policies/mine.yaml", str(own)):
        res = CliRunner().invoke(cli, ["validate", str(_job_file(tmp_path, policy=policy))])
        assert res.exit_code == 0, res.output
    elsewhere = tmp_path.parent / f"{tmp_path.name}-other.yaml"
    elsewhere.write_bytes(own.read_bytes())
    try:
        res = CliRunner().invoke(cli, ["validate", str(_job_file(tmp_path, policy=str(elsewhere)))])
        assert res.exit_code == 2 and "outside the allowed folders" in res.output
        monkeypatch.setenv("SUPERVISOR_POLICY_DIRS", str(tmp_path.parent))
        res = CliRunner().invoke(cli, ["validate", str(_job_file(tmp_path, policy=str(elsewhere)))])
        assert res.exit_code == 0, res.output
    finally:
        elsewhere.unlink()
