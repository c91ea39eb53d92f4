"""A harness that runs the real controller against a replayed trace, with a fake worker group.

Real: the controller loop (``Controller.iterate``), the detector, the policy engine, the
incident store (SQLite), the checkpoint store (local files), the directive log, the record
receipts and the runtime state file. Fake: the workers. ``FakeRanks`` plays every rank: it
sends numbered records of a synthetic trace through ``send`` (as a worker link does),
keeps what the supervisor has not durably accepted and sends it again when asked,
and answers directives the way the SDK's steering does (acknowledgements as control
messages, a freeze parks, a rollback rewinds the step counter, ranks hold at the last step
until ``finish``/``stop``). ``FakeWorkers`` stands in for worker supervision and reports the
events a test queues.

How it differs from production:
- no Ray, no processes: the test calls ``iterate`` and advances the ranks itself, so every
  interleaving is deterministic; a "kill" is dropping the controller object between calls;
- records are synthetic (loss, grad norm, LR, throughput; one spike where the test puts it);
  no model is trained, so a rollback restores no weights -- the trace simply continues;
- one ``send`` call per step and rank, answered at once (the real link batches);
- checkpoints are written by the test when it needs a rollback or restart target.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from supervisor.errors import RuntimeBackendError
from supervisor.runtime.controller import Controller
from supervisor.runtime.restarts import GroupEvent
from supervisor.sdk.wire import pack

Loss = Callable[[int, int], float]


def send(ctl: Any, rank: int, batch: list[dict[str, Any]], seqs: list[int] | None = None,
         link: str | None = None, held: tuple[int, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """One link's batch into the controller as the actor takes it (packed, ``Controller.ingest_wire``),
    and that link's answer."""
    reply: dict[str, Any] = ctl.ingest_wire(pack([(rank, link, held, seqs, batch)]))[0]
    return reply


def calm(step: int, rank: int) -> float:
    return 3.0 - 0.001 * step


def spikes_once(*steps: int, factor: float = 8.0) -> Loss:
    """A one-step loss spike on rank 0 at each of ``steps``, each only the first time the trace
    reaches it (a fault a rollback cures; the next one is the fault coming back)."""
    fired: set[int] = set()

    def loss(step: int, rank: int) -> float:
        if step in steps and step not in fired and rank == 0:
            fired.add(step)
            return calm(step, rank) * factor
        return calm(step, rank)

    return loss


def spike_at(at: int, factor: float = 8.0) -> Loss:
    """A one-step loss spike on rank 0 at step ``at`` (repeated wherever the trace reaches ``at``)."""

    def loss(step: int, rank: int) -> float:
        return calm(step, rank) * (factor if step == at and rank == 0 else 1.0)

    return loss


