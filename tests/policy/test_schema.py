"""Policy files: shipped ones validate; malformed ones fail with one line naming file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.core.policy import action_names, get_action, load_policy, policy_schema, shipped_policies
from supervisor.errors import PolicyError

from .conftest import one_rule, write_policy


def test_shipped_policies_load() -> None:
    assert {"default", "conservative", "skip-and-restart"} <= set(shipped_policies())
    for name in shipped_policies():
        assert load_policy(name).name == name


def test_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(PolicyError, match=r"shipped: .*conservative, default, skip-and-restart"):
        load_policy("defualt")


def test_registry_lookup_names_the_valid_actions() -> None:
    assert get_action("rollback").name == "rollback"
    with pytest.raises(PolicyError, match=r"unknown action 'rolback' \(valid: alert, apply, block_latest"):
        get_action("rolback")


@pytest.mark.parametrize(
    ("actions", "field", "message"),
    [
        (
            ["freeze", "rolback"],
            "rules.0.actions.1",
            "unknown action 'rolback' (valid: " + ", ".join(action_names()),
        ),
        (
            [{"rollback": {"margin_steps": -1}}],
            "rules.0.actions.0",
            "rollback.margin_steps: must be >= 0 (got -1)",
        ),
        (
            [{"rollback": {"margn_steps": 1}}],
            "rules.0.actions.0",
            "rollback.margn_steps: unknown key (valid: margin_steps",
        ),
        ([{"observe": {"steps": 20}}], "rules.0.actions.0", "observe.steps: must be >= 50 (got 20)"),
        (
            [{"observe": {"pass": {"loss_within": 2}}}],
            "rules.0.actions.0",
            "observe.pass.loss_within: unknown key",
        ),
        ([{"apply": {}}], "rules.0.actions.0", "apply: apply needs at least one of lr_scale"),
        ([{"apply": {"exclude": {"shards": [1]}}}], "rules.0.actions.0", "apply.exclude.shards: unknown key"),
        ([{"apply": {"precision": "fp8"}}], "rules.0.actions.0", "apply.precision: must be one of"),
        ([{"rollback": {}, "apply": {}}], "rules.0.actions.0", "an action is one name with its parameters"),
        ([{"rollback": {}, "on_failure": "retry"}], "rules.0.actions.0.on_failure", "must be one of"),
        (["escalate", "resume"], "rules.0.actions", "'resume' after 'escalate' (action 0) never runs"),
        ([], "rules.0.actions", "should have at least 1 item"),
    ],
)
def test_malformed_actions(tmp_path: Path, actions: list[Any], field: str, message: str) -> None:
    path = write_policy(tmp_path, one_rule(actions))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.source == str(path) and info.value.field == field
    assert message in info.value.message, info.value.one_line()


@pytest.mark.parametrize(
    ("match", "field", "message"),
    [
        (
            {"phenotyp": ["divergence"]},
            "rules.0.match.0.phenotyp",
            "unknown key (valid: phenotype, attributes",
        ),
        ({"phenotype": ["diverge"]}, "rules.0.match.0.phenotype.0", "must be one of"),
        ({"attributes": ["nan"]}, "rules.0.match.0.attributes.0", "must be one of"),
        (
            {"metrics": [{"metric": "x", "op": "<", "value": 1}]},
            "rules.0.match.0.metrics.0.metric",
            "unknown metric 'x'",
        ),
        ([], "rules.0.match", "needs at least one set of conditions"),
    ],
)
def test_malformed_match(tmp_path: Path, match: Any, field: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(write_policy(tmp_path, one_rule(["alert"], match=match)))
    assert info.value.field == field and message in info.value.message, info.value.one_line()


def test_duplicate_rule_names_and_version(tmp_path: Path) -> None:
    body = one_rule(["alert"])
    body["rules"].append(dict(body["rules"][0]))
    with pytest.raises(PolicyError, match="rule name 'r' used twice"):
        load_policy(write_policy(tmp_path, body))
    with pytest.raises(PolicyError, match="version: must be one of 1"):
        load_policy(write_policy(tmp_path, {**one_rule(["alert"]), "version": 2}))


def test_policy_schema_spells_actions_as_in_yaml() -> None:
    schema = policy_schema()
    entries = schema["$defs"]["ActionSpec"]["oneOf"]
    assert entries[0]["enum"] == action_names()
    by_name = {next(iter(e["required"])): e for e in entries[1:]}
    assert set(by_name) == set(action_names())
    rollback = by_name["rollback"]["properties"]["rollback"]["anyOf"][0]
    assert "margin_steps" in rollback["properties"]


def test_cli_validate_and_schema() -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["policy", "validate", "default", "conservative", "--json"])
    assert ok.exit_code == 0, ok.output
    assert [r["name"] for r in json.loads(ok.stdout)] == ["default", "conservative"]
    schema = runner.invoke(cli, ["schema", "policy"])
    assert schema.exit_code == 0 and "ActionSpec" in json.loads(schema.stdout)["$defs"]


def test_cli_validate_error_is_one_line(tmp_path: Path) -> None:
    path = write_policy(tmp_path, one_rule(["freeze", "snapshot", {"rolback": {"margin_steps": 100}}]))
    res = CliRunner().invoke(cli, ["policy", "validate", str(path)])
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"error: {path}: rules.0.actions.2: unknown action 'rolback' (valid: {', '.join(action_names())})"
    )


def test_cli_validate_lists_every_problem_of_every_file(tmp_path: Path) -> None:
    """Issue 18: every problem is reported, one line each (file + field), not only the first; exit 2."""
    bad = write_policy(tmp_path, one_rule(["freeze", "rolback", {"observe": {"steps": 20}}]))
    data = json.loads(json.dumps(yaml.safe_load(bad.read_text())))
    data["defaults"] = {"max_attempts": 0, "cooldwn_steps": 5}
    bad.write_text(yaml.safe_dump(data))
    other = tmp_path / "other.yaml"
    other.write_text("version: 2\nname: x\nrules: []\n")
    res = CliRunner().invoke(cli, ["policy", "validate", "default", str(bad), str(other), "nosuch"])
    assert res.exit_code == 2
    assert res.stdout.startswith("ok ") and "policy 'default'" in res.stdout
    lines = res.stderr.strip().splitlines()
    assert lines == [
        f"error: {bad}: defaults.max_attempts: must be >= 1 (got 0)",
        f"error: {bad}: defaults.cooldwn_steps: unknown key (valid: max_attempts, cooldown_steps, "
        "max_observation_failures, on_failure)",
        f"error: {bad}: rules.0.actions.1: unknown action 'rolback' (valid: {', '.join(action_names())})",
        f"error: {bad}: rules.0.actions.2: observe.steps: must be >= 50 (got 20)",
        f"error: {other}: version: must be one of 1 (got 2)",
        f"error: {other}: rules: list should have at least 1 item after validation, not 0 (got [])",
        "error: nosuch: no such policy file or shipped policy (shipped: "
        + ", ".join(shipped_policies())
        + ")",
    ]
    as_json = CliRunner().invoke(cli, ["policy", "validate", str(bad), "--json"])
    assert as_json.exit_code == 2
    assert [len(r["errors"]) for r in json.loads(as_json.stdout)] == [4]
