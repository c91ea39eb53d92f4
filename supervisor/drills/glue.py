"""Wiring a fault plan into a supervised worker: its markers, the record stream, the dataset.

    plan = plan_for_worker(ctx)                     # empty unless job.yaml lists faults
    dataset = plan_dataset(plan, dataset)           # mixture_shift
    probe = sdk.init(...)
    attach(plan, probe)                             # model hooks, record stream, step counter

Records reach the plan through the probe's transport: the logging bug rewrites ``loss`` on
its way out, and the ``checkpoint_saved`` event of a record is when ``corrupt_checkpoint``
strikes. A record of step ``s`` leaves during step ``s + 1``, so these hooks never move the
plan's notion of the current step.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path
from typing import Any

from supervisor.drills import batchio
from supervisor.drills.base import Markers
from supervisor.drills.faults import FaultPlan
from supervisor.drills.inject_data import SAMPLES_SUFFIX
from supervisor.storage import open_backend

#: Set (to anything) in a drill run's environment: each rank appends the records it sends to
#: ``<storage>/<job>/drill/trace.rank<r>.jsonl`` (local storage only), which the drill checks read.
TRACE_ENV = "SUPERVISOR_DRILL_TRACE"


def plan_for_worker(ctx: Any, *, vocab_size: int | None = None) -> FaultPlan:
    """The plan of this rank from ``ctx.job.faults``; markers live under ``<storage>/<job>/faults``."""
    job = getattr(ctx, "job", None)
    if job is None:
        return FaultPlan.empty()
    plan = FaultPlan.empty()
    if job.faults:
        store = getattr(ctx, "checkpoint_store", None)
        backend = (
            store.backend
            if store is not None
            else open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region)
        )
        markers = Markers(backend, f"{job.name}/faults")
        plan = FaultPlan.from_specs(
            job.faults, rank=ctx.rank, world_size=ctx.world_size, state_dir=markers, vocab_size=vocab_size
        )
    if os.environ.get(TRACE_ENV) and not job.storage.is_s3:
        plan.trace_path = trace_file(Path(job.storage.path), job.name, int(ctx.rank))
    return plan


def trace_file(storage: Path, job: str, rank: int) -> Path:
    return storage.expanduser() / job / "drill" / f"trace.rank{rank}.jsonl"


class FaultTransport:
    """A ``Transport`` that passes records through the plan before the real transport sends them."""

    def __init__(self, inner: Any, plan: FaultPlan, checkpoint_store: Any = None) -> None:
        self.inner, self.plan, self.checkpoint_store = inner, plan, checkpoint_store
        self.trace = None
        if plan.trace_path is not None:
            plan.trace_path.parent.mkdir(parents=True, exist_ok=True)
            self.trace = open(plan.trace_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def send(self, batch: list[dict[str, Any]]) -> None:
        out = []
        for rec in batch:
            if "loss" in rec and "step" in rec:  # control messages carry no loss and pass untouched
                rec = self.plan.record(int(rec["step"]), rec)
                for saved in _saved_steps(rec) if self.checkpoint_store is not None else ():
                    self.plan.on_checkpoint_saved(saved, self.checkpoint_store)
            out.append(rec)
        if self.trace is not None:
            # One flushed line per record: a SIGKILLed worker loses nothing it already sent.
            self.trace.write("".join(json.dumps(r, default=str) + "\n" for r in out))
            self.trace.flush()
        self.inner.send(out)

    def poll(self) -> list[Any]:
        return list(self.inner.poll())

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            if self.trace is not None:
                self.trace.close()

    def __getattr__(self, name: str) -> Any:  # stats, dropped, ... of the real transport
        return getattr(self.inner, name)


def attach(plan: FaultPlan, probe: Any) -> None:
    """Install model hooks, route the probe's records through the plan, and follow its step counter."""
    if not plan and plan.trace_path is None:
        return
    plan.install(probe.model)
    plan.step_fn = lambda: int(probe.step_count) + 1
    probe.transport = FaultTransport(probe.transport, plan, getattr(probe, "checkpoint", None))


class ReplayView:
    """Replay hooks whose ``batch(sample_ids)`` carries the same garbage the training run was fed.

    A replay rebuilds batches from the dataset by sample ID, in another process: garbage a
    data fault wrote into a sample must be there too, or the replay would clear bad data.
    """

    def __init__(self, hooks: Any, vocab: int, seeds: dict[str, int]) -> None:
        self.hooks, self.vocab, self.seeds = hooks, vocab, seeds

    def batch(self, sample_ids: list[str]) -> Any:
        out = self.hooks.batch(sample_ids)
        rows = [r for r, sid in enumerate(sample_ids) if sid in self.seeds]
        return batchio.garbage_rows(out, rows, self.vocab, [self.seeds[sample_ids[r]] for r in rows])

    def __getattr__(self, name: str) -> Any:  # model, optimizer, control_batch, loss
        return getattr(self.hooks, name)


