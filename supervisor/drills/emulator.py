"""A rank emulator: processes that each host many emulated ranks and drive the *real* supervisor.

An emulator host (a Ray actor, ``emulator:<job>:<n>``) plays ranks ``lo..hi-1`` of one job and
speaks the protocol a real rank's link speaks (``ranks/channel.py``, ``sdk/steering.py``):

- every step, one record per rank of a real record's size (loss, token sums, LR, grad / param /
  update norms, 3 sources, 8 stable sample IDs, lengths, throughput, the batch index, a parameter
  fingerprint every 50 steps), numbered per link (one link id per rank, as one link per rank
  process) and kept until the supervisor has *durably* accepted it; a ``resend_from`` answer
  sends again from there; a full buffer drops the oldest, counted;
- the records of all its ranks leave as one packed batch (``sdk/wire.py``: columns, one group
  per link) in one ``ingest_packed`` call per interval (one call in flight, as a link keeps one),
  the lever that makes a host's cost one Ray call, not one per rank, and the supervisor's decoding
  one pass over columns, not a dict per record;
- directives are long-polled by the host of rank 0, as rank 0 does, and every rank of every host
  acts on them at the same step boundary (the hosts step in lock-step: host 0 hands each step's
  directives to the others, as the SDK's broadcast does); acknowledgements go out as control
  messages at once and ride on the next record; ``Freeze`` parks (a ``frozen:<step>`` beat every
  2 s per rank), ``Snapshot`` writes a diagnostic checkpoint, ``RollbackInPlace`` takes
  ``restore_s`` seconds and moves the step back, ``ApplyOverrides`` scales the LR, ``Continue``
  releases, ``Finish`` / ``Stop`` end; ranks hold at the last step (``end_reached:<step>``) until
  the supervisor finishes them;
- host 0 writes a real (tiny) checkpoint every ``checkpoint_every`` steps before the records
  announcing it go out, and answers the rollback-target search as rank 0's process does.

A fault (``fault_step``): every rank's loss and grad norm non-finite at that step, once (the
rollback cures it), or on one rank only (``fault_rank``). Nothing here is a model: the numbers
are a smooth decreasing loss with per-rank noise; what is real is the supervisor they reach.

``ScaleSupervisor`` is the real ``SupervisorActor`` with the emulator as its worker group and a
few read-outs for the bench (its pid, CPU, RSS, state-file and incident-store write costs).
``python -m bench.scale`` drives it.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from supervisor.core.frame import StepFrame
from supervisor.errors import RuntimeBackendError
from supervisor.logging import get_logger
from supervisor.ranks.names import NAMESPACE, supervisor_name
from supervisor.runtime.actor import SupervisorActor
from supervisor.runtime.machinery import Workers
from supervisor.runtime.restarts import GroupEvent
from supervisor.sdk.wire import pack, pack_columns

log = get_logger("supervisor.drills.emulator")

_APPLIED = "directive_applied"
_SOURCES = ("code", "docstrings", "tests")
_SOURCE_TOKENS = (684, 682, 682)
_TOKENS = 2048
BEAT_S = 2.0  # the SDK's HOLD_BEAT_S: a frozen or held rank says it is there this often
LONG_POLL_S = 5.0


def host_name(job: str, index: int) -> str:
    return f"emulator:{job}:{index}"


@dataclass
class EmulatorConfig:
    ranks: int
    hosts: int = 1
    step_time_s: float = 0.1
    """Seconds per step (0: as fast as the supervisor takes records, within the buffer)."""
    free_steps: int = 0
    """The first steps run as fast as the supervisor takes them, whatever ``step_time_s``."""
    fault_step: int | None = None
    fault_rank: int | None = None
    """None: every rank's step ``fault_step`` is non-finite; else only this rank's."""
    restore_s: float = 0.5
    checkpoint_every: int = 50
    ahead: int = 1000
    """Running free, a rank waits while this many of its records are not durably accepted yet."""
    flush_s: float = 0.05
    buffer_records: int = 10_000
    """Per rank (``RuntimeSettings.buffer_records``)."""
    samples: int = 8
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class _Lag:
    """A log-binned histogram of latencies (2 % bins): p50 / p99 of millions without keeping them."""

    BASE = math.log(1.02)

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.n = 0

    def add(self, seconds: float, count: int = 1) -> None:
        b = int(math.log(max(seconds, 1e-5)) / self.BASE)
        self.bins[b] = self.bins.get(b, 0) + count
        self.n += count

    def add_since(self, now: float, made: list[float]) -> None:
        """One latency per record, ``now`` minus when it was made (records of one step share it)."""
        tally: dict[float, int] = {}
        for t in made:
            tally[t] = tally.get(t, 0) + 1
        for t, count in tally.items():
            self.add(now - t, count)

    def quantile(self, q: float) -> float | None:
        if not self.n:
            return None
        want, seen = q * self.n, 0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= want:
                return math.exp((b + 0.5) * self.BASE)
        return None


class _Made:
    """One step's records of a host's ranks, as what they are made of: rank ``r``'s record is
    ``EmulatorHost.record(made, r)``, and a batch of whole steps of every link is packed from these
    in columns (``EmulatorHost.pack``) -- the bytes ``wire.pack`` makes of the records, without a
    dict per record: a host plays a thousand ranks on one core, which each make their own."""

    __slots__ = ("step", "time", "base_loss", "lr_scale", "fault", "events", "fingerprint")

    def __init__(self, step: int, time: float, lr_scale: float, fault: bool, events: list[str]) -> None:
        self.step, self.time, self.lr_scale, self.fault, self.events = step, time, lr_scale, fault, events
        self.base_loss = 2.0 + 1.0 * 0.5 ** (step / 4000)
        self.fingerprint = "c0ffee" if step % 50 == 0 else None


Entry = tuple[int, "dict[str, Any] | _Made"]
"""(seq, record): a control message as its dict, a step's record as the step it belongs to."""


