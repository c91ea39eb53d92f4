"""Resolve a job's entrypoint (`package.module:function` or a script path) to a callable."""

from __future__ import annotations

import importlib
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.errors import ConfigError

#: A script entrypoint defines this function; it is called as ``main(config, ctx)``.
SCRIPT_FUNCTION = "main"


def resolve(entrypoint: str) -> Callable[..., Any]:
    """The training function ``fn(config, ctx)``; ConfigError naming the field if it cannot be found."""
    if entrypoint.endswith(".py"):
        path = Path(entrypoint)
        if not path.is_file():
            raise ConfigError(f"script not found: {entrypoint}", field="entrypoint")
        namespace = runpy.run_path(str(path), run_name="__supervised__")
        fn = namespace.get(SCRIPT_FUNCTION)
        if not callable(fn):
            raise ConfigError(
                f"script {entrypoint} defines no `{SCRIPT_FUNCTION}(config, ctx)`; to run it as a command "
                "(torchrun-style, its own process per rank) add `args: []` to job.yaml",
                field="entrypoint",
            )
        return fn
    module_name, _, attr = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}", field="entrypoint") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{module_name!r} has no callable {attr!r}", field="entrypoint")
    return fn


def resolve_module(entrypoint: str) -> Any:
    """The module (or script namespace) that holds the entrypoint; optional hooks live there."""
    if len(entrypoint.split()) > 1:
        raise ConfigError(
            f"{entrypoint!r} is a command: hooks such as replay_hooks need a `module:function` entrypoint",
            field="entrypoint",
        )
    if entrypoint.endswith(".py"):
        return runpy.run_path(entrypoint, run_name="__supervised__")
    return importlib.import_module(entrypoint.partition(":")[0])
