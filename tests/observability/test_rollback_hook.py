"""The rollback hook for the user's logger: a real in-place rollback in the SDK calls it once,
with the target, before the next step trains; a logging step built on it never goes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import sdk
from supervisor.checkpoint import CheckpointStore
from supervisor.observability import hooks
from supervisor.storage import open_backend
from tests.sdk.conftest import SEQ, build_dataset, make_run


@pytest.fixture
def registered() -> Iterator[list[Any]]:
    before = list(hooks._callbacks)
    yield hooks._callbacks
    hooks._callbacks[:] = before


@pytest.mark.slow
def test_hook_runs_at_the_rollback_before_training_resumes(tmp_path: Path, registered: list[Any]) -> None:
    from examples.tinylm.model import lm_loss

    dataset = build_dataset(seq_len=SEQ, max_bytes_per_source=40_000, seed=0)
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    model, _, _, loader, probe, transport = make_run(dataset, checkpoint=store, checkpoint_every=4)
    seen: list[tuple[hooks.Rollback, int]] = []
    hooks.on_rollback(lambda rb: seen.append((rb, probe.step_count)))
    log_step = hooks.MonotonicStep()

    def broken(rb: hooks.Rollback) -> None:
        raise RuntimeError("logger offline")

    hooks.on_rollback(broken)  # a failing logger is skipped, training goes on
    logged: list[int] = []
    for trained, batch in enumerate(loader, start=1):
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
        logged.append(log_step(probe.step_count))
        if trained == 10:  # applied at the next step boundary, after step 10
            transport.deliver(sdk.RollbackInPlace(step=4, id="rb1"))
        if trained == 14:
            break
    probe.close()

    assert [(rb.from_step, rb.to_step) for rb, _ in seen] == [(10, 4)]
    assert seen[0][1] == 4  # the state is already back at the target: nothing trained on it yet
    assert logged == list(range(1, 15))  # steps 5..8 of the new timeline log as 11..14
    assert all(b > a for a, b in zip(logged, logged[1:], strict=False))


def test_monotonic_step_and_registration(registered: list[Any]) -> None:
    ms = hooks.MonotonicStep()
    assert ms(7) == 7
    hooks.notify_rollback(257, 150)
    assert ms(151) == 258
    hooks.notify_rollback(300, 280)
    assert ms(281) == 281 + 107 + 20
    hooks.remove(ms.rolled_back)
    hooks.notify_rollback(500, 100)
    assert ms(101) == 101 + 127
