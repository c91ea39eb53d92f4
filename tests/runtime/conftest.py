"""Shared fixtures for runtime tests: one real local Ray per module, small tinylm jobs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.errors import RuntimeBackendError

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
    """Poll ``status`` until ``pred`` holds (or the job ended); fail with the last status on timeout.
    A supervisor too busy to answer one call in time (``api.status``'s ``GetTimeoutError``: a just
    placed actor on a loaded machine) is asked again until the deadline; a dead one fails at once."""
    deadline = time.monotonic() + timeout_s

    def poll() -> dict[str, Any] | None:
        try:
            return status()
        except RuntimeBackendError as exc:
            if not isinstance(exc.__context__, GetTimeoutError):
                raise
            return None

    st = poll()
    while st is None or not pred(st):
        if (st is not None and st.get("terminal")) or time.monotonic() > deadline:
            last = "no answer in time (GetTimeoutError)" if st is None else st
            raise AssertionError(f"condition not reached; last status: {last}")
        time.sleep(0.2)
        st = poll()
    return st