@dataclass
class FakeRanks:
    """Every rank of one worker generation, driven one step at a time."""

    world_size: int
    max_steps: int
    loss: Loss = calm
    step: int = 0
    generation: int = 0
    after_seq: int = 0
    frozen: bool = False
    ended: bool = False
    applied: list[dict[str, Any]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    grads_follow_loss: bool = False
    """A spike moves the grad norm and the update with the loss (an optimizer fault, not a metric
    artifact); by default only the loss moves."""
    on_checkpoint: Callable[[int], None] | None = None
    """Writes the checkpoint files of a step before its ``checkpoint_saved`` record goes out."""
    replay_result: dict[str, Any] | None = None
    """What rank 0 leaves in storage for a ``replay`` directive (None: the ranks refuse it)."""
    replays_at: list[int] = field(default_factory=list)
    """The step each ``replay`` directive ran at."""
    forged: set[int] = field(default_factory=set)
    """Checkpoint steps whose state fails the ranks' restore check after loading (files and checksums
    rewritten to match): a rollback to one is refused and quarantined, as ``Steering.restore`` does."""
    _seq: dict[int, int] = field(default_factory=dict)
    _unacked: dict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)

    def link(self, rank: int) -> str:
        return f"g{self.generation}r{rank}"

    # -- records out ----------------------------------------------------------------------------
    def send(self, ctl: Controller, rank: int, records: list[dict[str, Any]]) -> None:
        batch = []
        for rec in records:
            self._seq[rank] = self._seq.get(rank, 0) + 1
            batch.append((self._seq[rank], rec))
        self._call(ctl, rank, batch)

    def _call(self, ctl: Controller, rank: int, batch: list[tuple[int, dict[str, Any]]]) -> None:
        """One ingest call, answered as the link answers it: forget what is durable, resend from
        where the supervisor asks."""
        kept = self._unacked.get(rank, [])
        held = ((kept or batch)[0][0], (batch or kept)[-1][0]) if kept or batch else None
        reply = send(ctl, rank, [r for _, r in batch], [s for s, _ in batch], self.link(rank), held)
        everything = [(s, r) for s, r in kept + batch if s > reply["acked"]]
        resend = reply.get("resend_from")
        if resend is None:
            self._unacked[rank] = everything
            return
        self._unacked[rank] = [(s, r) for s, r in everything if s < resend]
        self._call(ctl, rank, [(s, r) for s, r in everything if s >= resend])

    def resend(self, ctl: Controller) -> None:
        """An idle link's acknowledgement poll (it also brings back what a new supervisor lacks)."""
        for rank in range(self.world_size):
            if self._unacked.get(rank):
                self._call(ctl, rank, [])

    def unacked(self, rank: int = 0) -> int:
        return len(self._unacked.get(rank, []))

    def record(self, step: int, rank: int, events: list[str] | None = None) -> dict[str, Any]:
        loss = self.loss(step, rank)
        up = max(1.0, loss / calm(step, rank)) if self.grads_follow_loss and math.isfinite(loss) else 1.0
        return {"step": step, "rank": rank, "world_size": self.world_size, "loss": loss,
                "grad_norm": up * (1.0 + self.rng.gauss(0, 0.02)), "param_norm": 100.0, "update_norm": 0.1 * up,
                "tokens_per_s": 1000.0, "lr": 1e-3, "nonfinite": not math.isfinite(loss),
                "events": events or []}  # fmt: skip

    # -- training -----------------------------------------------------------------------------
    def train(self, ctl: Controller, steps: int, *, checkpoint_every: int = 0) -> None:
        """Up to ``steps`` steps (fewer when frozen, stopped, or held at the end), each followed by
        a boundary where directives apply, and one controller iteration."""
        for _ in range(steps):
            self.boundary(ctl)
            if self.frozen or self.ended or self.step >= self.max_steps:
                return
            self.step += 1
            saved = checkpoint_every and self.step % checkpoint_every == 0
            if saved and self.on_checkpoint is not None:
                self.on_checkpoint(self.step)
            for rank in range(self.world_size):
                self.send(ctl, rank, [self.record(self.step, rank, ["checkpoint_saved"] if saved else [])])
            ctl.iterate()

    def run(self, ctl: Controller, until: Callable[[], bool], limit: int = 2000, *, checkpoint_every: int = 0) -> None:  # fmt: skip
        """Train and iterate, one step or boundary at a time, until ``until()`` holds."""
        for _ in range(limit):
            if until():
                return
            self.train(ctl, 1, checkpoint_every=checkpoint_every)
            ctl.iterate()
        raise AssertionError(f"not reached; status {ctl.status()}")

    def boundary(self, ctl: Controller) -> None:
        for d in ctl.directives.after(self.after_seq):
            self.after_seq = d["seq"]
            self.apply(ctl, d)
        if self.step >= self.max_steps and not self.ended:
            self.control(ctl, [f"end_reached:{self.step}"])

    def apply(self, ctl: Controller, d: dict[str, Any]) -> None:
        kind = d["kind"]
        if kind == "freeze":
            self.frozen = True
        elif kind == "continue":
            self.frozen = False
        elif kind == "rollback":
            if int(d["step"]) in self.forged:
                ctl.checkpoints.quarantine(int(d["step"]), "restore check failed on rank 0: restored model "
                                           "state differs from the saved one")  # fmt: skip
                self.control(ctl, [f"directive_failed:{d['id']}:{kind}"])
                return
            self.step = int(d["step"])
        elif kind in ("stop", "finish") and (kind == "stop" or self.step >= self.max_steps):
            self.ended = True
        elif kind == "apply":
            self.applied.append(d)
        elif kind == "replay":
            if self.replay_result is None:
                self.control(ctl, [f"directive_failed:{d['id']}:{kind}"])
                return
            from supervisor.sdk.replay import result_key

            self.replays_at.append(self.step)
            body = json.dumps({**self.replay_result, "checkpoint_step": d["step"]}).encode()
            ctl.checkpoints.backend.put_bytes(result_key(ctl.job.name, d["id"]), body)
        self.control(ctl, [f"directive_applied:{d['id']}:{kind}"])

    def control(self, ctl: Controller, events: list[str]) -> None:
        for rank in range(self.world_size):
            self.send(ctl, rank, [{"step": self.step, "rank": rank, "world_size": self.world_size,
                                   "control": True, "events": events}])  # fmt: skip


