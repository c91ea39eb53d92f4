"""A command entrypoint's training process: one per rank, started by that rank's worker actor.

The process gets the environment torchrun would give it (``child_env``) plus ``SUPERVISOR_*``:
the actor's socket (:mod:`supervisor.sdk.local_link`), the job spec, the resume step and the
generation. It calls ``init_process_group()`` itself and trains on its own main thread, so
``signal.signal`` and everything else a script does under torchrun works.

Hazard: the actor may be killed outright (``ray.kill``, a lost node). The process must not
outlive it, or a new generation would train beside an orphan: it is started with
``PR_SET_PDEATHSIG`` = SIGKILL, which the kernel delivers when the thread that started it
dies, so that thread is the one that waits for the process for its whole life.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

from supervisor.config.job import JobSpec
from supervisor.ranks.rendezvous import AGENT_STORE_ENV
from supervisor.sdk.context import GENERATION_ENV, JOB_ENV, RESUME_ENV
from supervisor.sdk.local_link import SOCKET_ENV

#: Seconds between SIGTERM and SIGKILL when a rank's process is stopped.
STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Topology:
    """Where a rank sits: what torchrun computes from its nodes and ``--nproc_per_node``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    cuda_devices: tuple[str, ...] = ()
    """GPU ids of this node's ranks, in local-rank order (``CUDA_VISIBLE_DEVICES``)."""

    @classmethod
    def from_peers(
        cls, rank: int, peers: list[tuple[str, list[str]]], master_addr: str, master_port: int
    ) -> Topology:
        """``peers[r]`` is rank r's (node id, GPU ids): ranks on one node form one torchrun "group"."""
        node = peers[rank][0]
        nodes = list(dict.fromkeys(n for n, _ in peers))  # first-appearance order = group rank
        local = [r for r, (n, _) in enumerate(peers) if n == node]
        devices = tuple(g for r in local for g in peers[r][1])
        return cls(
            rank=rank,
            world_size=len(peers),
            local_rank=local.index(rank),
            local_world_size=len(local),
            group_rank=nodes.index(node),
            group_world_size=len(nodes),
            master_addr=master_addr,
            master_port=master_port,
            cuda_devices=devices,
        )


def command_line(job: JobSpec) -> list[str]:
    """argv of the job's command: ``python`` means this interpreter; a bare ``x.py`` gets one."""
    argv = shlex.split(job.entrypoint)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    elif argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    return argv + list(job.args or [])


def child_env(
    job: JobSpec,
    topo: Topology,
    *,
    socket_path: str,
    resume_step: int | None,
    generation: int,
    max_restarts: int,
) -> dict[str, str]:
    env = dict(os.environ)
    # The job's own modules and the supervisor package resolve as they do in this actor.
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
    env.update(
        RANK=str(topo.rank),
        WORLD_SIZE=str(topo.world_size),
        LOCAL_RANK=str(topo.local_rank),
        LOCAL_WORLD_SIZE=str(topo.local_world_size),
        GROUP_RANK=str(topo.group_rank),
        GROUP_WORLD_SIZE=str(topo.group_world_size),
        ROLE_RANK=str(topo.rank),
        ROLE_WORLD_SIZE=str(topo.world_size),
        ROLE_NAME="default",
        MASTER_ADDR=topo.master_addr,
        MASTER_PORT=str(topo.master_port),
        TORCHELASTIC_RUN_ID=f"{job.name}-{generation}",
        TORCHELASTIC_RESTART_COUNT=str(generation),
        TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
        OMP_NUM_THREADS=str(max(1, int(job.resources.cpus_per_worker))),
        PYTHONUNBUFFERED="1",
    )
    env[AGENT_STORE_ENV] = "True"  # rank 0's actor hosts the store at MASTER_PORT, as torchrun's agent does
    env[SOCKET_ENV] = socket_path
    env[JOB_ENV] = json.dumps(job.model_dump(mode="json"))
    env[GENERATION_ENV] = str(generation)
    env.pop(RESUME_ENV, None)
    if resume_step is not None:
        env[RESUME_ENV] = str(resume_step)
    if job.resources.gpus_per_worker > 0 and topo.cuda_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(topo.cuda_devices)
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RankProcess:
    """The rank's training process: started, watched and stopped by the actor's training thread."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> IO[bytes]:
        """Its own session: signals reach its whole process group. Returns its output."""
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        assert self.proc.stdout is not None
        return self.proc.stdout

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def terminate(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the process group, ``grace_s`` to exit, then SIGKILL; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        if proc.poll() is None:
            self._signal(signal.SIGKILL)
        return proc.wait()

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


_ERROR_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b.*)$"
)


def last_error_line(output: str, limit: int = 300) -> str | None:
    """The last ``SomeError: message`` line of a process's output (a Python traceback's final
    line, torchrun's ``[rankN]:`` prefix removed), so a failure names its cause; None if none."""
    for line in reversed(output.splitlines()):
        found = _ERROR_LINE.match(line.strip())
        if found:
            return found.group(1)[:limit]
    return None