def _made_at(rec: dict[str, Any] | _Made) -> float:
    return rec.time if isinstance(rec, _Made) else rec["time"]


class _Link:
    """One emulated rank's link: numbered records kept until durably accepted (``channel.py``)."""

    __slots__ = ("rank", "id", "seq", "backlog", "unacked", "acked", "dropped")

    def __init__(self, rank: int, prefix: str) -> None:
        self.rank = rank
        self.id = f"{prefix}r{rank}"
        self.seq = 0
        self.backlog: deque[Entry] = deque()
        self.unacked: deque[Entry] = deque()
        self.acked = 0
        self.dropped = 0


class EmulatorHost:
    """Ranks ``lo..hi-1`` of the job (a Ray actor; host 0 holds rank 0 and leads the boundaries)."""

    def __init__(self, job: dict[str, Any], config: dict[str, Any], index: int) -> None:
        from supervisor.config.job import JobSpec

        self.job = JobSpec.model_validate(job)
        self.cfg = EmulatorConfig(**config)
        self.index = index
        per = math.ceil(self.cfg.ranks / self.cfg.hosts)
        self.lo, self.hi = index * per, min(self.cfg.ranks, (index + 1) * per)
        self.world = self.cfg.ranks
        self.max_steps = self.job.max_steps
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._inbox: deque[dict[str, Any]] = deque()
        self._after = 0
        self.links: list[_Link] = []
        self.followers: list[Any] = []
        self.accept_lag = _Lag()
        self.ack_lag = _Lag()
        self.produced = 0
        self.calls = 0
        self.call_s = 0.0
        self.events: list[tuple[str, float, int, str]] = []
        """(what, wall time, step, directive id): freezes, releases, rollbacks, their acks."""
        self.error: str | None = None
        self._noise = [math.sin(i * 12.9898) * 43758.5453 % 1.0 - 0.5 for i in range(4099)]
        self._samples = [
            [f"{_SOURCES[(i + k) % 3]}:lib/module_{(i * 7 + k) % 997}.py:{(i * 8 + k) * 64}" for k in range(self.cfg.samples)]
            for i in range(4096)
        ]  # fmt: skip
        self._supervisor: Any = None
        self._flushing = False
        self.first_record: float | None = None
        if self.index == 0 and self.cfg.checkpoint_every:
            import torch  # noqa: F401 - loaded before the clock starts, as a training process has it
        self._threads: list[threading.Thread] = []

    # -- control (the supervisor's EmulatedWorkers, the bench) ---------------------------------------
    def ready(self) -> bool:
        return True

    def start(self, generation: int, resume: int | None, after_seq: int) -> None:
        """A new worker generation from ``resume`` (None: fresh): new links, training begins."""
        self.stop(wait=True)
        self._stop.clear()
        self._done.clear()
        self._after = after_seq
        self._inbox.clear()
        prefix = f"{uuid.uuid4().hex[:8]}g{generation}"
        self.links = [_Link(r, prefix) for r in range(self.lo, self.hi)]
        self.step = resume or 0
        self._flushing = False
        self.frozen = False
        self.lr_scale = 1.0
        self.fault_fired = False
        self.pending_events: list[str] = []
        self._supervisor = ray.get_actor(supervisor_name(self.job.name), namespace=NAMESPACE)
        if self.index == 0:
            self.followers = [
                ray.get_actor(host_name(self.job.name, i), namespace=NAMESPACE)
                for i in range(1, self.cfg.hosts)
            ]
        targets = [self._send_loop] + ([self._poll_loop, self._train_loop] if self.index == 0 else [])
        self._threads = [threading.Thread(target=t, daemon=True, name=t.__name__) for t in targets]
        for t in self._threads:
            t.start()

    def stop(self, wait: bool = False) -> None:
        self._stop.set()
        self._wake.set()
        if wait:
            for t in self._threads:
                t.join(timeout=LONG_POLL_S + 5)
            self._threads = []

    def wait_done(self) -> bool:
        self._done.wait()
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            unacked = sum(len(x.unacked) + len(x.backlog) for x in self.links)
            return {
                "index": self.index, "ranks": self.hi - self.lo, "produced": self.produced,
                "dropped": sum(x.dropped for x in self.links), "unacked": unacked,
                "acked": sum(x.acked for x in self.links), "calls": self.calls, "call_s": self.call_s,
                "accept_p50": self.accept_lag.quantile(0.5), "accept_p99": self.accept_lag.quantile(0.99),
                "ack_p50": self.ack_lag.quantile(0.5), "ack_p99": self.ack_lag.quantile(0.99),
                "step": getattr(self, "step", 0), "frozen": getattr(self, "frozen", False),
                "events": list(self.events), "error": self.error, "done": self._done.is_set(),
                "first_record": self.first_record,
            }  # fmt: skip

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any]:
        """The search rank 0's process runs (``TrainWorker.rollback_target``): torch is loaded here."""
        from supervisor.checkpoint.lifecycle import open_checkpoint_store, pick_rollback_target
        from supervisor.errors import SupervisorError

        try:
            step, verification = pick_rollback_target(
                open_checkpoint_store(self.job), max_step=max_step, min_mark=min_mark, world_size=self.world
            )
        except SupervisorError as exc:
            return {"error": str(exc)}
        return {"step": step, "verification": verification}

    # -- followers: host 0 hands them each boundary ------------------------------------------------
    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait (bounded) until the supervisor has durably accepted every record (a rank's close)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not any(x.backlog or x.unacked for x in self.links):
                    return True
            self._flushing = True
            time.sleep(0.05)
        return False

    def follow(
        self, step: int, frozen: bool, events: list[str], fault: bool, produce: bool, done: bool
    ) -> None:
        """One boundary as host 0 decided it: the ranks here send what the same ranks there send."""
        self.step, self.frozen = step, frozen
        if events:
            self._control(events)
        if produce:
            self._produce(fault)
        if done:
            self.flush()
            self._done.set()

    # -- the training loop (host 0) -------------------------------------------------------------------
    def _train_loop(self) -> None:
        try:
            self._train()
        except BaseException as exc:  # the bench reports it; the supervisor sees the ranks go silent
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("emulator_failed", error=self.error)
        finally:
            self._done.set()

    def _train(self) -> None:
        pace_from, paced_step = time.monotonic(), self.step
        while not self._stop.is_set():
            ended = self._boundary()
            if ended:
                self._broadcast([], produce=False, done=True)
                self.flush()
                return
            if self.frozen or self.step >= self.max_steps:
                self._park()
                pace_from, paced_step = time.monotonic(), self.step
                continue
            self._pace(pace_from, paced_step)
            if self.step < self.cfg.free_steps:  # running free: the paced steps count from the last free one
                pace_from, paced_step = time.monotonic(), self.step + 1
            self.step += 1
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                self._checkpoint(self.step, diagnostic=False)
                self.pending_events.append("checkpoint_saved")
            fault = self.cfg.fault_step == self.step and not self.fault_fired
            self.fault_fired |= fault
            self._broadcast([], produce=True, fault=fault)

    def _pace(self, since: float, from_step: int) -> None:
        free = self.step < self.cfg.free_steps
        if free or self.cfg.step_time_s <= 0:
            # As fast as the supervisor takes them, never more than ``ahead`` records unacknowledged.
            while not self._stop.is_set() and self._behind() > min(
                self.cfg.ahead, self.cfg.buffer_records // 2
            ):
                time.sleep(0.002)
            return
        due = since + (self.step - from_step + 1) * self.cfg.step_time_s
        delay = due - time.monotonic()
        if delay > 0:
            self._stop.wait(delay)

    def _behind(self) -> int:
        link = self.links[0]
        return len(link.unacked) + len(link.backlog)

    def _broadcast(
        self, events: list[str], *, produce: bool, fault: bool = False, done: bool = False
    ) -> None:
        """This boundary on every host: host 0's ranks here, the others through ``follow``."""
        refs = [f.follow.remote(self.step, self.frozen, events, fault, produce, done) for f in self.followers]
        if events:
            self._control(events)
        if produce:
            self._produce(fault)
        if refs:
            ray.get(refs)  # the lock-step of a collective: no host runs a step ahead

    def _boundary(self) -> bool:
        """Apply the directives fetched so far, as every rank would at this boundary; True: ended."""
        while self._inbox:
            d = self._inbox.popleft()
            if self._apply(d):
                return True
        return False

    def _apply(self, d: dict[str, Any]) -> bool:
        kind, did = d.get("kind"), str(d.get("id"))
        now = time.time()
        ack = [f"{_APPLIED}:{did}:{kind}"]
        if kind == "freeze":
            self.frozen = True
        elif kind == "continue":
            self.frozen = False
        elif kind == "snapshot":
            self._checkpoint(self.step, diagnostic=True)
        elif kind == "rollback":
            before = self.step
            time.sleep(self.cfg.restore_s)  # loading the checkpoint into the live model
            self.step = int(d["step"])
            self.pending_events += ["resumed", f"rolled_back:{before}:{self.step}"]
        elif kind == "apply":
            if d.get("lr_scale") is not None:
                self.lr_scale = float(d["lr_scale"])
                self.pending_events.append("lr_override")
        elif kind == "replay":
            ack = [f"directive_failed:{did}:{kind}"]  # no model here: refused, as a rank without hooks
        self.events.append((str(kind), now, self.step, did))
        self._broadcast(ack, produce=False, done=False)
        self.pending_events += ack
        self.events.append((f"{kind}_acked", time.time(), self.step, did))
        return kind in ("stop", "finish") and (kind == "stop" or self.step >= self.max_steps)

    def _park(self) -> None:
        """Frozen, or held at the last step: beat every 2 s until a directive comes."""
        beat = f"frozen:{self.step}" if self.frozen else f"end_reached:{self.step}"
        self._broadcast([beat], produce=False)
        deadline = time.monotonic() + BEAT_S
        while not self._inbox and not self._stop.is_set() and time.monotonic() < deadline:
            self._wake.wait(0.01)
            self._wake.clear()

    # -- records ----------------------------------------------------------------------------------
    def _produce(self, fault: bool) -> None:
        now = time.time()
        if self.first_record is None:
            self.first_record = now
        events, self.pending_events = self.pending_events, []
        made = _Made(self.step, now, self.lr_scale, fault, events)
        self._enqueue([(link, made) for link in self.links])

    def _varying(self, made: _Made, r: int) -> tuple[float, float, float, bool]:
        """What differs between two ranks' records of a step: loss, grad norm, update norm, non-finite."""
        n = self._noise[(made.step * 31 + r * 17) % 4099]
        bad = made.fault and (self.cfg.fault_rank is None or self.cfg.fault_rank == r)
        loss = math.nan if bad else made.base_loss * (1.0 + 0.01 * n)
        return loss, math.nan if bad else 1.0 + 0.02 * n, 0.03 * made.lr_scale * (1.0 + 0.01 * n), bad

    def record(self, made: _Made, r: int) -> dict[str, Any]:
        """Rank ``r``'s record of the step ``made`` stands for, as a rank's SDK sends it."""
        loss, grad_norm, update_norm, bad = self._varying(made, r)
        step_time = self.cfg.step_time_s or 0.01
        rec: dict[str, Any] = {
            "step": made.step, "rank": r, "world_size": self.world, "time": made.time, "loss": loss,
            "loss_sum": loss * _TOKENS, "tokens": _TOKENS, "batch_mean_loss": loss * 1.001,
            "lr": 3e-4 * made.lr_scale, "grad_norm": grad_norm, "param_norm": 100.0 + made.step * 1e-4,
            "update_norm": update_norm, "overflow": False, "nonfinite": bad,
            "sources": {s: {"tokens": t, "loss_sum": loss * t} for s, t in zip(_SOURCES, _SOURCE_TOKENS, strict=True)},
            "samples": self._samples[(made.step * self.world + r) % 4096], "seq_len_max": 256,
            "seq_len_mean": 201.5, "step_time": step_time, "tokens_per_s": _TOKENS / step_time,
            "attrs": {"batch": made.step}, "events": made.events,
        }  # fmt: skip
        if made.fingerprint:
            rec["param_checksum"] = made.fingerprint
        return rec

    def pack(self, calls: list[tuple[int, str, tuple[int, int], list[int], list[Any]]]) -> dict[str, Any]:
        """The packed batch of these links' parts (``(rank, link id, held, seqs, entries)`` each), as
        ``wire.pack`` makes it of their records: in columns when every link sends the same steps and
        nothing else (a host's steady state), else of the records themselves."""
        steps = calls[0][4] if calls else []
        if steps and all(type(x) is _Made for x in steps) and all(c[4] == steps for c in calls):
            return self._columns(calls, steps)
        return pack([(rank, link, held, seqs, [x if type(x) is dict else self.record(x, rank) for x in recs])
                     for rank, link, held, seqs, recs in calls])  # fmt: skip

    def _columns(self, calls: list[tuple[int, str, tuple[int, int], list[int], list[Any]]], steps: list[_Made]) -> dict[str, Any]:  # fmt: skip
        order = [(c[0], made) for c in calls for made in steps]  # link by link, as the groups go
        m = len(order)
        loss, grad_norm, update_norm, bad = (list(v) for v in zip(*(self._varying(made, r) for r, made in order), strict=True))  # fmt: skip
        at = [made.step for _, made in order]
        step_time = self.cfg.step_time_s or 0.01
        cols: dict[str, list[Any]] = {
            "step": at, "rank": [r for r, _ in order], "world_size": [self.world] * m,
            "time": [made.time for _, made in order], "loss": loss, "loss_sum": [x * _TOKENS for x in loss],
            "tokens": [_TOKENS] * m, "batch_mean_loss": [x * 1.001 for x in loss],
            "lr": [3e-4 * made.lr_scale for _, made in order], "grad_norm": grad_norm,
            "param_norm": [100.0 + s * 1e-4 for s in at], "update_norm": update_norm, "overflow": [False] * m,
            "nonfinite": bad, "seq_len_max": [256] * m, "seq_len_mean": [201.5] * m,
            "step_time": [step_time] * m, "tokens_per_s": [_TOKENS / step_time] * m,
        }  # fmt: skip
        if any(made.fingerprint for made in steps):
            cols["param_checksum"] = [made.fingerprint for _, made in order]
        samples, world = self._samples, self.world
        return pack_columns(
            [(c[0], c[1], c[2], c[3], len(c[4])) for c in calls], cols,
            sources=(list(_SOURCES), [len(_SOURCES)] * m, list(range(len(_SOURCES))) * m, list(_SOURCE_TOKENS) * m,
                     [x * t for x in loss for t in _SOURCE_TOKENS]),
            samples=[samples[(made.step * world + r) % 4096] for r, made in order],
            events=[made.events for _, made in order], attrs=[{"batch": s} for s in at],
        )  # fmt: skip

    def _control(self, events: list[str]) -> None:
        now = time.time()
        self._enqueue([
            (x, {"step": self.step, "rank": x.rank, "world_size": self.world, "time": now, "control": True,
                 "events": list(events)}) for x in self.links
        ])  # fmt: skip

    def _enqueue(self, items: list[tuple[_Link, dict[str, Any] | _Made]]) -> None:
        bound = self.cfg.buffer_records
        with self._lock:
            for link, rec in items:
                link.seq += 1
                link.backlog.append((link.seq, rec))
                if len(link.backlog) + len(link.unacked) > bound:
                    (link.unacked or link.backlog).popleft()
                    link.dropped += 1
            self.produced += len(items)

    # -- the link: one ingest_packed call in flight -------------------------------------------------
    def _send_loop(self) -> None:
        last_call = 0.0
        while not self._stop.is_set() or any(x.backlog for x in self.links):
            calls, batches = [], []
            with self._lock:
                ack_poll = time.monotonic() - last_call >= (0.5 if self._flushing else BEAT_S)
                for x in self.links:
                    if not x.backlog and not (x.unacked and ack_poll):
                        continue
                    batch = list(x.backlog)
                    x.backlog.clear()
                    held = ((x.unacked or batch)[0][0], (batch or x.unacked)[-1][0])
                    calls.append((x.rank, x.id, held, [s for s, _ in batch], [r for _, r in batch]))
                    batches.append((x, batch))
            if not calls:
                if self._stop.wait(self.cfg.flush_s):
                    return
                continue
            last_call = time.monotonic()
            try:
                replies = ray.get(self._supervisor.ingest_packed.remote(self.pack(calls)), timeout=60)
            except (RayActorError, GetTimeoutError) as exc:
                with self._lock:
                    for x, batch in batches:
                        x.backlog.extendleft(reversed(batch))
                log.warning("emulator_ingest_failed", error=type(exc).__name__)
                self._stop.wait(1.0)
                continue
            took = time.monotonic() - last_call
            if isinstance(replies, dict):  # refused as malformed: never accepted, counted as dropped
                log.warning("emulator_batch_refused", why=replies.get("refused"))
                with self._lock:
                    for x, batch in batches:
                        x.dropped += len(batch)
                continue
            self._on_replies(batches, replies)
            if any(r.get("busy") for r in replies):  # the supervisor's queue is full: keep them, ask later
                took -= 0.2
            with self._lock:
                self.calls += 1
                self.call_s += took
            self._stop.wait(max(0.0, self.cfg.flush_s - took))

    def _on_replies(self, batches: list[tuple[_Link, list[Entry]]], replies: list[Any]) -> None:
        now = time.time()
        accepted: list[float] = []
        durable: list[float] = []
        with self._lock:
            for (x, batch), reply in zip(batches, replies, strict=True):
                resend = reply.get("resend_from")
                if resend is None:
                    accepted.extend(_made_at(rec) for _, rec in batch)
                    x.unacked.extend(batch)
                x.acked = max(x.acked, int(reply.get("acked", 0)))
                while x.unacked and x.unacked[0][0] <= x.acked:
                    durable.append(_made_at(x.unacked.popleft()[1]))
                if resend is not None:
                    again = [y for y in list(x.unacked) + batch if y[0] >= int(resend)]
                    x.unacked = deque(y for y in x.unacked if y[0] < int(resend))
                    x.backlog.extendleft(reversed(again))
            self.accept_lag.add_since(now, accepted)
            self.ack_lag.add_since(now, durable)

    # -- directives: the host of rank 0 long-polls, as rank 0 does --------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                new = ray.get(self._supervisor.directives.remote(0, self._after, LONG_POLL_S),
                              timeout=LONG_POLL_S + 10)  # fmt: skip
            except (RayActorError, GetTimeoutError):
                self._stop.wait(1.0)
                continue
            for d in new:
                self._after = max(self._after, int(d.pop("seq")))
                self._inbox.append(d)
            if new:
                self._wake.set()

    # -- checkpoints (host 0) ----------------------------------------------------------------------
    def _checkpoint(self, step: int, *, diagnostic: bool) -> None:
        import torch

        from supervisor.checkpoint.lifecycle import open_checkpoint_store
        from supervisor.checkpoint.store import CheckpointStore
        from supervisor.core.model import HealthMark
        from supervisor.errors import CheckpointError

        store: CheckpointStore = open_checkpoint_store(self.job)
        existing = store.find(step)
        if existing is not None and existing.health not in (HealthMark.QUARANTINED, HealthMark.DIAGNOSTIC):
            # This timeline's save of the step (a snapshot at a step that has its checkpoint): nothing
            # new to keep. A quarantined save (an abandoned timeline's, after a rollback) or a snapshot
            # is saved over, as a real rank's commit does; the store keeps the old one as history.
            return
        try:
            files = [
                store.write_file(
                    step, name, lambda f: torch.save({"w": torch.zeros(8)}, f), components=[name]
                )
                for name in ("model", "optimizer")
            ]
            store.commit(step, world_size=self.world, files=files, metrics={"loss": None},
                         mark=HealthMark.DIAGNOSTIC if diagnostic else HealthMark.UNVERIFIED)  # fmt: skip
        except CheckpointError as exc:
            log.warning("emulator_checkpoint_failed", step=step, error=str(exc))


