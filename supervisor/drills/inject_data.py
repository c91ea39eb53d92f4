"""Data faults: garbage samples, a corrupt shard, a periodic garbage source, a mixture switch.

Garbage lives in the data: once a sample has been turned to garbage it stays garbage
wherever it recurs (a replay after rollback reproduces the spike, as real bad data would),
and only a fix that keeps the sample out — exclusion, skipping the batch — makes it go away.
"""

from __future__ import annotations

import math
from typing import Any

from supervisor.drills import batchio
from supervisor.drills.base import Injector, PlanContext
from supervisor.drills.specs import CorruptShard, FaultParams, GarbageBatch, MixtureShift, PeriodicGarbage

#: Stored next to the fault's markers: ``{"vocab": V, "samples": {sample_id: seed}}``.
SAMPLES_SUFFIX = ".samples.json"


class _Garbage(Injector):
    def vocab(self, batch: Any) -> int:
        return self.ctx.vocab_size or batchio.max_token(batch) + 1

    def rewrite(self, step: int, batch: Any, rows: list[int], ids: list[str] | None) -> Any:
        if not rows:
            return batch
        seeds = [self.seed_of(ids[r] if ids else f"{step}:{r}") for r in rows]
        return batchio.garbage_rows(batch, rows, self.vocab(batch), seeds)

    def seed_of(self, sample: str) -> int:
        return batchio.stable_seed(self.key, self.spec.seed, sample)

    def saved_bad_ids(self) -> set[str]:
        """The samples this fault turned to garbage before (a restarted worker keeps its bad data)."""
        saved = self.ctx.markers.get_json(self.key + SAMPLES_SUFFIX) or {}
        return set(saved.get("samples", {}))

    def persist(self, batch: Any, bad_ids: set[str]) -> None:
        """Store the bad samples and their garbage seeds: a replay elsewhere rebuilds the same garbage."""
        seeds = {sid: self.seed_of(sid) for sid in sorted(bad_ids)}
        self.ctx.markers.put_json(self.key + SAMPLES_SUFFIX, {"vocab": self.vocab(batch), "samples": seeds})

    @staticmethod
    def head(n: int, fraction: float) -> list[int]:
        return list(range(max(1, math.ceil(n * fraction)) if n else 0))


class SampleGarbage(_Garbage):
    """The rows fed on the first pass through the window become garbage, keyed by sample ID."""

    spec: GarbageBatch | CorruptShard

    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        super().__init__(spec, index, ctx)
        self.window = self.once_window(getattr(spec, "steps", 1))
        self.on = False
        self.bad_ids = self.saved_bad_ids()

    def observe_step(self, step: int) -> None:
        self.on = self.window.active(step)

    def batch(self, step: int, batch: Any) -> Any:
        ids = batchio.sample_ids(batch)
        if self.on:
            rows = self.head(batchio.num_rows(batch), self.spec.fraction)
            if ids:
                self.bad_ids.update(ids[r] for r in rows)
                self.persist(batch, self.bad_ids)
            self.fired(step, rows=len(rows), samples=[ids[r] for r in rows][:8] if ids else None)
        elif ids and self.bad_ids:
            rows = [r for r, sid in enumerate(ids) if sid in self.bad_ids]
            if rows:
                self.fired(step, rows=len(rows), recurring=True)
        else:
            return batch
        return self.rewrite(step, batch, rows, ids)


class PeriodicGarbageInjector(_Garbage):
    """Every ``period`` steps from ``step`` on, bad data reaches the rank.

    With a ``source``, that source's rows are garbage at each period step, on every pass (the
    source is bad until the supervisor keeps it out). Without one, a ``fraction`` of the rank's rows
    at each period step comes from a bad shard: the first time that step runs those samples
    turn to garbage and stay garbage wherever they come back (a re-run after a rollback, a replay,
    another step), as :class:`SampleGarbage`'s do, so a re-run that keeps them out is clean. A batch
    without sample IDs has nothing to key on: its rows at a period step are garbage on every pass.
    """

    spec: PeriodicGarbage

    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        super().__init__(spec, index, ctx)
        self.bad_ids = self.saved_bad_ids()
        self.running: int | None = None  # the period step whose first run is under way

    def hit(self, step: int) -> bool:
        offset = step - self.spec.step
        if offset < 0 or offset % self.spec.period:
            return False
        return self.spec.count is None or offset // self.spec.period < self.spec.count

    def first_run(self, step: int) -> bool:
        """Whether period step ``step`` runs for the first time (every micro-batch of it); a marker
        keeps it known in a restarted worker."""
        if self.running == step:
            return True
        key = f"{self.key}:{step}"
        if self.ctx.markers.fired(key):
            return False
        self.ctx.markers.mark(key)
        self.running = step
        return True

    def batch(self, step: int, batch: Any) -> Any:
        if self.running != step:
            self.running = None  # another step: that first run is over
        ids = batchio.sample_ids(batch)
        labels = batchio.source_labels(batch)
        if self.spec.source is not None and labels is not None:
            # Exclusion of the source by the supervisor leaves no matching rows: nothing to corrupt.
            rows = [r for r, src in enumerate(labels) if src == self.spec.source] if self.hit(step) else []
            if rows:
                self.fired(step, rows=len(rows), source=self.spec.source)
        elif not ids:
            rows = self.head(batchio.num_rows(batch), self.spec.fraction) if self.hit(step) else []
            if rows:
                self.fired(step, rows=len(rows), source=None)
        elif self.hit(step) and self.first_run(step):
            rows = self.head(batchio.num_rows(batch), self.spec.fraction)
            self.bad_ids.update(ids[r] for r in rows)
            self.persist(batch, self.bad_ids)
            self.fired(step, rows=len(rows), samples=[ids[r] for r in rows][:8])
        else:
            rows = [r for r, sid in enumerate(ids) if sid in self.bad_ids]
            if rows:
                self.fired(step, rows=len(rows), recurring=True)
        return self.rewrite(step, batch, rows, ids)


class MixtureShiftInjector(Injector):
    """From ``step`` on the loader is asked to sample with other source weights (benign, harder data)."""

    spec: MixtureShift

    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        super().__init__(spec, index, ctx)
        self.announced = False

    def mixture(self, step: int) -> dict[str, float] | None:
        if step < self.spec.step:
            return None
        if not self.announced:
            self.announced = True
            self.fired(step, weights=self.spec.weights)
        return dict(self.spec.weights)
