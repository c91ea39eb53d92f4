"""Connecting to Ray: a local instance when the job names no address, a cluster otherwise.

A foreground ``launch`` without an address starts an in-process local Ray that lives as long
as the command. ``--detach`` needs a Ray that outlives the command, so it starts (or reuses)
a local head with Ray's own ``ray start --head`` and connects to it with ``address=auto``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import ray

from supervisor.config.job import JobSpec
from supervisor.errors import RuntimeBackendError
from supervisor.logging import get_logger
from supervisor.runtime.names import NAMESPACE

log = get_logger("supervisor.runtime.cluster")


def needed_cpus(job: JobSpec) -> int:
    """Logical CPUs a local Ray needs for this job: the workers, a replay task, and headroom."""
    return max(4, int(job.resources.num_workers * job.resources.cpus_per_worker + 2 + 0.999))


def connect(job: JobSpec, *, persistent: bool = False) -> None:
    """Connect this process to the Ray the job names (idempotent when already connected)."""
    if ray.is_initialized():
        return
    address = job.ray.address
    if address is None and persistent:
        _ensure_local_head(job.ray.num_cpus or needed_cpus(job))
        address = "auto"
    try:
        if address is None:
            ray.init(
                num_cpus=job.ray.num_cpus or needed_cpus(job),
                namespace=NAMESPACE,
                include_dashboard=False,
                runtime_env=job.ray.runtime_env or None,
                # On a terminal the live display is the output; worker logs stay in Ray's
                # session log folder (printed below). Piped, they go to stderr as JSON lines.
                log_to_driver=not sys.stdout.isatty(),
            )
        else:
            ray.init(address=address, namespace=NAMESPACE, runtime_env=job.ray.runtime_env or None)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RuntimeBackendError(
            f"cannot connect to Ray at {address or 'a new local instance'}: {exc}"
        ) from None
    log.info(
        "ray_connected",
        address=address or "local",
        resources=ray.cluster_resources(),
        logs=_local_logs_dir() if address is None else None,
    )


def _local_logs_dir() -> str | None:
    """Where a local Ray keeps worker logs (Ray has no public call for it; None if it moved)."""
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    return node.get_logs_dir_path() if node is not None else None


def connect_existing(address: str | None) -> None:
    """Connect to a running Ray (for status / stop / attach); never starts one."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RuntimeBackendError(
            f"no Ray cluster reachable at {address or 'auto'} ({exc}); pass --address or start the job first"
        ) from None


def _ensure_local_head(num_cpus: int) -> None:
    try:
        ray.init(address="auto", namespace=NAMESPACE, log_to_driver=False)
        ray.shutdown()
        return
    except (ConnectionError, RuntimeError, ValueError):
        pass
    exe = Path(sys.executable).with_name("ray")
    cmd = [str(exe) if exe.exists() else (shutil.which("ray") or "ray")]
    cmd += ["start", "--head", f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    log.info("ray_start_head", cmd=" ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeBackendError(f"`ray start --head` failed: {done.stderr.strip()[-300:]}")
