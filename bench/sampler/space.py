"""The sampler's space and its seeded draws (pure Python: no torch, no Ray).

A *base* is one training run: model family, optimizer, LR schedule, gradient accumulation,
precision and ranks, drawn from a base seed. A *fault cell* is a base plus one fault at one
moment, drawn from a fault seed; its reference is the base run clean (the *clean cell*). A cell
is named ``B:F`` (base seed, fault seed; ``B`` alone for a clean cell) and ``draw_base(B)`` /
``draw_fault(F, base)`` rebuild it exactly, so the command a failing cell prints
(``python -m bench.sampler --cell B:F``) runs the same cell again.

One invocation with seed ``S`` draws ``M`` bases (the clean cells) and ``N`` fault cells, fault
cell ``k`` on base ``k % M``: every fault cell has its own clean run, and ``N + M`` runs in all.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

FAMILIES = ("llama", "gpt2", "moe", "lstm", "cnn", "mlp")
OPTIMIZERS = ("adamw", "sgd", "lion")
SCHEDULES = ("warmup_cosine", "wsd", "constant", "inv_sqrt")
SCHEDULE_VARIANTS = ("step_decay", "cosine_restarts")
"""Schedules whose LR jumps as planned (x0.1 at milestones; back to the peak at each restart): a
quarter of the bases, drawn after every field above, so a base seed keeps its other fields."""
ACCUMULATION = (1, 2, 3, 4)
PRECISIONS = ("fp32", "bf16", "fp16")
RANKS = (2, 3, 4)
FAULTS = (
    "lr_cured",
    "lr_persistent",
    "garbage_rank",
    "nan_rank",
    "bad_source",
    "oversized_update",
    "optimizer_lost",
    "recurring_shard",
    "logging_bug",
    "mixture_shift",
    "worker_kill",
    "logging_then_lr",
)
MOMENTS = ("warmup", "after_checkpoint", "mid_run", "last_5pct")
LOADS = ("idle", "busy")

MAX_STEPS = 150
WARMUP_STEPS = 15
CHECKPOINT_EVERY = 20
RUN_LENGTHS = (120, 150, 200)
"""Steps of a run (the base's ``max_steps``)."""
CHECKPOINT_INTERVALS = (10, 20, 30, 50)
"""Steps between checkpoints (the base's ``checkpoint_every``): how far a rollback has to go back."""


def min_steps(every: int = CHECKPOINT_EVERY) -> int:
    """The shortest run every moment fits in with a checkpoint every ``every`` steps: a warm-up, a
    checkpoint's second save (and a step or two after it) before the final 5%."""
    return -(-(2 * every + 3) * 100 // 95)


MIN_STEPS = min_steps()
BAD_SOURCE = "web"
"""The fourth data source, as large as the three others together: the one `bad_source` breaks."""
ESCALATES = frozenset({"lr_persistent"})
"""Faults whose expected outcome is an escalation after bounded attempts (only a person can fix them)."""
BENIGN = frozenset({"logging_bug", "mixture_shift"})
"""Faults after which training is sound: nothing may be rolled back, kept out or escalated."""
SOURCES = ("code", "docstrings", "tests", BAD_SOURCE)
"""The job's data sources (bench/matrix/data.py ``stdlib`` plus the fourth): what `mixture_shift` weighs."""

#: The module the `nan_rank` overflow hits, per family: one that every forward runs (kept here, in
#: the pure module, so that the runner does not import torch; bench.sampler.models builds them).
OVERFLOW_MODULE = {
    "llama": "module.blocks.0.mlp.down",
    "gpt2": "module.blocks.0.fc2",
    "moe": "module.inp",
    "lstm": "module.head",
    "cnn": "module.proj",
    "mlp": "module.fc1",
}

ONE_RANK = frozenset({"garbage_rank", "nan_rank", "recurring_shard", "worker_kill"})
"""Faults that hit one rank (``Fault.rank``); the others hit every rank."""

_SEED_SPACE = 10**6


@dataclass(frozen=True)
class Base:
    seed: int
    family: str
    optimizer: str
    schedule: str
    accumulation: int
    precision: str
    ranks: int
    max_steps: int = MAX_STEPS
    checkpoint_every: int = CHECKPOINT_EVERY

    @property
    def name(self) -> str:
        return (
            f"{self.family}-{self.optimizer}-{self.schedule}-acc{self.accumulation}-{self.precision}"
            f"-r{self.ranks}-{self.max_steps}s-ck{self.checkpoint_every}"
        )


@dataclass(frozen=True)
class Fault:
    seed: int
    kind: str
    moment: str
    step: int
    """The onset (first faulty step; `recurring_shard`: its first occurrence, one of them at the moment)."""
    rank: int
    """The rank it hits (faults on one rank); 0 otherwise."""
    factor: float = 1.0
    """LR multiplier (`lr_cured`, `lr_persistent`, `oversized_update`)."""
    period: int = 0
    """`recurring_shard`: steps between occurrences."""
    fraction: float = 1.0
    """`recurring_shard`: share of the rank's batch from the bad shard."""
    mode: str = ""
    """`logging_bug`: `misreduced` (summed over ranks, not averaged) or `padding` (pad tokens counted)."""
    span: int = 0
    """`logging_bug`: steps the logged loss is wrong (to the end of the run at most)."""
    weights: tuple[tuple[str, float], ...] = ()
    """`mixture_shift`: (source, sampling weight) from the onset on."""
    logged_from: int = 0
    """`logging_then_lr`: the step the lasting logging error (``mode``) begins, before the LR fault."""
    corrupt_step: int = 0
    """`worker_kill`: the checkpoint (the newest before the kill) one byte of another rank's shard of
    is flipped first, so the restart must go further back; 0: none."""


@dataclass(frozen=True)
class Cell:
    base: Base
    fault: Fault | None
    load: str = "idle"

    @property
    def id(self) -> str:
        return f"{self.base.seed}:{self.fault.seed}" if self.fault else str(self.base.seed)

    @property
    def name(self) -> str:
        if self.fault is None:
            return f"{self.base.name}-clean"
        f = self.fault
        where = f"/rank{f.rank}" if f.kind in ONE_RANK else ""
        what = (
            f"-{f.mode}x{f.span}" if f.kind == "logging_bug"
            else f"-{f.mode}from{f.logged_from}" if f.kind == "logging_then_lr"
            else "-" + "+".join(f"{n}{w:g}" for n, w in f.weights) if f.kind == "mixture_shift"
            else f"+corrupt{f.corrupt_step}" if f.corrupt_step else ""
        )  # fmt: skip
        return f"{self.base.name}-{f.kind}{where}{what}@{f.step}({f.moment})"

    @property
    def escalates(self) -> bool:
        return self.fault is not None and self.fault.kind in ESCALATES

    def command(self) -> str:
        """One line that runs this cell again (with its clean reference)."""
        return f"python -m bench.sampler --cell {self.id}" + (" --busy" if self.load == "busy" else "")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "load": self.load, "base": asdict(self.base),
                "fault": asdict(self.fault) if self.fault else None}  # fmt: skip


def fresh_seed() -> int:
    return secrets.randbelow(_SEED_SPACE)


def draw_base(seed: int) -> Base:
    rng = random.Random(f"base:{seed}")
    base = Base(
        seed=seed,
        family=rng.choice(FAMILIES),
        optimizer=rng.choice(OPTIMIZERS),
        schedule=rng.choice(SCHEDULES),
        accumulation=rng.choice(ACCUMULATION),
        precision=rng.choice(PRECISIONS),
        ranks=rng.choice(RANKS),
        max_steps=rng.choice(RUN_LENGTHS),  # drawn after: the fields above are those of earlier commits
        checkpoint_every=rng.choice(CHECKPOINT_INTERVALS),
    )
    if rng.random() < 0.25:  # drawn last, as the two above were
        base = replace(base, schedule=rng.choice(SCHEDULE_VARIANTS))
    return base


def onset(moment: str, rng: random.Random, max_steps: int = MAX_STEPS, every: int = CHECKPOINT_EVERY) -> int:
    """A step for ``moment``: inside the LR warm-up (after the first few steps); one or two steps
    after a checkpoint saved every ``every`` steps (from the second one to the last before the final
    5%); anywhere in the middle third; or inside the last 5% of the run (before its very last step)."""
    if max_steps < min_steps(every):
        raise ValueError(
            f"max_steps {max_steps} is too short for the sampler's moments with a checkpoint every "
            f"{every} steps (at least {min_steps(every)})"
        )
    if moment == "warmup":
        return rng.randint(4, WARMUP_STEPS - 1)
    if moment == "after_checkpoint":
        last = (max_steps * 95 // 100 - 3) // every
        return every * rng.randint(2, max(2, last)) + rng.randint(1, 2)
    if moment == "mid_run":
        return rng.randint(max_steps // 3, 2 * max_steps // 3)
    if moment == "last_5pct":
        return rng.randint(max_steps - max_steps // 20, max_steps - 1)
    raise ValueError(f"unknown moment {moment!r} (valid: {', '.join(MOMENTS)})")


def draw_fault(seed: int, base: Base) -> Fault:
    rng = random.Random(f"fault:{seed}")
    max_steps, every = base.max_steps, base.checkpoint_every
    kind = rng.choice(FAULTS)
    moment = rng.choice(MOMENTS)
    step = onset(moment, rng, max_steps, every)
    rank = rng.randrange(base.ranks)
    factor, period, fraction = 1.0, 0, 1.0
    mode, span, corrupt_step, logged_from = "", 0, 0, 0
    weights: tuple[tuple[str, float], ...] = ()
    if kind in ("lr_cured", "lr_persistent", "logging_then_lr"):
        factor = float(rng.choice((20, 25, 30, 40)))
    if kind == "logging_then_lr":
        # The logged loss goes wrong for good 15-40 steps before the LR fault, which comes early
        # enough to be cured (20 steps before the end at least): the first must not hide the second.
        last = max_steps - 20
        if step > last:  # after a checkpoint still means one or two steps after one, from the second
            step = (
                (last - step % every) // every * every + step % every
                if moment == "after_checkpoint"
                else last
            )
            if step <= 2 * every:  # only the first checkpoint before it: no such moment fits
                moment, step = "mid_run", last
        logged_from = max(2, step - rng.randint(15, 40))
        mode = rng.choice(("misreduced", "padding"))
    elif kind == "oversized_update":
        factor = float(rng.choice((50, 100, 200)))
    elif kind == "recurring_shard":
        # The shard recurs every `period` steps and one occurrence falls at the moment drawn: the
        # onset is the first occurrence, as early as that allows (from step 4 on).
        period = rng.choice([p for p in (40, 50, 60) if 2 * p + 3 <= max_steps])  # two occurrences at least
        fraction = rng.choice((0.25, 0.5))
        step -= period * max(0, (step - 4) // period)
    elif kind == "logging_bug":
        mode = rng.choice(("misreduced", "padding"))
        span = min(rng.choice((1, 3, 10, max_steps)), max_steps - step + 1)  # max_steps: to the end
    elif kind == "mixture_shift":
        # A curriculum change: one source at weight 1, each other one dropped or down-weighted.
        lead = rng.choice(SOURCES)
        weights = tuple((n, 1.0 if n == lead else rng.choice((0.0, 0.1, 0.3))) for n in SOURCES)
    elif kind == "worker_kill" and rng.random() < 0.5 and step > every:
        corrupt_step = (step - 1) // every * every  # saved before the kill
    return Fault(
        seed,
        kind,
        moment,
        step,
        rank,
        factor,
        period,
        fraction,
        mode,
        span,
        weights,
        logged_from,
        corrupt_step,
    )


def parse_cell_id(text: str) -> tuple[int, int | None]:
    """``B:F`` or ``B`` -> (base seed, fault seed or None); ValueError on anything else."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--cell {text!r}: expected BASE_SEED or BASE_SEED:FAULT_SEED (digits)")
    return int(parts[0]), (int(parts[1]) if len(parts) == 2 else None)


def cell_from_id(text: str, load: str = "idle") -> Cell:
    base_seed, fault_seed = parse_cell_id(text)
    base = draw_base(base_seed)
    return Cell(base, draw_fault(fault_seed, base) if fault_seed is not None else None, load)


def draw(seed: int, cells: int, clean: int, load: str = "idle") -> tuple[list[Cell], list[Cell]]:
    """(clean cells, fault cells) of one invocation: fault cell k runs on base k % clean."""
    if cells > 0 and clean < 1:
        raise ValueError("--clean must be at least 1: every fault cell is compared with a clean run")
    rng = random.Random(f"invocation:{seed}")
    base_seeds: list[int] = []
    while len(base_seeds) < clean:
        b = rng.randrange(_SEED_SPACE)
        if b not in base_seeds:
            base_seeds.append(b)
    bases = [draw_base(b) for b in base_seeds]
    faults = []
    for k in range(cells):
        base = bases[k % clean]
        faults.append(Cell(base, draw_fault(rng.randrange(_SEED_SPACE), base), load))
    return [Cell(b, None, load) for b in bases], faults


def summary_line(passed: int, cells: int, clean_ok: int, clean: int, seed: int | str) -> str:
    return f"sampler: {passed}/{cells} fault cells passed, {clean_ok}/{clean} clean cells clean, seed {seed}"
