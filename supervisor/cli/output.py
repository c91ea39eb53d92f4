"""Shared output helpers: `--json` printing and rich consoles."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click
from rich.console import Console

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


def console() -> Console:
    return Console(file=sys.stdout, soft_wrap=False)
