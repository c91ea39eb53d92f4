"""The supervisor's runtime knobs: job.yaml's ``runtime:`` section plus the trace path and log level,
built by ``settings_for(job)`` (tests pass their own); they travel to the actors as a plain dict."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TextIO

from pydantic import ConfigDict, Field

from supervisor.config.runtime import RuntimeSection
from supervisor.logging import current_level

if TYPE_CHECKING:
    from supervisor.config.job import JobSpec


class RuntimeSettings(RuntimeSection):
    model_config = ConfigDict(strict=False)

    trace_path: str | None = Field(
        None,
        description="Write every record the supervisor receives to per-rank JSONL traces "
        "(job.yaml `telemetry.trace`; `{rank}` in the name is filled in, else `.rankN` is added).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default_factory=current_level,  # type: ignore[arg-type]
        description="Level of the supervisor's and workers' own log lines (default: the launching CLI's).",
    )


def settings_for(job: JobSpec) -> RuntimeSettings:
    """The settings job.yaml asks for: its ``runtime:`` section and ``telemetry.trace``."""
    chosen = job.runtime.model_dump(exclude_unset=True, exclude_none=True)
    if job.telemetry.trace is not None:
        chosen["trace_path"] = job.telemetry.trace
    return RuntimeSettings.model_validate(chosen)


class RankTraces:
    """The supervised run's telemetry as per-rank JSONL traces (``telemetry.trace``), named by
    ``sdk.context.trace_path`` so they read back with ``analyze`` like the SDK's offline traces.
    Opened for appending: an attached supervisor continues the same traces."""

    def __init__(self, path: str, world_size: int) -> None:
        self.path = path
        self.world_size = world_size
        self._files: dict[int, TextIO] = {}

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        by_rank: dict[int, list[str]] = {}
        for rec in records:
            if rec.get("control"):
                continue
            rank = rec.get("rank")
            by_rank.setdefault(rank if isinstance(rank, int) else 0, []).append(json.dumps(rec) + "\n")
        for rank, lines in by_rank.items():
            out = self._file(rank)
            out.write("".join(lines))
            out.flush()

    def _file(self, rank: int) -> TextIO:
        if rank not in self._files:
            from supervisor.sdk.context import trace_path

            target = trace_path(self.path, rank, self.world_size)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._files[rank] = open(target, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        return self._files[rank]

    def close(self) -> None:
        for out in self._files.values():
            out.close()
        self._files.clear()


def open_traces(settings: RuntimeSettings, world_size: int) -> RankTraces | None:
    return RankTraces(settings.trace_path, world_size) if settings.trace_path else None