RemoteHost = ray.remote(EmulatorHost)


def start_host(job: dict[str, Any], config: EmulatorConfig, index: int) -> Any:
    """Emulator host ``index`` as a named Ray actor (no CPU reserved: it is the bench's load)."""
    return RemoteHost.options(name=host_name(job["name"], index), namespace=NAMESPACE, num_cpus=0,
                              max_concurrency=8).remote(job, asdict(config), index)  # fmt: skip


class EmulatedWorkers:
    """``machinery.WorkerSupervision`` for the emulator: its hosts are the worker group."""

    def __init__(self, job: Any, settings: Any, hosts: int) -> None:
        self.job = job
        self.settings = settings
        self.n = hosts
        self.hosts: list[Any] = []
        self._done: list[Any] = []
        self._next_check = 0.0

    def find(self) -> bool:
        return False

    def exists_on_cluster(self) -> bool:
        return False

    @property
    def world_size(self) -> int:
        """The emulated ranks: always the job's ``num_workers`` (its hosts never place fewer)."""
        return int(self.job.resources.num_workers)

    def launch(
        self,
        generation: int,
        resume: int | None,
        after_seq: int,
        ready_timeout_s: float = 120.0,
        ranks: int | None = None,
    ) -> None:
        if ranks is not None and ranks != self.world_size:
            raise RuntimeBackendError(f"the emulator runs {self.world_size} ranks, not {ranks}")
        try:
            self.hosts = [
                ray.get_actor(host_name(self.job.name, i), namespace=NAMESPACE) for i in range(self.n)
            ]
        except ValueError as exc:
            raise RuntimeBackendError(f"emulator hosts not found: {exc}") from None
        # Followers first: host 0 hands them its first boundary as soon as it starts.
        ray.get(
            [h.start.remote(generation, resume, after_seq) for h in reversed(self.hosts)],
            timeout=ready_timeout_s,
        )
        self._done = [h.wait_done.remote() for h in self.hosts]

    def watch(self, silent_ranks: list[int]) -> GroupEvent | None:
        if not self._done:
            return None
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + 1.0  # a host ending is not news that needs a ray.wait per loop
            ready, _ = ray.wait(self._done, num_returns=len(self._done), timeout=0)
            if len(ready) == len(self._done):
                self._done = []
                return GroupEvent("finished")
        if silent_ranks:
            return GroupEvent("hung", tuple(silent_ranks), "emulated ranks silent")
        return None

    def link_acks(self) -> list[tuple[int, dict[str, Any], int | None]]:
        return []

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None:
        if not self.hosts:
            return None
        try:
            found: dict[str, Any] = ray.get(
                self.hosts[0].rollback_target.remote(max_step, min_mark), timeout=60
            )
        except RayError:
            return None
        return found

    def shutdown(self) -> None:
        for h in self.hosts:
            h.stop.remote()
        self._done = []

    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any:
        raise RuntimeBackendError("the rank emulator runs no replay tasks")

    @staticmethod
    def ray_result(ref: Any) -> tuple[bool, Any] | None:
        return None


