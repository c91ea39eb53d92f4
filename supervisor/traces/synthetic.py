"""Synthetic healthy telemetry, for unit tests of the rules and for the throughput benchmark.

A loss curve ``floor + amplitude * exp(-step / tau)`` with multiplicative per-rank noise
(Gaussian, or Student-t with 3 degrees of freedom for heavy tails), a grad norm with its own
noise and rare one-step blips, a smooth LR schedule, update ratio, tokens and sample IDs.
Faults are injected by the caller by editing records (``set_loss`` keeps ``loss_sum`` true).
"""

from __future__ import annotations

import math
import random

from supervisor.core.records import Record


def _noise(rng: random.Random, sigma: float, heavy: bool) -> float:
    if not heavy:
        return rng.gauss(0.0, sigma)
    # Student-t(3) scaled to the same median absolute deviation as N(0, sigma).
    z = rng.gauss(0.0, 1.0)
    chi = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3))
    return sigma * 0.6745 / 0.7649 * z / math.sqrt(chi / 3)


def synthetic_records(
    steps: int = 400,
    ranks: int = 4,
    seed: int = 0,
    *,
    loss_noise: float = 0.03,
    grad_noise: float = 0.1,
    heavy_tail: bool = False,
    grad_blip_rate: float = 0.0,
    tokens: int = 1024,
    samples_per_rank: int = 2,
    first_step: int = 1,
) -> list[Record]:
    rng = random.Random(seed)
    out: list[Record] = []
    for step in range(first_step, first_step + steps):
        base = 2.0 + 3.0 * math.exp(-step / 80.0)
        grad = 0.8 * math.exp(_noise(rng, grad_noise, heavy_tail))
        if grad_blip_rate and rng.random() < grad_blip_rate:
            grad *= 3.0 + 5.0 * rng.random()
        lr = 1e-3 * min(1.0, step / 20.0)
        for rank in range(ranks):
            loss = base * math.exp(_noise(rng, loss_noise, heavy_tail))
            tok = tokens
            out.append(
                Record(
                    step=step,
                    rank=rank,
                    world_size=ranks,
                    loss=loss,
                    loss_sum=loss * tok,
                    tokens=tok,
                    lr=lr,
                    grad_norm=grad,
                    param_norm=100.0,
                    update_norm=100.0 * lr * 2.0 * math.exp(_noise(rng, 0.05, False)),
                    samples=[f"s{step}r{rank}i{i}" for i in range(samples_per_rank)],
                    param_checksum=f"c{step}",
                )
            )
    return out


def set_loss(rec: Record, loss: float) -> None:
    """Change a record's loss and keep ``loss_sum / tokens`` consistent with it."""
    rec.loss = loss
    if rec.tokens:
        rec.loss_sum = loss * rec.tokens


def at(records: list[Record], step: int, rank: int | None = None) -> list[Record]:
    """The records of ``step`` (of one rank, when given)."""
    return [r for r in records if r.step == step and (rank is None or r.rank == rank)]
