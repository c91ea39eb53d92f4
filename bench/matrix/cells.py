"""The cells of the matrix: family x optimizer x fault x load, and the job each one launches.

Faults come from the drills (``supervisor/drills``: ``lr_spike``, ``garbage_batch``,
``overflow``, ``periodic_garbage``) except the persistent LR bug, which is a bug in the job's
own schedule (``config.lr_bug``): every timeline has it, rollbacks included, so only a person
can fix it and the expected outcome is an escalation after bounded attempts.
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
#: The source that turns bad in the `bad_source` cell: a small one, so excluding it leaves the
#: data (and the loss the run is compared on) close to the clean run's.
BAD_SOURCE = "web"

#: Where the `nan_step` overflow is injected when the drill's default (the middle nn.Linear) does
#: not work: nn.MultiheadAttention calls its out_proj functionally, so a hook on it never fires.
#: Names are as the probe sees the model (wrapped in DDP: `module.`).
OVERFLOW_MODULE = {"encoder": "module.enc.layers.0.linear1"}

FAULT_AT = 120
MAX_STEPS = 240


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    faults: tuple[dict[str, Any], ...] = ()
    config: tuple[tuple[str, Any], ...] = ()
    escalates: bool = False
    """The expected outcome: the job escalates (the persistent LR bug) instead of finishing."""


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("clean", "no fault: the reference run; no incident of severity medium or more"),
        Fault(
            "lr_cured",
            f"LR x30 from step {FAULT_AT} until rolled back (a bad scheduler state)",
            ({"kind": "lr_spike", "step": FAULT_AT, "factor": 30},),
        ),
        Fault(
            "lr_persistent",
            f"LR x30 from step {FAULT_AT} in the job's own schedule: every timeline has it",
            config=(("lr_bug", {"step": FAULT_AT, "factor": 30}),),
            escalates=True,
        ),
        Fault(
            "garbage_rank",
            f"one batch of random tokens on rank 1 at step {FAULT_AT}",
            ({"kind": "garbage_batch", "step": FAULT_AT, "rank": 1},),
        ),
        Fault(
            "nan_step",
            f"one module's output overflows to Inf at step {FAULT_AT} (one step, every rank)",
            ({"kind": "overflow", "step": FAULT_AT, "steps": 1},),
        ),
        Fault(
            "bad_source",
            f"source `{BAD_SOURCE}` emits garbage every 10 steps from step {FAULT_AT - 20}",
            (
                {
                    "kind": "periodic_garbage",
                    "step": FAULT_AT - 20,
                    "period": 10,
                    "count": 6,
                    "source": BAD_SOURCE,
                },
            ),
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
        f = FAULTS[self.fault]
        faults = [dict(x) for x in f.faults]
        for x in faults:
            if x["kind"] == "overflow" and self.family in OVERFLOW_MODULE:
                x["module"] = OVERFLOW_MODULE[self.family]
        config: dict[str, Any] = {
            "family": self.family,
            "optimizer": self.optimizer,
            "data": DATA[self.family],
            "d_model": 32,
            "seq_len": 32,
            "batch_size": 8,
            "bytes_per_source": 60_000,
            "extra_source": BAD_SOURCE,
            **dict(f.config),
        }
        return JobSpec.model_validate(
            {
                "name": f"matrix-{self.name}",
                "entrypoint": "bench.matrix.job:main",
                "config": config,
                "resources": {"num_workers": 2, "cpus_per_worker": 1},
                "storage": {"path": str(storage)},
                "checkpoint": {"every_steps": 20, "keep": 12},
                "policy": "default",
                "max_steps": max_steps,
                "faults": faults,
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
