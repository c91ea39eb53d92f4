"""How directives reach every rank at the same boundary: the channels the steering talks to.

Each channel has the same five calls, made by every rank in the same order at every boundary:
``arrive()``; ``due(wait_s)`` (what takes effect here; a parked rank waits for it); on rank 0
``propose(directives)`` (what the supervisor or the guard sent since); ``depart()`` (leave, unless
something more is due here: then that, and ``depart`` again).

- ``LocalChannel`` (one rank): a proposal takes effect at the boundary where it is proposed.
- ``AgreedChannel`` (several ranks): rank 0's proposals are agreed through the rendezvous store
  (``supervisor.sdk.agreement``: a two-phase commit on the boundary where they take effect,
  usually the next one). No collective, and no store call, on a boundary where nothing is
  being agreed; its cost does not grow with the number of ranks.
- ``BroadcastChannel`` (several ranks, the earlier path): rank 0 broadcasts its directives over
  a gloo group at every boundary (an 8-byte length word, then the payload if any). A CPU
  barrier per step whose root cost grows with the ranks; kept as the baseline of
  ``bench/control_cost.py`` and behind ``SUPERVISOR_CONTROL=broadcast``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Protocol

from supervisor.sdk.agreement import Agreement
from supervisor.sdk.directives import Directive

#: Keys of the agreement live under this prefix in the job's rendezvous store.
STORE_PREFIX = "spike-supervisor/control"


class Channel(Protocol):
    rank: int

    def arrive(self) -> None: ...
    def due(self, wait_s: float = 0.0) -> list[Directive]: ...
    def propose(self, directives: list[Directive], *, parked: bool = False) -> None: ...
    def depart(self) -> list[Directive]: ...
    def failed(self) -> list[Directive]: ...
    def close(self) -> None: ...


class LocalChannel:
    """World size 1: what is proposed at a boundary is applied there."""

    def __init__(self) -> None:
        self.rank = 0
        self._queue: list[Directive] = []

    def arrive(self) -> None:
        pass

    def due(self, wait_s: float = 0.0) -> list[Directive]:
        if not self._queue and wait_s > 0:
            time.sleep(wait_s)  # parked: rank 0 polls its transport between waits
        out, self._queue = self._queue, []
        return out

    def propose(self, directives: list[Directive], *, parked: bool = False) -> None:
        known = {d.id for d in self._queue}
        self._queue += [d for d in directives if d.id not in known]

    def depart(self) -> list[Directive]:
        return self.due()

    def failed(self) -> list[Directive]:
        return []

    def close(self) -> None:
        pass


class AgreedChannel:
    """Several ranks, agreed through the rendezvous store (``supervisor.sdk.agreement``)."""

    _instances = 0  # every rank creates its probes in the same order: the same number on each

    def __init__(self, rank: int, world_size: int, base: Any, **kw: Any) -> None:
        import torch.distributed as dist

        AgreedChannel._instances += 1
        prefix = f"{STORE_PREFIX}/{AgreedChannel._instances}/"
        self.rank = rank
        # Two connections of this rank's own: the watcher blocks in one, the short calls use the other.
        self.agreement = Agreement(rank, world_size, dist.PrefixStore(prefix, base.clone()),
                                   dist.PrefixStore(prefix, base.clone()), **kw)  # fmt: skip

    def arrive(self) -> None:
        self.agreement.arrive()

    def due(self, wait_s: float = 0.0) -> list[Directive]:
        return self.agreement.due(wait_s)

    def propose(self, directives: list[Directive], *, parked: bool = False) -> None:
        self.agreement.propose(directives, parked=parked)

    def depart(self) -> list[Directive]:
        return self.agreement.depart()

    def failed(self) -> list[Directive]:
        return self.agreement.failed()

    def close(self) -> None:
        self.agreement.close()


class BroadcastChannel:
    """The earlier path: rank 0 broadcasts its directives at every boundary over a gloo group."""

    def __init__(self, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        # Collective: every rank creates the probe, so every rank makes this call.
        self._group = dist.new_group(backend="gloo")
        self._mine: list[Directive] = []

    def arrive(self) -> None:
        pass

    def due(self, wait_s: float = 0.0) -> list[Directive]:
        if wait_s <= 0:
            return []  # the boundary's one broadcast is ``depart``'s
        out = self.exchange()
        if not out and self.rank == 0:
            time.sleep(wait_s)  # ranks > 0 wait in their next broadcast for rank 0
        return out

    def propose(self, directives: list[Directive], *, parked: bool = False) -> None:
        self._mine += directives

    def depart(self) -> list[Directive]:
        return self.exchange()

    def failed(self) -> list[Directive]:
        return []

    def close(self) -> None:
        pass

    def exchange(self) -> list[Directive]:
        """Rank 0's proposals, on every rank: a length word, then the payload when there is one."""
        import torch
        import torch.distributed as dist

        mine, self._mine = self._mine, []
        payload = json.dumps([d.to_dict() for d in mine]).encode() if self.rank == 0 and mine else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self._group)
        n = int(size.item())
        if n == 0:
            return []
        buf = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if self.rank == 0
            else torch.empty(n, dtype=torch.uint8)
        )
        dist.broadcast(buf, src=0, group=self._group)
        return [Directive.from_dict(d) for d in json.loads(bytes(buf.tolist()).decode())]


#: ``SUPERVISOR_CONTROL=broadcast`` selects the earlier path (every rank must see the same value).
CONTROL_ENV = "SUPERVISOR_CONTROL"


def rendezvous_store() -> Any:
    """The store under the default process group, its prefixes taken off."""
    import torch.distributed as dist

    store: Any = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def control_channel(rank: int, world_size: int) -> Channel:
    """The channel for this rank: local, agreed through the store, or (``SUPERVISOR_CONTROL=broadcast``)
    the earlier broadcast."""
    if world_size == 1:
        return LocalChannel()
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"world_size={world_size} but torch.distributed is not initialized: "
            "call dist.init_process_group before sdk.init"
        )
    if os.environ.get(CONTROL_ENV, "").strip().lower() == "broadcast":
        return BroadcastChannel(rank, world_size)
    return AgreedChannel(rank, world_size, rendezvous_store())
