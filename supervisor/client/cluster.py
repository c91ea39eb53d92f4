"""Connecting to Ray: a fresh local instance when the job names no address, a cluster otherwise.

``ray.address`` absent or ``local``: a foreground ``launch`` starts a fresh in-process Ray that
lives as long as the command, even when another Ray runs on the machine (neither
``$RAY_ADDRESS`` nor the last ``ray start`` is joined). ``--detach`` needs a Ray that outlives
the command: it joins the local head of ``ray start --head``, or starts one. ``auto``,
``host:port`` and ``ray://host:port`` join that cluster. What happened is one line
(``describe``); every failure is one ``RuntimeBackendError`` line, and an address where nothing
listens fails in seconds instead of Ray's minutes of retries.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import ray

from supervisor.config.job import JobSpec
from supervisor.errors import RuntimeBackendError
from supervisor.logging import get_logger
from supervisor.ranks.names import NAMESPACE

log = get_logger("supervisor.client.cluster")

PROBE_TIMEOUT_S = 5.0
"""How long a TCP connect to a cluster's address may take before it counts as unreachable."""
HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node alone."""


def head_node_id() -> str | None:
    for node in ray.nodes():
        resources = node.get("Resources")
        if node.get("Alive") and isinstance(resources, dict) and HEAD_RESOURCE in resources:
            return str(node["NodeID"])
    return None


def needed_cpus(job: JobSpec) -> int:
    """Logical CPUs a local Ray needs for this job: the workers, a replay task, and headroom."""
    return max(4, int(job.resources.num_workers * job.resources.cpus_per_worker + 2 + 0.999))


def connect(job: JobSpec, *, persistent: bool = False) -> str:
    """Returns one line saying which Ray this process joined or started."""
    if ray.is_initialized():
        return describe(joined=True)
    address = job.ray.address
    if address in (None, "local"):
        if persistent:
            started = _ensure_local_head(job.ray.num_cpus or needed_cpus(job))
            _init("auto", job, log_to_driver=False)
            return describe(joined=not started)
        _init("local", job, num_cpus=job.ray.num_cpus or needed_cpus(job))
        return describe(joined=False)
    _init(address, job)
    return describe(joined=True)


def _init(
    address: str, job: JobSpec | None, *, num_cpus: int | None = None, log_to_driver: bool = True
) -> None:
    local = address == "local"
    if not local:
        _probe(address)
    kwargs: dict[str, object] = {"address": address, "namespace": NAMESPACE}
    if job is not None and job.ray.runtime_env:
        kwargs["runtime_env"] = job.ray.runtime_env
    if local:
        # On a terminal the live display is the output; worker logs stay in Ray's session
        # log folder (named in the first line). Piped, they go to stderr as JSON lines.
        kwargs.update(num_cpus=num_cpus, include_dashboard=False, log_to_driver=not sys.stdout.isatty())
    else:
        kwargs["log_to_driver"] = log_to_driver
    where = "a new local instance" if local else address
    try:
        ray.init(**kwargs)  # type: ignore[arg-type]
    except Exception as exc:  # any failure inside Ray's start-up is one line, never a traceback
        raise RuntimeBackendError(
            f"cannot connect to Ray at {where}: {_first_line(exc)}{_auth_hint(address)}"
        ) from None
    log.info("ray_connected", address=address, resources=ray.cluster_resources(), logs=_local_logs_dir())


def describe(*, joined: bool) -> str:
    resources = ray.cluster_resources()
    cpus = int(resources.get("CPU", 0))
    gpus = int(resources.get("GPU", 0))
    offer = f"{cpus} CPUs" + (f", {gpus} GPUs" if gpus else "")
    if joined:
        address = ray.get_runtime_context().gcs_address
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        return f"ray: joined the existing cluster at {address} ({nodes} node{'s' * (nodes != 1)}, {offer})"
    logs = _local_logs_dir()
    return f"ray: started a fresh local instance for this job ({offer})" + (
        f"; worker logs in {logs}" if logs else ""
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
        _init(address or "auto", None, log_to_driver=False)
    except RuntimeBackendError as exc:
        raise RuntimeBackendError(f"{exc.message}; pass --address or start the job first") from None


def _probe(address: str) -> None:
    target = address
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            target = canonicalize_bootstrap_address("auto") or ""
        except Exception as exc:  # Ray found no cluster on this machine
            raise RuntimeBackendError(f"no Ray cluster found for `auto`: {_first_line(exc)}") from None
    host, _, port = target.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=PROBE_TIMEOUT_S):
            return
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise RuntimeBackendError(f"no Ray cluster reachable at {target} ({detail})") from None


def _auth_hint(address: str) -> str:
    """Ray sends its token only to clusters it found itself: an explicit address needs RAY_AUTH_MODE."""
    if address in ("local", "auto") or os.environ.get("RAY_AUTH_MODE"):
        return ""
    if not (os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").is_file()):
        return ""
    return " (if the cluster uses token authentication, the default of `ray start`, set RAY_AUTH_MODE=token)"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _last_started_head() -> str | None:
    """The address the last ``ray start`` on this machine wrote to Ray's temp folder, or None.
    Not Ray's ``auto``: that falls back to any Ray process it finds on the machine (another
    user's ``ray.init()``, a benchmark's private instance) and a detached job would join it."""
    from ray._private.services import find_bootstrap_address

    try:
        return find_bootstrap_address(None) or None
    except Exception:  # an unreadable address file is no head
        return None


GCS_PORT = 6379
"""The port ``ray start --head`` takes by default; a head started here takes a free one when another
program (a Redis server, another user's head) listens there, where Ray would fail to start."""


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def _ensure_local_head(num_cpus: int) -> bool:
    """Join the local head started with ``ray start``, or start one; True when it was started here."""
    address = _last_started_head()
    if address is not None:
        try:
            _probe(address)
            return False
        except RuntimeBackendError:
            log.info("ray_head_gone", address=address)  # a stale address file: start a new head
    exe = Path(sys.executable).with_name("ray")
    cmd = [str(exe) if exe.exists() else (shutil.which("ray") or "ray")]
    cmd += ["start", "--head", f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    if _port_taken(GCS_PORT):
        log.info("ray_default_port_taken", port=GCS_PORT, why="the head takes a free port")
        cmd.append("--port=0")
    log.info("ray_start_head", cmd=" ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeBackendError(f"`ray start --head` failed (exit {done.returncode}): {last[:300]}")
    return True