class ScaleSupervisor(SupervisorActor):
    """The real supervisor actor, its worker group the emulator, with read-outs for the bench."""

    def __init__(self, job: dict[str, Any], settings: dict[str, Any], attach: bool, hosts: int = 1) -> None:
        self._hosts = hosts
        self.costs = _instrument()
        super().__init__(job, settings, attach)
        self.analysed_at: dict[int, float] = {}
        """Wall time each step was first analysed (the first 100,000 steps).
        """
        analyse = self.ctl._analyse

        def timed(step: int, records: StepFrame) -> None:
            analyse(step, records)
            if len(self.analysed_at) < 100_000:
                self.analysed_at.setdefault(step, time.time())

        self.ctl._analyse = timed  # type: ignore[method-assign]
        self.ingest_cpu_s = 0.0
        """CPU time of the ``ingest_packed`` calls themselves (the wire's decode, receipts, the inbox)."""
        self._ingest_lock = threading.Lock()

    def ingest_packed(self, batch: Any) -> list[dict[str, Any]] | dict[str, Any]:
        t = time.thread_time()
        try:
            return super().ingest_packed(batch)
        finally:
            with self._ingest_lock:
                self.ingest_cpu_s += time.thread_time() - t

    def _worker_supervision(self, spec: Any, settings: Any) -> Workers:
        return EmulatedWorkers(spec, settings, self._hosts)

    def probe(self) -> dict[str, Any]:
        import os

        import psutil

        proc = psutil.Process(os.getpid())
        cpu = proc.cpu_times()
        return {"pid": os.getpid(), "cpu_s": cpu.user + cpu.system, "loop_cpu_s": self._loop_cpu_s(),
                "ingest_cpu_s": self.ingest_cpu_s, "status": self.status(),
                "rss": proc.memory_info().rss,
                "costs": {k: asdict(v) for k, v in self.costs.items()}, "step": self.ctl.current_step,
                "watermark": self.ctl.assembler.watermark}  # fmt: skip

    def _loop_cpu_s(self) -> float | None:
        """CPU time of the control loop's thread (the rest of the process is Ray's transport and
        threads, and the calls: the wire's decode, ``status``); None once the loop has ended."""
        ident = self.thread.ident
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident)) if ident is not None else None
        except (OSError, AttributeError):  # the thread ended; no per-thread clock on this platform
            return None

    def analysed(self) -> dict[int, float]:
        return dict(self.analysed_at)


