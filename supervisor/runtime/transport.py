"""The Ray-side SDK ``Transport``: ``send`` hands records to the link, ``poll`` returns directives.

The link (:class:`supervisor.runtime.channel.SupervisorLink`) already batches, bounds and
sends in the background, so ``send`` costs a lock and a deque append on the training thread.
"""

from __future__ import annotations

from typing import Any

from supervisor.runtime.channel import SupervisorLink
from supervisor.sdk.transport import HOLD_AT_END_S  # the same hold as a command entrypoint's process


class RayTransport:
    """Implements the SDK's Transport protocol over a :class:`SupervisorLink`."""

    hold_at_end_s = HOLD_AT_END_S

    def __init__(self, link: SupervisorLink) -> None:
        self.link = link

    def send(self, batch: list[dict[str, Any]]) -> None:
        self.link.sink(batch)

    def poll(self) -> list[Any]:
        return [_directive(d) for d in self.link.take_directives()]

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.link.flush(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self.link.close(timeout_s)

    @property
    def dropped(self) -> int:
        return self.link.dropped

    @property
    def supervisor_answers(self) -> int:
        """Answers from the supervisor so far (the SDK's guard: sdk/guard.py)."""
        return self.link.answers


def _directive(d: dict[str, Any]) -> Any:
    """An SDK ``Directive`` from its JSON form (plain dict if the SDK cannot parse it)."""
    try:
        from supervisor.sdk.directives import Directive
    except ImportError:
        return d
    return Directive.from_dict(d)


def make_transport(link: SupervisorLink, *, flush_interval_s: float) -> RayTransport:
    del flush_interval_s  # the link's own thread flushes; kept for a batching front-end
    return RayTransport(link)
