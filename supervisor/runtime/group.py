"""The worker group: one detached Ray actor per rank, in a detached placement group (docs/runtime.md,
"Which Ray mechanism, and why"). Names carry the generation (``worker:<job>:<gen>:<rank>``) so a
new group never races the old one for a name.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from supervisor.config.job import MAX_WORKERS, JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.errors import RuntimeBackendError
from supervisor.logging import get_logger
from supervisor.ranks.names import NAMESPACE, named_actors, placement_group_name, priority, worker_actor_name
from supervisor.ranks.worker import TrainWorker

RemoteWorker = ray.remote(TrainWorker)


PLACEMENT_POLL_S = 1.0
"""How often a pending placement looks at whether the cluster's live nodes can still hold it."""


class GroupDoesNotFit(RuntimeBackendError):
    """The cluster's live nodes cannot hold the worker group (a node was lost; exit code 3). Never
    retried as a start failure: only nodes joining help (``resources.wait_for_nodes_s``)."""


class WorkerStartError(RuntimeBackendError):
    """A worker group not placed in time, or a rank that did not answer or failed to begin (exit
    code 3); the controller retries it within the restart budget (``Controller._launch``)."""


@dataclass(frozen=True)
class GroupHealth:
    state: str  # "running" | "finished" | "failed" | "lost"
    rank: int | None = None
    reason: str = ""


