"""The ranks' own guard while no supervisor answers (issue 29 point 7): sdk/guard.py.

Unit tests on synthetic records with a fake clock, then the real steering loop on a tiny
model: a non-finite step while the supervisor is silent holds every rank at the boundary
until the supervisor answers again.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from supervisor import sdk
from supervisor.sdk.guard import Guard
from supervisor.sdk.steering import _guard_for
from tests.sdk.conftest import make_run, poisoned, train


def rec(step: int, loss: float, update: float = 0.1) -> dict[str, Any]:
    return {"step": step, "loss": loss, "update_norm": update * (1 + 0.01 * (step % 7)), "param_norm": 100.0}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def guard(answers: list[int], clock: Clock) -> Guard:
    return Guard(lambda: answers[0], after_steps=5, after_s=10.0, z=12.0, hold_s=60.0, clock=clock)


def healthy(g: Guard, clock: Clock, steps: range, answers: list[int] | None = None) -> None:
    for s in steps:
        g.observe(rec(s, 3.0 - 0.001 * s + 0.01 * math.sin(s)))
        clock.t += 1.0
        if answers is not None:
            answers[0] += 1
        assert g.at_boundary(False) is None


def test_a_severe_step_holds_only_while_the_supervisor_is_silent() -> None:
    answers, clock = [0], Clock()
    g = guard(answers, clock)
    healthy(g, clock, range(1, 40), answers)  # the supervisor answers every step
    g.observe(rec(40, math.nan))
    answers[0] += 1
    assert g.at_boundary(False) is None  # it is watching: the supervisor handles it
    healthy(g, clock, range(41, 50))  # silent from here: 9 steps, 9 s (not yet 10 s)
    g.observe(rec(50, 30.0))
    assert g.at_boundary(False) is None
    healthy(g, clock, range(51, 53))
    g.observe(rec(53, 30.0))
    why = g.at_boundary(False)
    assert why is not None and "loss 30 is" in why and "no answer from the supervisor" in why
    assert g.release_due() is None
    answers[0] += 1
    assert g.release_due() == "the supervisor answers again"


def test_the_update_ratio_and_a_bounded_hold() -> None:
    answers, clock = [0], Clock()
    g = guard(answers, clock)
    healthy(g, clock, range(1, 40))
    g.observe(rec(40, 2.96, update=5.0))  # the loss looks fine; the update is 50x its band
    why = g.at_boundary(False)
    assert why is not None and "update ratio" in why
    clock.t += 61
    released = g.release_due()
    assert released is not None and "guard_hold_s=60" in released
    g.observe(rec(41, math.nan))
    clock.t += 20
    for _ in range(6):
        assert g.at_boundary(False) is None  # disarmed until the supervisor answers again
    answers[0] += 1
    assert g.at_boundary(False) is None  # an answer re-arms it (after the silence again)


def test_off_and_offline_mean_no_guard(dataset: Any) -> None:
    *_, probe, _ = make_run(dataset)  # a MemoryTransport: no supervisor at the other end
    assert probe.steering.guard is None
    transport = sdk.MemoryTransport(answers=lambda: 0)
    assert (
        _guard_for(type("P", (), {"settings": sdk.ProbeSettings(guard=False), "transport": transport}))
        is None
    )
    assert _guard_for(type("P", (), {"settings": sdk.ProbeSettings(), "transport": transport})) is not None


def test_ranks_hold_at_the_boundary_until_the_supervisor_answers(dataset: Any) -> None:
    import torch

    from examples.tinylm.data import collate
    from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
    from tests.sdk.conftest import SEQ

    answers = [0]
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01, answers=lambda: answers[0])
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, transport=transport, guard_after_steps=2,
                     guard_after_s=0.0, freeze_poll_s=0.01)  # fmt: skip
    assert probe.steering.guard is not None
    train(model, loader, probe, 25)  # the band fills; nobody answers (the supervisor is gone)

    def events() -> list[str]:
        return [e for r in list(transport.records) for e in r.get("events", [])]

    done = threading.Event()

    def poisoned_steps() -> None:
        with poisoned(model.blocks[0], True):
            train(model, loader, probe, 1)  # step 26: NaN
        train(model, loader, probe, 3)  # the hold comes at a boundary after it
        done.set()

    th = threading.Thread(target=poisoned_steps)
    th.start()
    deadline = time.monotonic() + 30
    while not any(e.startswith("guard_held:") for e in events()):
        assert time.monotonic() < deadline, "the ranks never held"
        transport.flush(0.05)
    held_at = probe.step_count
    time.sleep(0.3)  # a hold, not a pause: no step while nobody answers
    assert probe.step_count == held_at and not done.is_set() and held_at <= 28
    answers[0] += 1  # the supervisor is back
    th.join(30)
    assert done.is_set() and probe.step_count == 29
    assert transport.flush(30)  # the release's record may still be in the transport's buffer
    assert f"guard_released:{held_at}" in events()
