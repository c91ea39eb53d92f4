"""Issue 29 point 7, end to end on the ranks' side: the real link and transport over a real local
Ray. A supervisor (a stub actor answering as the real one does) watches; it goes away; after
``guard_after_steps`` steps with no answer a non-finite loss makes the rank hold at the step
boundary instead of training through; a supervisor back under the same name gets the records the
link kept (the fault, the hold) and the rank goes on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from supervisor.ranks.names import NAMESPACE, supervisor_name

JOB = "guarded"


@pytest.fixture(scope="module")
def dataset() -> Any:
    from examples.tinylm.data import build_dataset
    from tests.sdk.conftest import SEQ

    return build_dataset(seq_len=SEQ, max_bytes_per_source=40_000, seed=0)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_with_no_supervisor_answering_a_nonfinite_loss_holds_the_rank(dataset: Any) -> None:
    import ray
    import torch

    from examples.tinylm.data import collate
    from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
    from supervisor import sdk
    from supervisor.ranks.channel import RayTransport, SupervisorLink
    from tests.sdk.conftest import SEQ, poisoned, train

    # Defined here: Ray ships it by value (the workers need not import this test module).
    class StubSupervisor:
        """Answers ``ingest``, ``ingest_packed`` and ``directives`` like the supervisor actor; keeps the
        events it got."""

        def __init__(self) -> None:
            self.events: list[str] = []
            self.steps: list[int] = []

        def ingest(
            self, rank: int, batch: list[dict[str, Any]], seqs: list[int], link: str, held: Any
        ) -> dict[str, Any]:
            for rec in batch:
                self.events += [e for e in rec.get("events") or () if isinstance(e, str)]
                if not rec.get("control") and isinstance(rec.get("step"), int):
                    self.steps.append(rec["step"])
            return {"acked": max(seqs) if seqs else 0, "incarnation": "stub"}

        def ingest_packed(self, wire: Any) -> list[dict[str, Any]]:
            from supervisor.sdk.wire import unpack

            groups = unpack(wire, as_dicts=True)
            return [
                self.ingest(rank, recs, seqs or [], link or "", held)
                for rank, link, held, seqs, recs in groups
            ]

        def directives(self, rank: int, after_seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
            time.sleep(min(wait_s, 0.2))
            return []

        def seen(self) -> tuple[list[str], list[int]]:
            return self.events, self.steps

    Stub = ray.remote(StubSupervisor)

    def start_stub() -> Any:
        return Stub.options(name=supervisor_name(JOB), namespace=NAMESPACE, max_concurrency=4).remote()

    stub = start_stub()
    link = SupervisorLink(JOB, 0, buffer_records=100_000, poll_interval_s=0.05)
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, transport=RayTransport(link),
                     guard_after_steps=3, guard_after_s=0.0, freeze_poll_s=0.01)  # fmt: skip
    assert probe.steering.guard is not None
    train(model, loader, probe, 25)  # the band fills while the supervisor answers
    deadline = time.monotonic() + 60
    while link.answers < 3:
        assert time.monotonic() < deadline, "the stub supervisor never answered"
        time.sleep(0.05)

    ray.kill(stub)  # the supervisor is gone
    time.sleep(1.0)  # the link notices (its calls fail) and stops counting answers
    before = link.answers
    train(model, loader, probe, 4)  # 4 >= guard_after_steps silent steps: the guard arms
    fault = probe.step_count + 1
    done = threading.Event()

    def the_fault_and_after() -> None:
        with poisoned(model.blocks[0], True):
            train(model, loader, probe, 1)  # a NaN loss
        train(model, loader, probe, 5)
        done.set()

    th = threading.Thread(target=the_fault_and_after, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not probe.steering.frozen:
        assert time.monotonic() < deadline and not done.is_set(), "the rank trained through the fault"
        time.sleep(0.02)
    held_at = probe.step_count
    time.sleep(1.0)  # a hold, not a pause: no step while nobody answers
    assert link.answers == before and probe.step_count == held_at and not done.is_set()
    assert fault <= held_at <= fault + 1  # held at the boundary after the fault (or the one after it)

    again = start_stub()  # a supervisor is back under the same name
    th.join(60)
    assert done.is_set() and probe.step_count == fault + 5  # and then it trained on
    deadline = time.monotonic() + 30
    while True:
        events, steps = ray.get(again.seen.remote(), timeout=30)
        if f"guard_released:{held_at}" in events or time.monotonic() > deadline:
            break
        link.flush(0.5)
    assert f"guard_held:{held_at}" in events and f"guard_released:{held_at}" in events, events
    assert fault in steps  # the records of the unwatched steps were kept and arrive
    probe.close()
