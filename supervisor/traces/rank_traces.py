"""The supervised run's telemetry written as per-rank JSONL traces (job.yaml ``telemetry.trace``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TextIO

from supervisor.config.runtime import RuntimeSettings


class RankTraces:
    """Named by ``sdk.context.trace_path``, so they read back with ``analyze`` like the SDK's offline
    traces; opened for appending: an attached supervisor continues the same traces."""

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
