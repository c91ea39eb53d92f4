"""An optional TensorBoard sink: the supervisor's view of the run, with incident markers.

One TensorBoard *run* per training timeline — ``<logdir>/timeline-0``, then ``timeline-1``
after the first rollback, … — so the abandoned steps and the replayed ones overlay in
TensorBoard instead of zig-zagging on one curve, and no step ever goes backwards within a run.
Scalars: ``loss``, ``grad_norm``, ``update_ratio``, ``lr``, ``tokens_per_s`` (the supervisor's
aggregates) and ``loss/rank_<r>`` (first 16 ranks); ``incidents/open`` (open incidents at each
step). Incidents are marked as text under ``incidents`` at their detection step and again when
they end, and a rollback is marked at its target step in the new timeline.

Needs the ``tensorboard`` extra (``pip install 'spike-supervisor[tensorboard]'``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

SCALARS = ("loss", "grad_norm", "update_ratio", "lr", "tokens_per_s")
MAX_RANK_LINES = 16


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardSink:
    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the [tensorboard] extra

        self._writer_cls = SummaryWriter
        self.logdir = Path(logdir)
        existing = [
            int(m.group(1))
            for p in self.logdir.glob("timeline-*")
            if (m := re.fullmatch(r"timeline-(\d+)", p.name))
        ]
        self.timeline = max(existing, default=0)  # a restarted supervisor goes on in the newest run
        self.writer = SummaryWriter(str(self.logdir / f"timeline-{self.timeline}"), flush_secs=5)
        self.marked: dict[int, str] = {}  # incident id -> the last state marked
        self.open_incidents = 0

    def on_step(self, step: int, records: list[Any], aggregate: dict[str, Any] | None) -> None:
        for name in SCALARS:
            value: Any = (aggregate or {}).get(name)
            if _finite(value):
                self.writer.add_scalar(name, float(value), step)
        for rec in records:
            d = rec.to_dict() if hasattr(rec, "to_dict") else rec
            rank = int(d.get("rank", 0))
            if rank < MAX_RANK_LINES and _finite(d.get("loss")):
                self.writer.add_scalar(f"loss/rank_{rank}", float(d["loss"]), step)
        self.writer.add_scalar("incidents/open", self.open_incidents, step)

    def on_rewind(self, to_step: int) -> None:
        self.writer.flush()
        self.writer.close()
        self.timeline += 1
        self.writer = self._writer_cls(str(self.logdir / f"timeline-{self.timeline}"), flush_secs=5)
        self.writer.add_text("incidents", f"rolled back: training continues from step {to_step}", to_step)

    def on_incidents(self, incidents: list[Any], step: int) -> None:
        """Mark each incident when first seen and when its state ends (resolved / escalated / dismissed)."""
        self.open_incidents = sum(1 for inc in incidents if not inc.state.is_terminal)
        for inc in incidents:
            state = inc.state.value
            if self.marked.get(inc.id) == state or (inc.id in self.marked and not inc.state.is_terminal):
                continue
            if inc.id not in self.marked:
                at = inc.detected_step if inc.detected_step is not None else step
                text = (
                    f"incident #{inc.id}: {inc.phenotype or 'loss'} spike, severity {inc.severity}, "
                    f"top cause {inc.top_cause}; onset step {inc.onset_step}, detected at {inc.detected_step}"
                )
                self.writer.add_text("incidents", text, at)
            if inc.state.is_terminal:
                self.writer.add_text("incidents", f"incident #{inc.id} {state}", step)
            self.marked[inc.id] = state

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
