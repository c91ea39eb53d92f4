"""The `supervisor` command. Each subcommand lives in its own module; this file wires them.

Every expected failure is a ``SupervisorError``: printed as one line
(``error: <file>: <field>: <what>``) with exit code 2 and no traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from supervisor import logging as slog
from supervisor.errors import SupervisorError


class SupervisorGroup(click.Group):
    """A click group that turns SupervisorError into one line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SupervisorError as exc:
            click.echo(f"error: {exc.one_line()}", err=True)
            ctx.exit(2)


@click.group(cls=SupervisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Minimum level of structured log lines (stderr).",
)
@click.option(
    "--log-json/--no-log-json",
    default=None,
    help="Force JSON log lines (default: JSON unless stderr is a terminal).",
)
def cli(log_level: str, log_json: bool | None) -> None:
    """spike-supervisor: watch PyTorch training on Ray, diagnose loss spikes, roll back safely."""
    slog.configure(log_level, log_json)


def _register() -> None:
    # Imported here so `supervisor --help` stays fast and each module owns one command.
    from supervisor.cli import launch, validate
    from supervisor.cli.analyze import analyze
    from supervisor.cli.checkpoints import checkpoints
    from supervisor.cli.drill import drill
    from supervisor.cli.incidents import incidents
    from supervisor.cli.policy import policy

    cli.add_command(validate.validate)
    cli.add_command(validate.schema)
    cli.add_command(launch.launch)
    cli.add_command(launch.status)
    cli.add_command(launch.stop)
    cli.add_command(policy)
    cli.add_command(incidents)
    cli.add_command(analyze)
    cli.add_command(checkpoints)
    cli.add_command(drill)


_register()


def main() -> None:
    try:
        cli.main(prog_name="supervisor", standalone_mode=True)
    except SupervisorError as exc:  # raised outside invoke (e.g. while parsing)
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