class WorkerGroup:
    def __init__(self, job: JobSpec, settings: RuntimeSettings, generation: int) -> None:
        self.job = job
        self.settings = settings
        self.generation = generation
        self.world_size = job.resources.num_workers
        self.workers: list[Any] = []
        self.pg: PlacementGroup | None = None
        self._waits: dict[int, Any] = {}
        self._outcomes: dict[int, dict[str, Any]] = {}
        self._next_check = 0.0  # monotonic time of the next look at the ranks' outcomes
        self.rank_nodes: dict[int, str] = {}
        """Rank -> the node it was placed on (what names the ranks a lost node took with it)."""
        self.log = get_logger("supervisor.runtime.group", job=job.name, generation=generation)

    def launch(
        self,
        resume_step: int | None,
        *,
        after_seq: int = 0,
        ready_timeout_s: float = 120.0,
        ranks: int | None = None,
    ) -> None:
        """Place and start every rank; training begins from ``resume_step`` (None: fresh). ``ranks``:
        exactly this many (a checkpoint whose state cannot be resharded), else ``num_workers`` or,
        when the live nodes cannot hold them, as many as they hold down to ``resources.min_workers``."""
        res = self.job.resources
        if ranks is not None:
            self.world_size = ranks
        fewest = res.fewest_workers if ranks is None else ranks
        bundle = {"CPU": res.cpus_per_worker} | ({"GPU": res.gpus_per_worker} if res.gpus_per_worker else {})
        # 1. Reserve all ranks at once, so a group never starts half placed; with fewer ranks
        # (``resources.min_workers``) when the live nodes cannot hold them all.
        try:
            self._place(bundle, ready_timeout_s)
        except GroupDoesNotFit as exc:
            fit = min(bundles_that_fit(bundle, ray.nodes()), self.world_size - 1)
            if fit < fewest:
                if res.min_workers is not None:
                    why = f"resources.min_workers={res.min_workers}"
                    if ranks is not None:
                        why += f"; the checkpoint it resumes from loads on {ranks} ranks only"
                    raise GroupDoesNotFit(f"{exc} ({why})") from None
                raise
            self.log.warning("group_shrunk", world_size=fit, num_workers=res.num_workers,
                             why=f"{exc}; resources.min_workers={res.min_workers} allows {fit}")  # fmt: skip
            self.world_size = fit
            self._place(bundle, ready_timeout_s)
        assert self.pg is not None
        self.rank_nodes = self._bundle_nodes()
        # 2. One detached, named actor per rank: it outlives the supervisor that created it.
        spec, settings = self.job.model_dump(mode="json"), self.settings.model_dump()
        self.workers = [
            RemoteWorker.options(
                name=worker_actor_name(self.job.name, self.generation, rank),
                namespace=NAMESPACE,
                lifetime="detached",
                max_concurrency=32,
                max_restarts=0,
                num_cpus=res.cpus_per_worker,
                num_gpus=res.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=rank
                ),
                runtime_env=priority(self.settings.niceness),
            ).remote(spec, rank, self.world_size, self.generation, settings)
            for rank in range(self.world_size)
        ]
        # 3. Rank 0's actor hosts the rendezvous store on a port it holds from the moment it is named
        # (a port found free and released could be taken before the ranks bind it: ranks/rendezvous.py),
        # then every rank starts and joins the process group through it.
        # A rank that is slow to come up (a loaded host) or dies on the way is a start failure:
        # the half-started generation is taken down and the caller decides whether to try again.
        stage = "rank 0 (rendezvous address)"
        try:
            addr, port = ray.get(self.workers[0].address.remote(), timeout=ready_timeout_s)
            stage = f"the {self.world_size} rank(s) (start)"
            ray.get(
                [w.start.remote(addr, port, resume_step, after_seq) for w in self.workers],
                timeout=ready_timeout_s,
            )
        except RayError as exc:
            self.shutdown()
            if isinstance(exc, GetTimeoutError):
                what = f"did not answer within {ready_timeout_s:.0f}s"
            else:
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                what = f"failed: {type(exc).__name__}: {lines[-1][:300]}"
            raise WorkerStartError(f"worker generation {self.generation}: {stage} {what}") from None
        self._watch()
        self.log.info(
            "group_launched", world_size=self.world_size, resume_step=resume_step, master=f"{addr}:{port}"
        )

    def _place(self, bundle: dict[str, float], timeout_s: float) -> None:
        """Reserve the group; ``GroupDoesNotFit`` once the live nodes cannot hold it for
        ``resources.wait_for_nodes_s``, ``WorkerStartError`` when it is not placed within
        ``timeout_s`` though it would fit."""
        self.pg = placement_group(
            [dict(bundle) for _ in range(self.world_size)],
            strategy="PACK",
            name=placement_group_name(self.job.name, self.generation),
            lifetime="detached",
        )
        ready = self.pg.ready()
        start = time.monotonic()
        wait_s = self.job.resources.wait_for_nodes_s
        unfit_since: float | None = None
        while True:
            done, _ = ray.wait([ready], timeout=PLACEMENT_POLL_S)
            if done:
                ray.get(ready)
                return
            now = time.monotonic()
            short = shortfall(bundle, self.world_size, ray.nodes())
            unfit_since = None if short is None else (now if unfit_since is None else unfit_since)
            if unfit_since is not None and now - unfit_since >= wait_s:
                self.shutdown()
                waited = (
                    f" after waiting {wait_s:g}s for nodes (resources.wait_for_nodes_s)" if wait_s else ""
                )
                raise GroupDoesNotFit(f"cannot place {self.world_size} workers x {bundle}: {short}{waited}")
            if now - start >= timeout_s:
                self.shutdown()
                raise WorkerStartError(
                    f"cannot place {self.world_size} workers x {bundle} within {timeout_s:.0f}s "
                    f"(cluster has {ray.available_resources()})"
                )

    def _bundle_nodes(self) -> dict[int, str]:
        """Rank -> id of the node its bundle (and so its actor) is on; {} when Ray does not say."""
        if self.pg is None:
            return {}
        try:
            table = ray.util.placement_group_table(self.pg).get("bundles_to_node_id") or {}
        except Exception as exc:  # a removed group or a cluster going away: no placement to name
            self.log.debug("placement_table_failed", error=repr(exc))
            return {}
        return {int(rank): str(node) for rank, node in table.items() if node}

    def lost_ranks(self) -> dict[int, str]:
        """Rank -> "node <ip> (<id>)" for every rank placed on a lost node -- not alive to the cluster,
        or its raylet no longer takes a connection (Ray declares it dead only after its health checks
        failed for a while) -- whatever the rank reported first: it may still fail in a collective
        before its process goes with the node."""
        if not self.rank_nodes:
            return {}
        nodes = {str(n["NodeID"]): n for n in ray.nodes()}
        placed = [nodes[n] for n in set(self.rank_nodes.values()) if n in nodes]
        unreachable = raylets_gone([n for n in placed if n.get("Alive")])
        lost = {}
        for rank, node_id in sorted(self.rank_nodes.items()):
            node = nodes.get(node_id)
            if node is None or not node.get("Alive") or node_id in unreachable:
                ip = node.get("NodeManagerAddress", "?") if node else "?"
                lost[rank] = f"node {ip} ({node_id[:12]})"
        return lost

    @staticmethod
    def _generations(job_name: str) -> dict[int, dict[int, str]]:
        pattern = re.compile(rf"^worker:{re.escape(job_name)}:(\d+):(\d+)$")
        gens: dict[int, dict[int, str]] = {}
        for name in named_actors():
            m = pattern.match(name)
            if m:
                gens.setdefault(int(m.group(1)), {})[int(m.group(2))] = name
        return gens

    @classmethod
    def names(cls, job_name: str) -> list[str]:
        """Actor names of the newest generation of ``job_name``'s workers on the cluster."""
        gens = cls._generations(job_name)
        return [gens[max(gens)][r] for r in sorted(gens[max(gens)])] if gens else []

    @classmethod
    def find(cls, job: JobSpec, settings: RuntimeSettings) -> WorkerGroup | None:
        """The newest generation of this job's workers already on the cluster, re-attached."""
        gens = cls._generations(job.name)
        if not gens:
            return None
        gen = max(gens)
        group = cls(job, settings, gen)
        try:
            group.workers = [ray.get_actor(gens[gen][r], namespace=NAMESPACE) for r in sorted(gens[gen])]
        except (KeyError, ValueError):
            return None
        group.world_size = len(group.workers)  # fewer than num_workers after a restart on fewer ranks
        try:
            group.pg = ray.util.get_placement_group(placement_group_name(job.name, gen))
        except ValueError:
            group.pg = None
        group.rank_nodes = group._bundle_nodes()
        group._watch()
        return group

    def shutdown(self) -> None:
        """Safe to call twice."""
        if self.job.is_command and self.workers:
            # A command's process gets SIGTERM and a grace period before its actor (and, through
            # PDEATHSIG, anything it left behind) is killed.
            from supervisor.ranks.process import STOP_GRACE_S

            refs = [w.terminate.remote(STOP_GRACE_S) for w in self.workers]
            with contextlib.suppress(RayError):
                ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_S + 5.0)
        for w in self.workers:
            with contextlib.suppress(RayActorError, ValueError):
                ray.kill(w, no_restart=True)
        self.workers = []
        self._waits = {}
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception as exc:  # already removed / cluster going away: nothing left to release
                self.log.debug("pg_remove_failed", error=repr(exc))
            self.pg = None

    def health(self) -> GroupHealth:
        """Non-blocking: finished when every rank finished, failed/lost as soon as one rank is. Ray is
        asked at most once per ``loop_interval_s``: the loop runs once per batch while records flow."""
        pending = [ref for rank, ref in self._waits.items() if rank not in self._outcomes]
        now = time.monotonic()
        if pending and now >= self._next_check:
            self._next_check = now + self.settings.loop_interval_s
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
            for rank, ref in self._waits.items():
                if ref in ready and rank not in self._outcomes:
                    self._outcomes[rank] = _outcome(ref)
        for rank, out in sorted(self._outcomes.items()):
            if out["state"] == "lost":
                return GroupHealth("lost", rank, out.get("error", "worker actor died"))
            if out["state"] == "failed":
                return GroupHealth("failed", rank, out.get("error", "training raised"))
        if len(self._outcomes) == self.world_size:
            return GroupHealth("finished")
        return GroupHealth("running")

    def rollback_target(self, max_step: int, min_mark: str, timeout_s: float = 60.0) -> dict[str, Any] | None:
        """Rank 0's answer to the rollback target search (``TrainWorker.rollback_target``); None when
        it cannot answer (gone, too slow, torch not loaded there): the caller searches itself."""
        if not self.workers:
            return None
        try:
            found = ray.get(self.workers[0].rollback_target.remote(max_step, min_mark), timeout=timeout_s)
        except RayError as exc:  # GetTimeoutError and a dead actor alike
            self.log.warning("rollback_target_on_rank_failed", error=type(exc).__name__,
                             why="the supervisor searches itself")  # fmt: skip
            return None
        return cast(dict[str, Any] | None, found)

    def statuses(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        refs = [w.status.remote() for w in self.workers]
        out = []
        deadline = time.monotonic() + timeout_s
        for rank, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=max(0.1, deadline - time.monotonic())))
            except (RayActorError, GetTimeoutError) as exc:
                out.append({"rank": rank, "state": "lost", "error": type(exc).__name__})
        return out

    def unreachable_ranks(self, timeout_s: float = 5.0) -> list[int]:
        return [rank for rank, st in enumerate(self.statuses(timeout_s)) if st.get("state") == "lost"]

    def pids(self) -> list[int]:
        return list(ray.get([w.pid.remote() for w in self.workers], timeout=30))

    def _watch(self) -> None:
        self._waits = {rank: w.wait.remote() for rank, w in enumerate(self.workers)}
        self._outcomes = {}