class FakeWorkers:
    """Worker supervision without Ray: reports the events a test queues, records launches."""

    def __init__(self, ranks: FakeRanks | None = None) -> None:
        self.ranks = ranks
        self.events: list[GroupEvent] = []
        self.launches: list[tuple[int, int | None, int]] = []
        self.fail_launch: list[str | Exception] = []
        """What the next launches raise: a message (RuntimeBackendError) or the exception itself."""
        self.ranks_asked: list[int | None] = []
        """The exact size each launch was asked for (None: as ``resources`` allow)."""
        self.place: list[int] = []
        """How many ranks the next launches place (fewer: a group restarted on fewer ranks)."""
        self.running = False

    @property
    def world_size(self) -> int:
        return self.ranks.world_size if self.ranks is not None else 1

    def find(self) -> bool:
        return self.running

    def exists_on_cluster(self) -> bool:
        return False

    def launch(
        self,
        generation: int,
        resume: int | None,
        after_seq: int,
        ready_timeout_s: float = 120.0,
        ranks: int | None = None,
    ) -> None:
        self.ranks_asked.append(ranks)
        if self.fail_launch:
            failure = self.fail_launch.pop(0)
            raise failure if isinstance(failure, Exception) else RuntimeBackendError(failure)
        self.launches.append((generation, resume, after_seq))
        self.running = True
        if self.place and self.ranks is not None:
            self.ranks.world_size = self.place.pop(0)
        if self.ranks is not None:  # the new generation starts from the resume point
            self.ranks.generation, self.ranks.after_seq = generation, after_seq
            self.ranks.step, self.ranks.frozen, self.ranks.ended = resume or 0, False, False
            self.ranks._unacked, self.ranks._seq = {}, {}  # the dead generation's links died with it

    def watch(self, silent_ranks: list[int]) -> GroupEvent | None:
        if self.events:
            return self.events.pop(0)
        if self.ranks is not None and self.ranks.ended and self.running:
            self.running = False
            return GroupEvent("finished")
        return None

    def link_acks(self) -> list[tuple[int, dict[str, Any], int | None]]:
        return []

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None:
        return None  # no rank process to search in: the controller searches itself

    def shutdown(self) -> None:
        self.running = False

    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any:
        raise RuntimeBackendError("the harness runs no replay tasks")

    @staticmethod
    def ray_result(ref: Any) -> tuple[bool, Any] | None:
        return None


def saver(ctl: Controller) -> Callable[[int], None]:
    """``FakeRanks.on_checkpoint`` for a one-rank job: real checkpoint files of a tiny model."""
    import torch

    from supervisor.checkpoint.training_state import save_training_state

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def save(step: int) -> None:
        save_training_state(ctl.checkpoints, step, rank=0, world_size=1, model=model, optimizer=optimizer)

    return save


def spin(ctl: Controller, until: Callable[[], bool], limit: int = 200) -> None:
    for _ in range(limit):
        ctl.iterate()
        if until():
            return
    raise AssertionError(f"not reached; status {ctl.status()}")
