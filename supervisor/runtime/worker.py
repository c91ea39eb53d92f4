"""One rank of the worker group: a Ray actor that joins torch.distributed and runs the job.

The actor is detached and named (``worker:<job>:<rank>``) so that it belongs to the cluster,
not to the supervisor that created it: a supervisor that dies leaves training running, and a
restarted supervisor finds the workers by name. Training runs in a thread of the actor so the
actor keeps answering ``status`` / ``wait`` while a step is in progress.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import ray

from supervisor.config.job import JobSpec
from supervisor.logging import configure as configure_logging
from supervisor.logging import get_logger
from supervisor.runtime.channel import SupervisorLink
from supervisor.runtime.context import WorkerContext
from supervisor.runtime.settings import RuntimeSettings


class TrainWorker:
    """Ray actor body (wrapped with ``ray.remote`` by :mod:`supervisor.runtime.group`)."""

    def __init__(
        self, job: dict[str, Any], rank: int, world_size: int, generation: int, settings: dict[str, Any]
    ):
        self.job = JobSpec.model_validate(job)
        self.rank = rank
        self.world_size = world_size
        self.generation = generation
        self.settings = RuntimeSettings.model_validate(settings)
        configure_logging(self.settings.log_level)
        self.log = get_logger(
            "supervisor.runtime.worker", job=self.job.name, rank=rank, generation=generation
        )
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._outcome: dict[str, Any] = {"state": "idle"}
        self._link: SupervisorLink | None = None

    def pid(self) -> int:
        return os.getpid()

    def spec(self) -> dict[str, Any]:
        """The job spec this worker runs (lets `launch --attach JOB` work without the job file)."""
        return self.job.model_dump(mode="json")

    def address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port, for rank 0's rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def start(self, master_addr: str, master_port: int, resume_step: int | None, after_seq: int = 0) -> None:
        """Begin training in a background thread; returns at once."""
        if self._thread is not None:
            return
        self._outcome = {"state": "running", "resume_step": resume_step, "started": time.time()}
        self._thread = threading.Thread(
            target=self._train,
            args=(master_addr, master_port, resume_step, after_seq),
            name="train",
            daemon=True,
        )
        self._thread.start()

    def wait(self) -> dict[str, Any]:
        """Block until training ends; the outcome (finished / failed with the error)."""
        self._done.wait()
        return self.status()

    def status(self) -> dict[str, Any]:
        out = dict(self._outcome)
        out.update(rank=self.rank, generation=self.generation, pid=os.getpid())
        if self._link is not None:
            out["link"] = self._link.stats()
        return out

    # -- the training thread -----------------------------------------------------------------
    def _train(self, master_addr: str, master_port: int, resume_step: int | None, after_seq: int) -> None:
        import torch
        import torch.distributed as dist

        from supervisor.runtime.entrypoint import resolve
        from supervisor.runtime.transport import make_transport

        torch.set_num_threads(max(1, int(self.job.resources.cpus_per_worker)))
        use_cuda = self.job.resources.gpus_per_worker > 0
        try:
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo",
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=self.settings.dist_timeout_s),
            )
            if use_cuda:
                torch.cuda.set_device(0)
            self._link = SupervisorLink(
                self.job.name,
                self.rank,
                buffer_records=self.settings.buffer_records,
                poll_interval_s=self.settings.poll_interval_s,
                after_seq=after_seq,
            )
            ctx = WorkerContext(
                rank=self.rank,
                world_size=self.world_size,
                job=self.job,
                transport=make_transport(self._link, flush_interval_s=self.settings.flush_interval_s),
                resume_step=resume_step,
                generation=self.generation,
                device="cuda" if use_cuda else "cpu",
                checkpoint_store=_open_store(self.job),
            )
            result = resolve(self.job.entrypoint)(dict(self.job.config), ctx)
            _close(ctx.transport)
            self._outcome.update(state="finished", result=_plain(result), ended=time.time())
            self.log.info("training_finished")
        except BaseException as exc:  # reported to the supervisor, which decides what to do
            self._outcome.update(
                state="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:]
            )
            self.log.error("training_failed", error=repr(exc))
        finally:
            if self._link is not None:
                self._link.close()
            if dist.is_initialized():
                # The user's model (DDP) holds the process group inside reference cycles; free it
                # while the interpreter is whole rather than at actor exit, where gloo can abort.
                gc.collect()
                dist.destroy_process_group()
            self._done.set()


def _open_store(job: JobSpec) -> Any:
    """The job's CheckpointStore, or None when the checkpoint package is not available."""
    try:
        from supervisor.runtime.stores import open_checkpoint_store
    except ImportError:
        return None
    return open_checkpoint_store(job)


def _close(transport: Any) -> None:
    close = getattr(transport, "close", None)
    if callable(close):
        close()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)[:200]
