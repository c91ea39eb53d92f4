"""Worker supervision: the worker group's life on Ray, reported as events, never acted on here.

``watch`` returns what the group did -- ``finished``, ``failed(rank)`` (training raised),
``lost(rank)`` (the actor or its node died), ``hung(ranks)`` (no record for
``telemetry.hang_timeout_s``) -- and the controller decides (``restarts.decide``) and acts.
"""

from __future__ import annotations

from typing import Any, Protocol

import ray
from ray.exceptions import RayError

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.logging import get_logger
from supervisor.ranks.names import priority
from supervisor.runtime.group import GroupHealth, WorkerGroup
from supervisor.runtime.restarts import GroupEvent

log = get_logger("supervisor.runtime.machinery")


class Workers(Protocol):
    """What the controller asks of whoever runs the worker group: ``WorkerSupervision`` on Ray, the
    rank emulator's hosts (``drills/emulator.py``) in the scale bench."""

    @property
    def world_size(self) -> int: ...

    def find(self) -> bool: ...

    def exists_on_cluster(self) -> bool: ...

    def launch(self, generation: int, resume: int | None, after_seq: int, ready_timeout_s: float = ...,
               ranks: int | None = ...) -> None: ...  # fmt: skip

    def watch(self, silent_ranks: list[int]) -> GroupEvent | None: ...

    def link_acks(self) -> list[tuple[int, dict[str, Any], int | None]]: ...

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None: ...

    def shutdown(self) -> None: ...

    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any: ...

    def ray_result(self, ref: Any) -> tuple[bool, Any] | None: ...


class WorkerSupervision:
    def __init__(self, job: JobSpec, settings: RuntimeSettings) -> None:
        self.job = job
        self.settings = settings
        self.group: WorkerGroup | None = None

    def find(self) -> bool:
        """Re-attach to this job's newest generation on the cluster; True when one was found."""
        self.group = WorkerGroup.find(self.job, self.settings)
        return self.group is not None

    def exists_on_cluster(self) -> bool:
        return WorkerGroup.find(self.job, self.settings) is not None

    def launch(
        self,
        generation: int,
        resume: int | None,
        after_seq: int,
        ready_timeout_s: float = 120.0,
        ranks: int | None = None,
    ) -> None:
        """Raises SupervisorError (``WorkerStartError`` when Ray did not start it)."""
        self.group = WorkerGroup(self.job, self.settings, generation)
        self.group.launch(resume, after_seq=after_seq, ready_timeout_s=ready_timeout_s, ranks=ranks)

    @property
    def world_size(self) -> int:
        """The ranks of the group now (fewer than ``num_workers`` once restarted on fewer)."""
        return self.group.world_size if self.group is not None else self.job.resources.num_workers

    def watch(self, silent_ranks: list[int]) -> GroupEvent | None:
        """What the group did since the last call (None: it trains on, or there is no group).
        ``silent_ranks``: heard nothing from for too long while they should train."""
        if self.group is None:
            return None
        health = self.group.health()
        if health.state == "finished":
            return GroupEvent("finished")
        if health.state in ("lost", "failed"):
            return self._fault(self.group, health)
        if silent_ranks:
            why = f"no record for {self.job.telemetry.hang_timeout_s:.0f}s (telemetry.hang_timeout_s)"
            return GroupEvent("hung", tuple(silent_ranks), why)
        return None

    def _fault(self, group: WorkerGroup, health: GroupHealth) -> GroupEvent:
        """The fault, named by the ranks that were lost first. When a node goes, the ranks left
        on the others fail in their next collective (a closed connection) before Ray has declared
        the node dead, so the first rank to report is a survivor, or a rank of the lost node whose
        collective failed before its process went: every rank of a lost node (``lost_ranks``: dead
        to the cluster, or its raylet gone), else those that no longer answer, are the ones named."""
        first = f"rank {health.rank} {health.state}: {health.reason}"
        gone = group.lost_ranks()
        if gone:
            nodes = sorted(set(gone.values()))
            why = f"{', '.join(nodes)} lost with rank(s) {sorted(gone)}"
        else:
            gone = {r: group.rank_nodes.get(r, "") for r in group.unreachable_ranks()}
            if set(gone) <= {health.rank}:  # only the rank that reported: the fault as it reported it
                gone = {}
            where = sorted({f"node {n[:12]}" for n in gone.values() if n})
            why = f"rank(s) {sorted(gone)} do not answer" + (f" (on {', '.join(where)})" if where else "")
        if not gone:
            ranks = () if health.rank is None else (health.rank,)
            return GroupEvent("lost" if health.state == "lost" else "failed", ranks, health.reason)
        if health.rank is not None and health.rank not in gone:
            why += f"; then {first}"
        log.warning("worker_ranks_lost", ranks=sorted(gone), why=why)
        return GroupEvent("lost", tuple(sorted(gone)), why)

    def link_acks(self) -> list[tuple[int, dict[str, Any], int | None]]:
        """(rank, directive acks its link saw go out, its last step) for every answering rank."""
        if self.group is None:
            return []
        out = []
        for st in self.group.statuses():
            link = st.get("link") or {}
            if "rank" in st:
                out.append((int(st["rank"]), link.get("applied") or {}, link.get("last_step")))
        return out

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None:
        return None if self.group is None else self.group.rollback_target(max_step, min_mark)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None

    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any:
        from supervisor.ranks.replay import run_replay

        task = ray.remote(num_cpus=1, max_retries=0, runtime_env=priority(self.settings.niceness))(run_replay)
        return task.remote(self.job.model_dump(mode="json"), step, suspects, numeric)

    @staticmethod
    def ray_result(ref: Any) -> tuple[bool, Any] | None:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return None
        try:
            return True, ray.get(ref)
        except RayError as exc:
            return False, str(exc).strip().splitlines()[-1][:500]
