"""A supervisor slower than its ranks keeps a bounded queue: the records wait in the ranks' links.

Found with ``python -m bench.scale --ranks 256 --steps 20000 --step-time 0`` (ranks as fast as the
supervisor takes them): ``ingest_batch`` queued every batch and answered at once, so the queue held
whatever the links had (up to ranks x ``buffer_records``): the supervisor's RSS swung between 1.0
and 5.1 GB. Now a batch that finds the queue over ``MAX_QUEUED_RECORDS`` is refused with
``resend_from`` (and ``busy``): the link keeps it, within its own bound, and sends it again later;
nothing is lost and the detector sees every step once, in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.runtime import controller as controller_mod
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeWorkers


def _rec(step: int, rank: int) -> dict[str, Any]:
    return {"step": step, "rank": rank, "world_size": 2, "loss": 3.0, "grad_norm": 1.0, "lr": 1e-3}


def test_a_full_queue_refuses_the_batch_and_the_resend_is_taken(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(controller_mod, "MAX_QUEUED_RECORDS", 50)
    ctl = Controller(make_job(tmp_path, "bp", max_steps=1000), FAST, workers=FakeWorkers())
    ctl.boot()
    sent: dict[int, list[int]] = {0: [], 1: []}
    refused = 0
    for rank in (0, 1):
        for first in range(1, 101, 10):  # ten batches of ten records per rank, nothing consumed meanwhile
            seqs = list(range(first, first + 10))
            reply = ctl.ingest_batch(rank, [_rec(s, rank) for s in seqs], seqs, f"link{rank}", (1, seqs[-1]))
            if "resend_from" in reply:
                assert reply["resend_from"] == first and reply.get("busy") is True
                refused += 1
                break
            sent[rank] += seqs
    assert refused == 2, "each link's batch past the bound is refused"
    assert sum(len(v) for v in sent.values()) <= 50 + 10  # the queue never holds much more than the bound
    ctl.iterate()
    # The links send again from where they were refused: accepted now that the queue drained.
    for rank in (0, 1):
        first = len(sent[rank]) + 1
        seqs = list(range(first, 101))
        reply = ctl.ingest_batch(rank, [_rec(s, rank) for s in seqs], seqs, f"link{rank}", (1, 100))
        assert "resend_from" not in reply
        ctl.iterate()
    for _ in range(3):
        ctl.iterate()
    assert ctl.assembler.watermark == 100 and ctl.status()["records_lost"] == 0
