"""Every command and subcommand documents itself and its options."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from supervisor.cli.main import cli


def _walk(group: click.Group, prefix: list[str]) -> list[list[str]]:
    paths = []
    for name, cmd in group.commands.items():
        paths.append([*prefix, name])
        if isinstance(cmd, click.Group):
            paths.extend(_walk(cmd, [*prefix, name]))
    return paths


def test_every_command_has_help_describing_its_options() -> None:
    runner = CliRunner()
    root = runner.invoke(cli, ["--help"])
    assert root.exit_code == 0 and "--log-level" in root.output and "--log-json" in root.output
    paths = _walk(cli, [])
    assert ["validate"] in paths and ["schema"] in paths
    for path in paths:
        res = runner.invoke(cli, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        cmd: click.Command = cli
        for part in path:
            assert isinstance(cmd, click.Group)
            cmd = cmd.commands[part]
        assert cmd.help, f"`supervisor {' '.join(path)}` has no description"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"`supervisor {' '.join(path)}` option {param.opts} has no help"
                assert param.opts[0] in res.output


def test_schema_job_is_json_schema() -> None:
    res = CliRunner().invoke(cli, ["schema", "job"])
    assert res.exit_code == 0
    schema = json.loads(res.output)
    assert schema["additionalProperties"] is False
    assert {"name", "entrypoint", "storage", "max_steps"} <= set(schema["required"])
    assert "num_workers" in json.dumps(schema)