def _outcome(ref: Any) -> dict[str, Any]:
    try:
        return cast(dict[str, Any], ray.get(ref))
    except RayActorError as exc:
        return {"state": "lost", "error": f"worker actor died: {type(exc).__name__}"}


RAYLET_PROBE_S = 2.0
"""How long a lost rank's node's raylet is given to take a TCP connection before the node counts lost."""


def raylets_gone(nodes: list[dict[str, Any]], timeout_s: float = RAYLET_PROBE_S) -> set[str]:
    """Ids of the ``nodes`` whose raylet takes no TCP connection within ``timeout_s`` (refused: the
    raylet died; no answer: the machine or its network went); one with no known port is not judged."""

    def gone(node: dict[str, Any]) -> bool:
        host, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
        if not host or not port:
            return False
        try:
            socket.create_connection((str(host), int(port)), timeout=timeout_s).close()
        except OSError:
            return True
        return False

    if not nodes:
        return set()
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:  # probed at once
        verdicts = list(pool.map(gone, nodes))
    return {str(n["NodeID"]) for n, v in zip(nodes, verdicts, strict=True) if v}


def bundles_that_fit(
    bundle: dict[str, float], nodes: list[dict[str, Any]], unbounded: int = MAX_WORKERS
) -> int:
    """How many ``bundle``s the live nodes' total resources hold, each on one node (``unbounded``
    when the bundle asks for nothing)."""
    need = {k: v for k, v in bundle.items() if v > 0}
    fits = 0
    for node in nodes:
        if node.get("Alive"):
            have = node.get("Resources") or {}
            fits += min((int(have.get(k, 0.0) / v + 1e-9) for k, v in need.items()), default=unbounded)
    return fits


def shortfall(bundle: dict[str, float], count: int, nodes: list[dict[str, Any]]) -> str | None:
    """Why ``count`` bundles cannot fit the live nodes' total resources (each bundle on one node), or
    None. Totals, not what is free now: what other jobs hold comes back, a lost node does not."""
    fits = bundles_that_fit(bundle, nodes, count)
    if fits >= count:
        return None
    alive = [n for n in nodes if n.get("Alive")]
    need = {k: v for k, v in bundle.items() if v > 0}
    totals = {k: sum(float((n.get("Resources") or {}).get(k, 0.0)) for n in alive) for k in need}
    dead = [n for n in nodes if not n.get("Alive")]
    lost = ""
    if dead:
        shown = [f"{n.get('NodeManagerAddress', '?')} ({str(n.get('NodeID', ''))[:12]})" for n in dead[-3:]]
        more = f" and {len(dead) - 3} more" if len(dead) > 3 else ""
        lost = f"; {len(dead)} node(s) lost: {', '.join(shown)}{more}"
    have_s = ", ".join(f"{k} {v:g}" for k, v in totals.items())
    return f"the {len(alive)} live node(s) of the cluster hold {fits} of them ({have_s} in all){lost}"
