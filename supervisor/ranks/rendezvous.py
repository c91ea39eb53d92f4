"""The worker group's rendezvous store: hosted by rank 0's worker actor, joined by every rank.

Hazard: a port found free (bind port 0, read it, close the socket) is free only until someone
binds it. Rank 0's own ``TCPStore`` used to bind it again when training began, and a process that
took it in between (another job's ranks, Ray) failed the rendezvous with EADDRINUSE: a worker
failure, and a restart incident, on a clean run. So the store is started on port 0 and the port
it got is the one named to the ranks; it is held from that moment and there is nothing to retry.

Every rank, rank 0 included, then connects as a client, as torchrun's ranks connect to its agent's
store: a command entrypoint is told so (``AGENT_STORE_ENV``), and its ``env://`` init connects to
``MASTER_ADDR:MASTER_PORT`` instead of binding it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import Store, TCPStore

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""torchrun's variable: "True" when the store at ``MASTER_ADDR:MASTER_PORT`` is already hosted."""

PREFIX = "default_pg"
"""The prefix ``init_process_group``'s own ``tcp://`` and ``env://`` rendezvous give the store's keys."""


def host_store(host: str, timeout_s: float) -> TCPStore:
    """The group's store, listening on a port the OS picks (``.port``) for as long as it is referenced."""
    from torch.distributed import TCPStore

    return TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> Store:
    """A rank's connection to the group's store, for ``init_process_group(store=...)``."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = timedelta(seconds=timeout_s)
    client = TCPStore(host, port, world_size=world_size, is_master=False, timeout=timeout)
    return PrefixStore(PREFIX, client)
