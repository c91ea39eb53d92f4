"""The `supervisor` command. Each subcommand lives in its own module; this file wires them.

Exit codes (every command, docs/operations.md): 0 done, 1 the job failed or escalated / a
check found what it looks for, 2 bad input, 3 the supervisor, Ray or storage failed.
Every expected failure is a ``SupervisorError`` printed as one line
(``error: <file>: <field>: <what>``) with its exit code; a Ray or storage-client exception
that escapes a command is one line with exit code 3. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

import click

from supervisor import logging as slog
from supervisor.errors import EXIT_BROKEN, SupervisorError, printable

# Exceptions of these libraries mean the backend failed, not the input (e.g. Ray's
# ActorDiedError when the supervisor actor dies under `launch`).
_BACKEND_MODULES = ("ray", "botocore", "boto3", "grpc")


def _backend_failure(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in _BACKEND_MODULES


def fail(exc: BaseException) -> NoReturn:
    """Print ``exc`` as one line and exit with its code (see the module docstring)."""
    if isinstance(exc, SupervisorError):
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    detail = printable(" ".join(str(exc).split())[:300]) or "(no detail)"
    click.echo(f"error: Ray or storage failed: {type(exc).__name__}: {detail}", err=True)
    sys.exit(EXIT_BROKEN)


_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EPIPE, errno.EDQUOT, errno.EIO, errno.EFBIG)
"""Errors of a write to stdout (`--json > /dev/full`, a closed pipe): one line, not a traceback."""


def _output_failed(exc: OSError) -> NoReturn:
    try:  # stdout is unusable: nothing more goes to it, not even the flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    detail = exc.strerror or str(exc)
    click.echo(f"error: <stdout>: cannot write the output: {printable(detail)}", err=True)
    sys.exit(EXIT_BROKEN)


def usage_fail(exc: click.ClickException) -> NoReturn:
    """A click argument or option error as one line (click prints usage, a hint and the error on
    three): ``error: Invalid value for 'FILES...': File 'x' is a directory. (see 'supervisor validate --help')``."""
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if isinstance(exc, click.UsageError) and ctx else ""
    click.echo(f"error: {printable(' '.join(exc.format_message().split()))}{hint}", err=True)
    sys.exit(exc.exit_code)


class SupervisorGroup(click.Group):
    """A click group that turns expected failures, and click's own usage errors, into one line
    and their exit code (a bare group, e.g. `supervisor policy`, still prints its help)."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.ClickException as exc:
            usage_fail(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.ClickException as exc:
            usage_fail(exc)
        except SupervisorError as exc:
            fail(exc)
        except OSError as exc:
            if exc.errno not in _OUTPUT_ERRNOS:
                raise
            _output_failed(exc)
        except Exception as exc:
            if not _backend_failure(exc):
                raise
            fail(exc)


def _version() -> str:
    try:
        return version("spike-supervisor")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


@click.group(cls=SupervisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="supervisor", message="%(prog)s %(version)s")
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
    """spike-supervisor: watch PyTorch training on Ray, diagnose loss spikes, roll back safely.

    Exit codes: 0 done, 1 the job failed or escalated (or a check matched), 2 bad input,
    3 the supervisor, Ray or storage failed.
    """
    slog.configure(log_level, log_json)


def _register() -> None:
    # Imported here so `supervisor --help` stays fast and each module owns one command.
    from supervisor.cli import launch, validate
    from supervisor.cli.analyze import analyze
    from supervisor.cli.checkpoints import checkpoints
    from supervisor.cli.drill import drill
    from supervisor.cli.incidents import incidents
    from supervisor.cli.logs import logs
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
    cli.add_command(logs)


_register()


def main() -> None:
    try:
        cli.main(prog_name="supervisor", standalone_mode=True)
    except SupervisorError as exc:  # raised outside invoke (e.g. while parsing)
        fail(exc)


if __name__ == "__main__":
    main()
