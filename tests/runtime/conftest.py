"""Shared fixtures for runtime tests: one real local Ray per module, small tinylm jobs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings

TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "data": {"max_bytes_per_source": 200_000}}


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    from supervisor.ranks.names import NAMESPACE

    ray.init(address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def make_job(tmp_path: Path, name: str, **over: Any) -> JobSpec:
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "examples.tinylm.train:main",
        "max_steps": 120,
        "config": TINY,
        "resources": {"num_workers": 2},
        "storage": {"path": str(tmp_path / "store")},
        "checkpoint": {"every_steps": 20},
        "telemetry": {"min_history": 50, "window": 200, "hang_timeout_s": 60},
    }
    spec.update(over)
    return JobSpec.model_validate(spec)


FAST = RuntimeSettings.model_validate(
    {"healthy_after_steps": 5, "step_deadline_s": 5.0, "directive_timeout_s": 60.0}
)


def wait_for(
    status: Callable[[], dict[str, Any]], pred: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """Poll ``status`` until ``pred`` holds (or the job ended); fail with the last status on timeout."""
    deadline = time.monotonic() + timeout_s
    st = status()
    while not pred(st):
        if st.get("terminal") or time.monotonic() > deadline:
            raise AssertionError(f"condition not reached; last status: {st}")
        time.sleep(0.2)
        st = status()
    return st
