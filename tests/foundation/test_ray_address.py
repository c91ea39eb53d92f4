"""Which Ray `launch` uses, with a real `ray start --head` running on the machine (issue 18), and
one real `launch` end to end beside it.

Reported: with a local cluster started by `ray start --head`, `supervisor launch job.yaml`
failed with "When connecting to an existing cluster, num_cpus and num_gpus must not be
provided", and `ray.address: local` was rejected. The head here is started by the test in
its own temp folder (``RAY_TMPDIR``), so only processes given that folder can see it, and
it is stopped by the PID of its `ray start --block` process (never `ray stop`, which kills
every Ray on the machine by name).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ours(base: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + str((proc.info["environ"] or {}).get("RAY_TMPDIR"))
        except (psutil.Error, TypeError):
            continue
        if base in text and proc.pid != os.getpid():
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, dict[str, str]]]:
    """(GCS address, environment that sees it) of a real `ray start --head` on loopback."""
    base = tempfile.mkdtemp(prefix="g1r", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_TMPDIR": base}
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
         "--include-dashboard=false", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    current = Path(base) / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 120
        while not (current.is_file() and current.read_text().strip()):
            assert proc.poll() is None, "ray start --head exited"
            assert time.monotonic() < deadline, "ray start --head did not come up in 120 s"
            time.sleep(0.5)
        address = current.read_text().strip()  # Ray names loopback by the node's IP
        assert address.endswith(f":{port}")
        yield address, env
    finally:
        proc.send_signal(signal.SIGTERM)  # --block: ray start stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        leftovers = _ours(base)
        for p in leftovers:
            p.kill()


def test_auto_joins_the_head_and_says_so(head: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    address, env = head
    job = tmp_path / "auto.yaml"
    job.write_text(yaml.safe_dump({"name": "auto", "entrypoint": "m:f", "storage": {"path": str(tmp_path)},
                                   "max_steps": 1, "ray": {"address": "auto"}}))  # fmt: skip
    script = textwrap.dedent(f"""
        import ray
        from supervisor.config.job import load_job
        from supervisor.client import cluster
        try:  # what `launch` did before: Ray's default joins the head, and refuses num_cpus there
            ray.init(num_cpus=2)
        except ValueError as exc:
            print("reproduced:", exc)
        print(cluster.connect(load_job({str(job)!r})))
        print(ray.get_runtime_context().gcs_address)
        ray.shutdown()
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.strip().splitlines()[-3:]
    assert "num_cpus and num_gpus must not be provided" in out[0], out
    assert out[1] == f"ray: joined the existing cluster at {address} (1 node, 1 CPUs)" and out[2] == address


def test_ray_failures_are_one_line_exit_3(head: tuple[str, dict[str, str]]) -> None:
    address, env = head
    exe = [sys.executable, "-m", "supervisor.cli.main"]

    def run(*args: str, **extra: str) -> tuple[int, list[str]]:
        done = subprocess.run(
            [*exe, *args], env={**env, **extra}, capture_output=True, text=True, timeout=120
        )
        assert "Traceback" not in done.stderr
        return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error: ")]

    from click.testing import CliRunner

    from supervisor.cli.main import cli

    started = time.monotonic()  # in this process: nothing listens, so Ray is never initialised here
    dead = CliRunner().invoke(cli, ["status", "--address", f"127.0.0.1:{_free_port()}"])
    assert dead.exit_code == 3 and dead.output.startswith("error: no Ray cluster reachable at 127.0.0.1:")
    assert dead.output.count("\n") == 1 and time.monotonic() - started < 60  # not Ray's minutes of retries
    code, errors = run("stop", "nosuchjob", "--address", address)
    # A token-auth head refuses a client that was not given its token (exit 3 with the hint); a
    # client that finds the token (an earlier local Ray of this session wrote it) connects and is
    # told, as bad input, that no such job runs. Either way: one line, no traceback.
    assert len(errors) == 1, errors
    assert (code == 3 and "set RAY_AUTH_MODE=token" in errors[0]) or (
        code == 2 and "no supervisor running for job 'nosuchjob'" in errors[0]
    ), (code, errors)
    code, errors = run("stop", "nosuchjob", "--address", address, RAY_AUTH_MODE="token")
    assert code == 2 and errors == ["error: no supervisor running for job 'nosuchjob'"]


TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "data": {"max_bytes_per_source": 200_000}}


def test_launch_runs_on_a_fresh_local_ray_beside_the_head(
    head: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The reported case end to end: `launch` with no address while `ray start --head` runs. Also:
    the first line says which Ray, `--set` reaches the job, `telemetry.trace` writes one JSONL
    trace per rank that `analyze` reads, `runtime:` settings load, and a finished job exits 0."""
    address, head_env = head
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "e2e-ops",
                "entrypoint": "examples.tinylm.train:main",
                "config": TINY,
                "max_steps": 1,  # raised with --set below
                "resources": {"num_workers": 2},
                "ray": {"num_cpus": 4},
                "storage": {"path": str(tmp_path / "store")},
                "checkpoint": {"every_steps": 10},
                "runtime": {"healthy_after_steps": 5, "step_deadline_s": 5, "max_group_restarts": 0},
            }
        )
    )
    trace = tmp_path / "traces" / "run.jsonl"
    env = {**head_env, "RAY_raylet_start_wait_time_s": "180"}  # a busy 2-core machine starts Ray slowly
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "launch", str(job),
         "--set", "max_steps=24", "--set", f"telemetry.trace={trace}"],
        capture_output=True, text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("ray: started a fresh local instance for this job (4 CPUs)"), done.stdout[:500]
    assert "e2e-ops: finished at step 24/24" in done.stdout
    for rank in (0, 1):
        path = trace.with_name(f"run.rank{rank}.jsonl")
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert {r["rank"] for r in records} == {rank}
        assert {r["step"] for r in records if "loss" in r} >= set(range(1, 24)), path
    analyzed = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "analyze", str(trace.with_name("run.rank0.jsonl")), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
