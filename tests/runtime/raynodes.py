"""Real Ray nodes for tests: ``ray start --block`` subprocesses on loopback, each with its own
temp folder and ports, stopped by the PIDs this module started (never ``ray stop``, which would
stop every Ray on the machine, other users' included).

A second node gets its own loopback address (``127.0.0.2``): two raylets on one address make a
driver's choice of node ambiguous, which no real two-machine cluster has.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` right now (held open together, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


STARTED = b"Ray runtime started."
"""What ``ray start`` prints once its node runs (head or worker)."""

WORKER_PORTS = 61
"""The size of a node's worker port range (``--min-worker-port`` .. ``--max-worker-port``)."""


def worker_ports_low(taken: list[int], host: str = "127.0.0.1", tries: int = 50) -> int:
    """The first port of a free worker port range that holds none of the node's other ``taken``
    ports: `ray start` refuses to start when they overlap (a head that never listened)."""
    for _ in range(tries):
        low = free_ports(1, host)[0]
        if low + WORKER_PORTS - 1 <= 65535 and not any(low <= p < low + WORKER_PORTS for p in taken):
            return low
    raise RuntimeError(f"no worker port range clear of {taken} in {tries} tries")


def _ray_exe() -> str:
    return str(Path(sys.executable).with_name("ray"))


class RayNode:
    """One ``ray start --block`` process and the Ray processes under it."""

    def __init__(self, ip: str, temp_dir: Path, *, num_cpus: int, head_address: str | None = None,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.ip = ip
        self.head = head_address is None
        self.seen: dict[int, psutil.Process] = {}
        ports = free_ports(8, ip)
        gcs, nm, om, agent, agent_grpc, metrics, renv, client = ports
        low = worker_ports_low(ports, ip)
        cmd = [_ray_exe(), "start", "--block", f"--node-ip-address={ip}", f"--num-cpus={num_cpus}",
               f"--node-manager-port={nm}", f"--object-manager-port={om}",
               f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={renv}",
               f"--min-worker-port={low}", f"--max-worker-port={low + WORKER_PORTS - 1}",
               "--disable-usage-stats", "--object-store-memory=100000000"]  # fmt: skip
        if self.head:
            cmd += ["--head", f"--port={gcs}", f"--ray-client-server-port={client}",
                    "--include-dashboard=false", f"--temp-dir={temp_dir}"]  # fmt: skip
            self.address = f"{ip}:{gcs}"
        else:
            cmd += [f"--address={head_address}"]
            self.address = head_address
        self.log_path = temp_dir.parent / f"ray-start-{ip}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})  # fmt: skip

    def running(self) -> bool:
        """True while ``ray start`` runs; raises, with the end of its log, once it has exited."""
        if self.proc.poll() is None:
            return True
        self.log.flush()
        tail = (self.log_path.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"`ray start` on {self.ip} exited {self.proc.returncode}: {tail}")

    def up(self) -> bool:
        """True once ``ray start`` says its node runs; raises (``running``) once it has exited."""
        self.log.flush()
        return self.running() and STARTED in self.log_path.read_bytes()

    def pids(self) -> list[int]:
        """The ``ray start`` process and every process under it, as it is now."""
        try:
            parent = psutil.Process(self.proc.pid)
            return [parent.pid] + [c.pid for c in parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def raylet_pid(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    if child.name() == "raylet":
                        return child.pid
            if self.proc.poll() is not None:
                raise RuntimeError(f"`ray start` on {self.ip} exited {self.proc.returncode}")
            time.sleep(0.2)
        raise RuntimeError(f"no raylet under `ray start` on {self.ip} within {timeout_s:.0f}s")

    def _remember(self) -> None:
        """Note the processes under ``ray start`` now: once the raylet is gone, the workers it
        started are no longer below it, and ``stop`` must still find them. Process objects, not
        bare PIDs: psutil checks a PID is still the same process before it signals it."""
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                self.seen.setdefault(pid, psutil.Process(pid))

    def kill_raylet(self) -> int:
        pid = self.raylet_pid()
        self._remember()
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, grace_s: float = 10.0) -> None:
        """Kill what this node started, by PID: every process under ``ray start`` (now, or when its
        raylet was killed), then ``ray start`` itself."""
        self._remember()
        procs = list(self.seen.values())
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        self.log.close()


def join(ip: str, temp_dir: Path, head_address: str, *, num_cpus: int, env: dict[str, str],
         tries: int = 3, timeout_s: float = 120.0) -> RayNode:  # fmt: skip
    """A worker node joined to ``head_address``, once ``ray start`` says it runs. Ray gives a joining
    raylet 30 s to register (``ray/_private/node.py``), which a loaded machine can exceed: ``ray
    start`` then exits, and the node is stopped by PID and started again, up to ``tries`` times."""
    for attempt in range(1, tries + 1):
        node = RayNode(ip, temp_dir, num_cpus=num_cpus, head_address=head_address, env=env)
        deadline = time.monotonic() + timeout_s
        try:
            while not node.up():
                if time.monotonic() > deadline:
                    tail = node.log_path.read_text(errors="replace").strip().splitlines()[-8:]
                    raise RuntimeError(f"`ray start` on {ip} did not start its node within {timeout_s:.0f}s; "
                                       f"its log ends: {' | '.join(tail) or '(no output)'}")  # fmt: skip
                time.sleep(0.2)
            return node
        except RuntimeError:
            node.stop()
            if attempt == tries:
                raise
    raise AssertionError("tries must be at least 1")
