"""Shared output helpers: `--json` printing and rich consoles."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click
from rich.console import Console


class FiniteFloat(click.FloatRange):
    """A float option within bounds that also refuses ``nan`` (which passes every comparison) and ``inf``."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class JobName(click.ParamType):
    """A job name as job.yaml's ``name:`` allows it (so ``../..`` never reaches storage or Ray)."""

    name = "job name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from supervisor.config.job import _NAME

        if not isinstance(value, str) or not _NAME.match(value):
            self.fail(f"{value!r} is not a job name (letters, digits, '_', '.', '-'; at most 64)", param, ctx)
        return value


class RayAddress(click.ParamType):
    """A Ray address as job.yaml's ``ray.address`` allows it: ``auto``, ``local``, ``host:port``,
    ``ray://host:port`` (a malformed one was exit 3 "no Ray cluster reachable", not bad input)."""

    name = "ray address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pydantic import ValidationError

        from supervisor.config.job import RaySection

        try:
            RaySection.model_validate({"address": value})
        except ValidationError:
            self.fail(
                f"{value!r} is not a Ray address (`auto`, `host:port` or `ray://host:port`)", param, ctx
            )
        return value


STEP = click.IntRange(0, 10**12)
"""A step number (job.yaml's bound): ``10**40`` is one line, not an overflow deeper in."""

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table."
)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def print_json(data: Any) -> None:
    """Strict JSON on stdout (non-finite floats become null / "Infinity" strings)."""
    click.echo(json.dumps(_finite(data), indent=2, sort_keys=False, default=str))


#: Width of a console whose stdout is not a terminal: wide enough that a table sizes to its
#: content, so a piped ``incidents list`` prints every cell whole ("resolved", never "resol…").
PIPE_WIDTH = 10_000


def console(full: bool = False) -> Console:
    """The console for stdout. ``full``: when stdout is not a terminal (a file, a pipe), tables
    print every value whole instead of fitting 80 columns (text that wraps loses nothing)."""
    width = PIPE_WIDTH if full and not sys.stdout.isatty() else None
    return Console(file=sys.stdout, soft_wrap=False, width=width)