def replay_view(hooks: Any, job: Any) -> Any:
    """``hooks`` itself unless a data fault of ``job`` (a JobSpec) stored garbage samples."""
    if not job.faults:
        return hooks
    markers = Markers(
        open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region), f"{job.name}/faults"
    )
    seeds: dict[str, int] = {}
    vocab = 0
    for name in markers.names(SAMPLES_SUFFIX):
        saved = markers.get_json(name) or {}
        seeds.update(saved.get("samples", {}))
        vocab = max(vocab, int(saved.get("vocab", 0)))
    return ReplayView(hooks, vocab, seeds) if seeds and vocab else hooks


class MixtureDataset:
    """A dataset whose items follow the plan's source weights once a ``mixture_shift`` is active.

    Index ``i`` is mapped, deterministically, to a sample of a source drawn with those
    weights; ``sample_id``/``source`` describe the sample actually returned, so exclusions and
    per-source telemetry stay truthful. Memory is one count per source, whatever the dataset's size
    (the sample of a source is found per index, ``_member``).
    """

    def __init__(self, dataset: Any, plan: FaultPlan) -> None:
        self.dataset, self.plan = dataset, plan
        self._counts: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)

    def _sizes(self) -> dict[str, int]:
        """Samples per source, counted once: one integer per source, never a list of samples."""
        if self._counts is None:
            counts: dict[str, int] = {}
            for i in range(len(self.dataset)):
                src = str(self.dataset.source(i))
                counts[src] = counts.get(src, 0) + 1
            self._counts = counts
        return self._counts

    def _member(self, name: str, i: int) -> int:
        """A sample of source ``name`` fixed by ``i`` alone, uniform over that source, without a list
        of its samples: seeded candidates over the whole dataset until one is of ``name`` (1 / share
        tries on average). After 64 / share misses (probability below e^-64) the next one is taken."""
        n = len(self.dataset)
        j = 0
        for t in range(64 * n // self._sizes()[name] + 1):
            j = batchio.stable_seed("mixture-pick", i, t) % n
            if str(self.dataset.source(j)) == name:
                return j
        return next(k % n for k in range(j, j + n) if str(self.dataset.source(k % n)) == name)

    @property
    def base(self) -> Any:
        """What ``locate`` indexes (the ``SupervisedLoader`` protocol): the unmixed dataset."""
        return self.dataset

    def locate(self, i: int, batch: int) -> int:
        """The sample read for order index ``i`` at global batch ``batch``, under the weights of
        the step that consumes it in a run without skips or exclusions (``batch + 1``).

        The ``SupervisedLoader`` calls this in the training process as it draws a batch, so loader
        workers read exactly the named sample and a restored cursor draws the same ones. The
        plan's own step is not moved (``plan.mixture`` would): prefetching draws ahead of training."""
        weights = None
        for inj in self.plan.injectors:
            weights = inj.mixture(batch + 1) or weights
        return self._pick(i, weights)

    def _map(self, i: int) -> int:
        return self._pick(i, self.plan.mixture(self.plan.current_step()))

    def _pick(self, i: int, weights: dict[str, float] | None) -> int:
        if not weights:
            return i
        sizes = self._sizes()
        names = [n for n in sorted(weights) if weights[n] > 0 and n in sizes]
        if not names:
            return i
        cumulative, total = [], 0.0
        for n in names:
            total += weights[n]
            cumulative.append(total)
        u = batchio.stable_seed("mixture", i) / float(1 << 63) * total
        return self._member(names[min(bisect.bisect_right(cumulative, u), len(names) - 1)], i)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self._map(i)]

    def sample_id(self, i: int) -> str:
        return str(self.dataset.sample_id(self._map(i)))

    def source(self, i: int) -> str:
        return str(self.dataset.source(self._map(i)))


def plan_dataset(plan: FaultPlan, dataset: Any) -> Any:
    """``dataset`` itself unless the plan holds a mixture shift (needs ``source(i)`` on the dataset)."""
    if "mixture_shift" not in plan.kinds or not callable(getattr(dataset, "source", None)):
        return dataset
    return MixtureDataset(dataset, plan)


def _saved_steps(rec: dict[str, Any]) -> list[int]:
    """Steps a record says were committed: ``checkpoint_saved`` (this step) or, for an asynchronous
    save that committed later, ``checkpoint_saved:<step>``."""
    out = []
    for ev in rec.get("events", []):
        if ev == "checkpoint_saved":
            out.append(int(rec["step"]))
        elif isinstance(ev, str) and ev.startswith("checkpoint_saved:") and ev[17:].isdigit():
            out.append(int(ev[17:]))
    return out