@dataclass
class _Cost:
    calls: int = 0
    seconds: float = 0.0
    max_s: float = 0.0
    bytes: int = 0


def _instrument() -> dict[str, _Cost]:
    """Time the state-file writes and the incident store's writes in this process (the bench's
    read-out; the classes are patched in the supervisor's process only)."""
    from supervisor.incidents.store import IncidentStore
    from supervisor.runtime import controller, state

    costs = {"state_file": _Cost(), "state_dump": _Cost(), "incident_store": _Cost()}

    def timed(fn: Any, cost: _Cost, size: Any = None) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                took = time.perf_counter() - t
                cost.calls += 1
                cost.seconds += took
                cost.max_s = max(cost.max_s, took)
                if size is not None:
                    cost.bytes = size(args)

        return wrapper

    controller.write_state = timed(state.write_state, costs["state_file"], lambda a: len(a[1]))
    state.RuntimeState.dump = timed(state.RuntimeState.dump, costs["state_dump"])  # type: ignore[method-assign]
    for name in ("open_incident", "transition", "reopen", "update_diagnosis", "begin", "finish", "record",
                 "attach_series", "add_artifact"):  # fmt: skip
        setattr(IncidentStore, name, timed(getattr(IncidentStore, name), costs["incident_store"]))
    return costs
