"""structlog for the supervisor's own processes; hands off the logging of anyone else's.

Two situations, one logger type:

- **Our own processes** (the CLI, the supervisor actor, worker actors) call :func:`configure`:
  structlog is set up globally — human console lines on a terminal, JSON lines otherwise.
- **A host process** (the user's training script importing :mod:`supervisor.sdk`) never calls
  it, and then nothing global is touched: no ``structlog.configure``, no handler or level on
  the root logger. The SDK's lines go, rendered as JSON, to the standard-library logger
  ``supervisor.<name>``, so the host's own logging setup decides where they land and at which
  level (with none, Python prints warnings and errors to stderr).

A logger from :func:`get_logger` picks its route at each call, so module-level loggers made at
import time follow a :func:`configure` that happens later.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured = False
_level = "info"

# The route in a host process: every processor is ours, nothing is read from (or written to)
# structlog's global configuration.
_HOST_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.format_exc_info,
    structlog.processors.JSONRenderer(),
]


def configure(level: str = "info", json_output: bool | None = None) -> None:
    """Configure structlog for one of our own processes. ``json_output=None``: JSON unless stderr is a TTY.

    Never call this from code that runs in a user's training process: it sets structlog's
    global configuration. The root logger is left alone even here.
    """
    global _configured, _level
    if json_output is None:
        json_output = not sys.stderr.isatty()
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    _level = logging.getLevelName(numeric).lower()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries that narrate at INFO (e.g. botocore's "Found credentials in ...") only speak up
    # when something is wrong; our own structured lines say what matters.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    _configured = True


def is_configured() -> bool:
    """Whether this process is one of ours (``configure`` ran)."""
    return _configured


def current_level() -> str:
    """The level this process logs at (what ``--log-level`` set): actors started from here use it too."""
    return _level


def _stdlib_name(name: str | None) -> str:
    if not name:
        return "supervisor"
    return name if name == "supervisor" or name.startswith("supervisor.") else f"supervisor.{name}"


class Logger:
    """A structlog-style logger (``bind``, ``new``, ``unbind``, ``debug`` ... ``exception``) whose
    route is chosen at each call: structlog's global setup once :func:`configure` ran in this
    process, else the host's standard-library logging (see the module docstring)."""

    __slots__ = ("_bound", "_name")

    def __init__(self, name: str | None, bound: dict[str, Any]) -> None:
        self._name = name
        self._bound = bound

    def bind(self, **values: Any) -> Logger:
        return Logger(self._name, {**self._bound, **values})

    def new(self, **values: Any) -> Logger:
        return Logger(self._name, dict(values))

    def unbind(self, *keys: str) -> Logger:
        return Logger(self._name, {k: v for k, v in self._bound.items() if k not in keys})

    def _target(self) -> Any:
        if _configured:
            log = structlog.get_logger(self._name) if self._name else structlog.get_logger()
        else:
            log = structlog.wrap_logger(
                logging.getLogger(_stdlib_name(self._name)),
                processors=_HOST_PROCESSORS,
                wrapper_class=structlog.stdlib.BoundLogger,
                cache_logger_on_first_use=False,
            )
        return log.bind(**self._bound) if self._bound else log

    def __getattr__(self, method: str) -> Any:
        return getattr(self._target(), method)


def get_logger(name: str | None = None, **bound: Any) -> Any:
    """A logger for supervisor code; safe to call anywhere, it configures nothing."""
    return Logger(name, dict(bound))
