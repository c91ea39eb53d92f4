"""One rank of the worker group: a Ray actor that joins torch.distributed and runs the job.

The actor is detached and named (``worker:<job>:<gen>:<rank>``): it belongs to the cluster, so a
supervisor that dies leaves training running and a restarted one finds the workers by name.
Training runs in a thread, so the actor answers ``status`` / ``wait`` while a step runs.

A command entrypoint (``python train.py``, torchrun-style) runs as the rank's own process
(:mod:`supervisor.ranks.process`); the training thread relays its records and directives
through a local socket, keeps its output in storage, and reports its exit.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import ray

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.logging import configure as configure_logging
from supervisor.logging import get_logger
from supervisor.ranks.channel import RayTransport, SupervisorLink
from supervisor.ranks.context import WorkerContext


class TrainWorker:
    """Ray actor body (``ray.remote`` in :mod:`supervisor.runtime.group`)."""

    def __init__(
        self, job: dict[str, Any], rank: int, world_size: int, generation: int, settings: dict[str, Any]
    ):
        self.job = JobSpec.model_validate(job)
        self.rank = rank
        self.world_size = world_size
        self.generation = generation
        self.settings = RuntimeSettings.model_validate(settings)
        configure_logging(self.settings.log_level)
        self.log = get_logger("supervisor.ranks.worker", job=self.job.name, rank=rank, generation=generation)
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._outcome: dict[str, Any] = {"state": "idle"}
        self._link: SupervisorLink | None = None
        self._proc: Any = None
        self._store: Any = None
        """Rank 0's: the group's rendezvous store (``address``), alive as long as this actor."""

    def pid(self) -> int:
        return os.getpid()

    def spec(self) -> dict[str, Any]:
        """The job spec this worker runs (lets `launch --attach JOB` work without the job file)."""
        return self.job.model_dump(mode="json")

    def address(self) -> tuple[str, int]:
        """This node's IP and the port of the group's rendezvous store, which this actor (rank 0's)
        hosts from now on (:mod:`supervisor.ranks.rendezvous`: a port merely found free can be
        taken before the ranks bind it). Asked again, the same store answers."""
        from supervisor.ranks.rendezvous import host_store

        ip = ray.util.get_node_ip_address()
        if self._store is None:
            self._store = host_store(ip, self.settings.dist_timeout_s)
            self.log.info("rendezvous_store_hosted", port=self._store.port)
        return ip, self._store.port

    def placement(self) -> tuple[str, list[str]]:
        """(node id, GPU ids Ray assigned): what peers need to compute torchrun's local ranks."""
        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None:
        """``checkpoint.lifecycle.pick_rollback_target`` run where training has loaded torch and DCP already: the
        deep re-verification needs both, which the supervisor would import for it (~5 CPU-s). None
        when this process has not loaded them (a command entrypoint, no checkpoint written yet): the
        supervisor then searches itself. ``{"error": ...}``: no checkpoint qualifies."""
        if "torch.distributed.checkpoint" not in sys.modules:
            return None
        from supervisor.checkpoint.lifecycle import open_checkpoint_store, pick_rollback_target
        from supervisor.errors import SupervisorError

        try:
            step, verification = pick_rollback_target(
                open_checkpoint_store(self.job),
                max_step=max_step,
                min_mark=min_mark,
                world_size=self.world_size,
            )
        except SupervisorError as exc:
            return {"error": str(exc)}
        return {"step": step, "verification": verification}

    def terminate(self, grace_s: float = 10.0) -> dict[str, Any]:
        """Stop a command entrypoint's process: SIGTERM, ``grace_s`` to exit, then SIGKILL."""
        if self._proc is not None:
            self._proc.terminate(grace_s)
            self._done.wait(grace_s + 5.0)
        return self.status()

    def start(self, master_addr: str, master_port: int, resume_step: int | None, after_seq: int = 0) -> None:
        if self._thread is not None:
            return
        self._outcome = {"state": "running", "resume_step": resume_step, "started": time.time()}
        self._thread = threading.Thread(
            target=self._run_command if self.job.is_command else self._train,
            args=(master_addr, master_port, resume_step, after_seq),
            name="train",
            daemon=True,
        )
        self._thread.start()

    def wait(self) -> dict[str, Any]:
        self._done.wait()
        return self.status()

    def status(self) -> dict[str, Any]:
        out = dict(self._outcome)
        out.update(rank=self.rank, generation=self.generation, pid=os.getpid())
        if self._link is not None:
            out["link"] = self._link.stats()
        return out

    def _new_link(self, after_seq: int) -> SupervisorLink:
        return SupervisorLink(
            self.job.name,
            self.rank,
            buffer_records=self.settings.buffer_records,
            poll_interval_s=self.settings.poll_interval_s,
            after_seq=after_seq,
            relay=0 < self.settings.relay_from_ranks <= self.world_size,
        )

    def _failed(self, exc: BaseException) -> None:
        self._outcome.update(
            state="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:]
        )
        self.log.error("training_failed", error=repr(exc))

    # -- the training thread -----------------------------------------------------------------
    def _train(self, master_addr: str, master_port: int, resume_step: int | None, after_seq: int) -> None:
        import torch
        import torch.distributed as dist

        from supervisor.ranks.entrypoint import resolve
        from supervisor.ranks.rendezvous import join_store

        torch.set_num_threads(max(1, int(self.job.resources.cpus_per_worker)))
        use_cuda = self.job.resources.gpus_per_worker > 0
        timeout_s = self.settings.dist_timeout_s
        try:
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo",
                store=join_store(master_addr, master_port, self.world_size, timeout_s),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=timeout_s),
            )
            if use_cuda:
                torch.cuda.set_device(0)
            self._link = self._new_link(after_seq)
            ctx = WorkerContext(
                rank=self.rank,
                world_size=self.world_size,
                job=self.job,
                transport=RayTransport(self._link),
                resume_step=resume_step,
                generation=self.generation,
                device="cuda" if use_cuda else "cpu",
                checkpoint_store=_open_store(self.job),
            )
            result = resolve(self.job.entrypoint)(dict(self.job.config), ctx)
            ctx.transport.close()
            self._outcome.update(state="finished", result=_plain(result), ended=time.time())
            self.log.info("training_finished")
        except BaseException as exc:  # reported to the supervisor, which decides what to do
            self._failed(exc)
        finally:
            if self._link is not None:
                self._link.close()
            if dist.is_initialized():
                # The user's model (DDP) holds the process group inside reference cycles; free it
                # while the interpreter is whole rather than at actor exit, where gloo can abort.
                gc.collect()
                dist.destroy_process_group()
            self._done.set()

    # -- a command entrypoint: the rank's own process ------------------------------------------
    def _run_command(
        self, master_addr: str, master_port: int, resume_step: int | None, after_seq: int
    ) -> None:
        from supervisor.ranks.process import (
            RankProcess,
            child_env,
            command_line,
            describe_exit,
            last_error_line,
        )
        from supervisor.ranks.process_link import LinkServer
        from supervisor.ranks.process_logs import LogKeeper

        server = keeper = None
        try:
            self._link = self._new_link(after_seq)
            topo = self._topology(master_addr, master_port)
            server = LinkServer(self._link)
            env = child_env(self.job, topo, socket_path=server.path, resume_step=resume_step,
                            generation=self.generation, max_restarts=self.settings.max_group_restarts)  # fmt: skip
            store = _open_store(self.job)
            keeper = LogKeeper(store.backend, self.job.name, self.generation, self.rank)
            self._proc = RankProcess(command_line(self.job), env, cwd=os.getcwd())
            reader = keeper.follow(self._proc.start())  # this thread now lives as long as the process
            self._outcome.update(pid=self._proc.pid, argv=self._proc.argv)
            self.log.info(
                "process_started", pid=self._proc.pid, argv=self._proc.argv, local_rank=topo.local_rank
            )
            code = self._proc.wait()
            reader.join(10.0)
            keeper.close()
            server.drain()
            if code == 0:
                self._outcome.update(state="finished", exit_code=0, ended=time.time())
                self.log.info("training_finished", exit_code=0)
            else:
                tail = keeper.tail()
                cause = last_error_line(tail)
                self._outcome.update(state="failed", exit_code=code, traceback=tail,
                                     error=f"training process {describe_exit(code)}" + (f": {cause}" if cause else ""))  # fmt: skip
                self.log.error("training_failed", exit_code=code)
        except BaseException as exc:  # reported to the supervisor, which decides what to do
            self._failed(exc)
        finally:
            if self._proc is not None and self._proc.proc is not None and self._proc.proc.poll() is None:
                self._proc.terminate(1.0)
            if self._link is not None:
                self._link.close()
            if server is not None:
                server.close()
            self._done.set()

    def _topology(self, master_addr: str, master_port: int) -> Any:
        from supervisor.ranks.names import NAMESPACE, worker_actor_name
        from supervisor.ranks.process import Topology

        peers = [
            ray.get_actor(worker_actor_name(self.job.name, self.generation, r), namespace=NAMESPACE)
            for r in range(self.world_size)
        ]
        where: list[tuple[str, list[str]]] = ray.get([p.placement.remote() for p in peers], timeout=60)
        return Topology.from_peers(self.rank, [(n, list(g)) for n, g in where], master_addr, master_port)


def _open_store(job: JobSpec) -> Any:
    try:
        from supervisor.checkpoint.lifecycle import open_checkpoint_store
    except ImportError:
        return None
    return open_checkpoint_store(job)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)[:200]
