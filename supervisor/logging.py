"""structlog, configured once: human console output on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured = False
_level = "info"


def configure(level: str = "info", json_output: bool | None = None) -> None:
    """Configure structlog and stdlib logging. ``json_output=None`` means: JSON unless stderr is a TTY."""
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
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    # Libraries that narrate at INFO (e.g. botocore's "Found credentials in ...") only speak up
    # when something is wrong; our own structured lines say what matters.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    _configured = True


def current_level() -> str:
    """The level this process logs at (what ``--log-level`` set): actors started from here use it too."""
    return _level


def get_logger(name: str | None = None, **bound: Any) -> Any:
    """A structlog logger; configures defaults on first use so library code never logs unformatted."""
    if not _configured:
        configure()
    log = structlog.get_logger(name) if name else structlog.get_logger()
    return log.bind(**bound) if bound else log
