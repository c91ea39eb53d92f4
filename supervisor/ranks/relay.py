"""One relay per node between the ranks' telemetry links and the supervisor actor.

Without it every rank's link makes its own ``ingest_packed`` call per step, and each call costs the
one supervisor actor Ray's handling (~0.7 ms of its CPU, ``bench.relay``): 1,024 ranks, ~0.7 s of
its CPU per step before a record is read. With it the links of one node call their node's relay, which sends what
they gave it meanwhile to the supervisor as one packed batch (``sdk/wire.py``: several links'
groups in one call, the batch the rank emulator sends per host) and hands every link its own
answer. The supervisor's calls then grow with nodes, not ranks; the relay's own work (a decode
and a re-pack of a node's records) stays on the node.

The relay keeps nothing: a link still numbers its records and keeps them until the supervisor
answers that they are durable (``ranks/channel.py``), so a relay that dies or a supervisor it cannot
reach costs a resend, never a record. While a call to the supervisor is in flight, the batches that
arrive wait for the next one, and each forward first gathers the rest of a step's records
(``LINGER_S``, then the links of the previous forward, at most ``GATHER_MAX_S``): a relay adds at
most one supervisor round trip and ``GATHER_MAX_S`` to a record's way.

A relay is a named async actor on its node (a hard node affinity, no CPU reserved), made by the
first link on the node that asks for it and owned by that rank's process: it goes with that
process, and the next link that asks makes a new one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from supervisor.ranks.names import NAMESPACE, supervisor_name
from supervisor.sdk.wire import Group, WireError, pack, unpack

LINGER_S = 0.005
"""A forward waits at least this long for more batches: the ranks of a node end a step together
(its collectives), so their records arrive within a few ms of each other and go in one call."""
GATHER_MAX_S = 0.05
"""...and then until every link of the previous forward has a batch waiting, at most this long: one
call per step even when the node's ranks end it further apart (a slow rank, a loaded host); a link
that went quiet (its rank frozen, held or gone) is waited for once."""
UNAVAILABLE = "unavailable"
"""The key of a relay's answer when the supervisor could not be reached: nothing was delivered."""


def relay_name(job: str, node_id: str) -> str:
    return f"{supervisor_name(job)}:relay:{node_id}"


class NodeRelay:
    """Takes packed batches from the links on its node; forwards them together (one call in flight)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._handle: Any = None
        self._waiting: list[tuple[list[Group], asyncio.Future[Any]]] = []
        self._arrived = asyncio.Event()
        self._last_round: set[str | None] = set()
        self._forwarding: asyncio.Task[None] | None = None
        self.calls = 0
        self.batches = 0

    async def ingest_packed(self, batch: Any) -> list[dict[str, Any]] | dict[str, Any]:
        """The supervisor's answer to this batch, as ``SupervisorActor.ingest_packed`` gives it."""
        try:
            groups = unpack(batch, as_dicts=True)
        except WireError as exc:  # refused here, alone: a batch it joins would be refused whole
            return {"refused": str(exc), "acked": 0}
        self.batches += 1
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((groups, answer))
        self._arrived.set()
        if self._forwarding is None or self._forwarding.done():
            self._forwarding = asyncio.create_task(self._forward())
        return await answer

    def stats(self) -> dict[str, int]:
        return {"calls": self.calls, "batches": self.batches}

    async def _forward(self) -> None:
        while self._waiting:
            await self._gather()
            taken, self._waiting = self._waiting, []
            self._last_round = {g[1] for gs, _ in taken for g in gs}
            try:
                answers = await self._supervisor().ingest_packed.remote(
                    pack([g for gs, _ in taken for g in gs])
                )
                self.calls += 1
            except Exception as exc:  # dead, restarting, not there yet, or failing: the links send again
                if isinstance(exc, RayActorError | ValueError):
                    self._handle = None
                for _, answer in taken:
                    answer.set_result({UNAVAILABLE: repr(exc)})
                continue
            at = 0
            for groups, answer in taken:
                if isinstance(answers, list):
                    answer.set_result(answers[at : at + len(groups)])
                    at += len(groups)
                else:  # refused whole: cannot be, each batch decoded here first; passed on as it is
                    answer.set_result(answers)

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GATHER_MAX_S
        await asyncio.sleep(LINGER_S)
        while not self._last_round <= {g[1] for gs, _ in self._waiting for g in gs}:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    def _supervisor(self) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(supervisor_name(self.job), namespace=NAMESPACE)
        return self._handle


RemoteRelay = ray.remote(NodeRelay)


def node_relay(job: str) -> Any:
    """This node's relay for ``job``, made if there is none (raises what Ray raises when it cannot)."""
    node = ray.get_runtime_context().get_node_id()
    return RemoteRelay.options(
        name=relay_name(job, node),
        namespace=NAMESPACE,
        get_if_exists=True,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(job)
