"""The cells of the matrix: family x optimizer x fault x load, and the job each one launches.

Faults come from the drills (``supervisor/drills``: ``lr_spike``, ``garbage_batch``,
``overflow``) except two bugs in the job itself: the persistent LR bug is in the job's own
schedule (``config.lr_bug``): every timeline has it, rollbacks included, so only a person
can fix it and the expected outcome is an escalation after bounded attempts; the bad source
(``config.bad_source``) is one source of the data mixture that serves random bytes from a
step on (its files overwritten, a broken upstream): every sample of it is garbage from then
on, whichever timeline reads it, until the source is kept out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.job import JobSpec

FAMILIES = ("gru", "encoder", "convnet")
OPTIMIZERS = ("adamw", "sgd")
LOADS = ("idle", "busy")
#: The data each family trains on: real text for the LMs, synthetic sequences for the CNN.
DATA = {"gru": "stdlib", "encoder": "stdlib", "convnet": "synthetic"}
#: The source that turns bad in the `bad_source` cell: the largest of four in the mixture, half of
#: the samples (web text's share in most pretraining mixtures). That cell's final loss is compared
#: with the clean run's on the other three sources.
BAD_SOURCE = "web"

#: Where the `nan_step` overflow is injected when the drill's default (the middle nn.Linear) does
#: not work: nn.MultiheadAttention calls its out_proj functionally, so a hook on it never fires.
#: Names are as the probe sees the model (wrapped in DDP: `module.`).
OVERFLOW_MODULE = {"encoder": "module.enc.layers.0.linear1"}

MAX_STEPS = 150
"""Steps of every run; the fault comes at ``fault_step`` (90)."""
CHECKPOINT_EVERY = 20
BATCH_SIZE = 16
"""Per rank. These models are overhead-bound: 16 costs ~15-30% more CPU per step than 8 and halves
the loss noise, so the fault can come earlier (at step 80 with 8, a garbage batch went unseen)."""
RUNTIME = {"loop_interval_s": 0.2, "poll_interval_s": 0.25}
"""job.yaml ``runtime:`` knobs any user can set (defaults 0.05 / 0.1): the supervisor's idle loop
and each rank's link wake less often. Records still go out at every step and directives arrive
by long poll, so a fault is seen and acted on as soon; what shrinks is the polling CPU, which
grows with wall time when 6 jobs share 2 cores."""


def fault_step(max_steps: int) -> int:
    """Three fifths into the run (step 90 of 150): after the LR warm-up (20 steps) and the
    detector's history (50 steps), where the loss has settled enough for a one-rank garbage batch
    to stand out (batches of 16: at step 80 with batches of 8 rank 1 at 2x the loss went
    undetected), with four checkpoints before it (a rollback 50 steps before the onset has a
    healthy target, step 40) and 60 steps after it to recover, pass the observation window and
    be judged."""
    return max_steps * 3 // 5


@dataclass(frozen=True)
class Fault:
    """A fault of the matrix. Every ``step`` in ``faults`` and ``config`` is relative to the
    fault's onset (``fault_step``): 0 is the onset itself."""

    name: str
    description: str
    faults: tuple[dict[str, Any], ...] = ()
    config: tuple[tuple[str, Any], ...] = ()
    escalates: bool = False
    """The expected outcome: the job escalates (the persistent LR bug) instead of finishing."""
    cost: int = 1
    """Relative run time (recoveries re-run steps): longer cells start first, so the last jobs
    running at once are short ones and the cores stay busy to the end."""

    def at(self, onset: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(drill faults, job config) with steps made absolute."""

        def absolute(x: Any) -> Any:
            return {**x, "step": onset + x["step"]} if isinstance(x, dict) and "step" in x else x

        return [absolute(dict(x)) for x in self.faults], {k: absolute(v) for k, v in self.config}


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("clean", "no fault: the reference run; no incident of severity medium or more"),
        Fault(
            "lr_cured",
            "LR x30 from the onset until rolled back (a bad scheduler state)",
            ({"kind": "lr_spike", "step": 0, "factor": 30},),
            cost=2,
        ),
        Fault(
            "lr_persistent",
            "LR x30 from the onset in the job's own schedule: every timeline has it",
            config=(("lr_bug", {"step": 0, "factor": 30}),),
            escalates=True,
            cost=3,
        ),
        Fault(
            "garbage_rank",
            "one batch of random tokens on rank 1 at the onset",
            ({"kind": "garbage_batch", "step": 0, "rank": 1},),
        ),
        Fault(
            "nan_step",
            "one module's output overflows to Inf at the onset (one step, every rank)",
            ({"kind": "overflow", "step": 0, "steps": 1},),
            cost=2,
        ),
        Fault(
            "bad_source",
            f"source `{BAD_SOURCE}` (half of the samples) serves random bytes from the onset on",
            config=(("bad_source", {"source": BAD_SOURCE, "step": 0}),),
            cost=2,
        ),
    )
}


@dataclass(frozen=True)
class Cell:
    family: str
    optimizer: str
    fault: str
    load: str

    @property
    def name(self) -> str:
        return f"{self.family}-{self.optimizer}-{self.fault}-{self.load}"

    @property
    def reference(self) -> Cell:
        """The clean run this cell's final loss is compared with (same model, optimizer and load)."""
        return Cell(self.family, self.optimizer, "clean", self.load)

    def job(self, storage: Path, max_steps: int = MAX_STEPS) -> JobSpec:
        faults, fault_config = FAULTS[self.fault].at(fault_step(max_steps))
        for x in faults:
            if x["kind"] == "overflow" and self.family in OVERFLOW_MODULE:
                x["module"] = OVERFLOW_MODULE[self.family]
        config: dict[str, Any] = {
            "family": self.family,
            "optimizer": self.optimizer,
            "data": DATA[self.family],
            "d_model": 32,
            "seq_len": 32,
            "batch_size": BATCH_SIZE,
            "bytes_per_source": 60_000,
            "extra_source": BAD_SOURCE,
            **fault_config,
        }
        return JobSpec.model_validate(
            {
                "name": f"matrix-{self.name}",
                "entrypoint": "bench.matrix.job:main",
                "config": config,
                "resources": {"num_workers": 2, "cpus_per_worker": 1},
                "storage": {"path": str(storage)},
                "checkpoint": {"every_steps": CHECKPOINT_EVERY, "keep": 12},
                "policy": "default",
                "max_steps": max_steps,
                "faults": faults,
                "runtime": RUNTIME,
            }
        )


def cells(
    families: tuple[str, ...] = FAMILIES,
    optimizers: tuple[str, ...] = OPTIMIZERS,
    faults: tuple[str, ...] = tuple(FAULTS),
    loads: tuple[str, ...] = LOADS,
) -> list[Cell]:
    """Every combination; the clean reference of each (family, optimizer, load) comes first."""
    order = ("clean", *[f for f in faults if f != "clean"])
    return [
        Cell(fam, opt, fault, load)
        for load in loads
        for fam in families
        for opt in optimizers
        for fault in order
        if fault in faults or fault == "clean"
    ]
