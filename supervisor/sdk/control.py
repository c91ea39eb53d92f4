"""Directives take effect at the same step on every rank: rank 0 decides, all ranks hear it.

At each step boundary rank 0 drains its transport and broadcasts the directives (JSON bytes)
to every rank over a dedicated gloo group: a length word every step (8 bytes, CPU only: no
GPU sync), the payload only when there is one. If ranks acted on their own transports, one
rank could park on a freeze while another blocks in an all-reduce — a deadlock.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from supervisor.sdk.directives import Directive


class ControlChannel:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self._group: Any = None
        if world_size > 1:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    f"world_size={world_size} but torch.distributed is not initialized: "
                    "call dist.init_process_group before sdk.init"
                )
            # Collective: every rank creates the probe, so every rank makes this call.
            self._group = dist.new_group(backend="gloo")

    def exchange(self, mine: list[Directive]) -> list[Directive]:
        """Rank 0's directives, on every rank (others' ``mine`` is ignored)."""
        if self.world_size == 1:
            return mine
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
