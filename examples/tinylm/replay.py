"""What the supervisor's `replay` action needs to rebuild this job in one process.

The runtime (supervisor/ranks/replay.py) loads the last healthy checkpoint into a fresh
model and runs forward/backward on the suspect batch and on a control batch of normal
samples. Batches are rebuilt from sample IDs, so the replay sees exactly the stored data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from examples.tinylm.data import TextDataset, collate
from examples.tinylm.model import lm_loss


@dataclass
class ReplayHooks:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: TextDataset

    def batch(self, sample_ids: list[str]) -> dict[str, Any]:
        """A batch of exactly these samples; unknown IDs are an error, never silently dropped.
        ``index_of`` finds each by binary search: no table of every ID is built."""
        at = [self.dataset.index_of(s) for s in sample_ids]
        missing = [s for s, i in zip(sample_ids, at, strict=True) if i is None]
        if missing or not sample_ids:
            raise KeyError(f"samples not in the dataset: {missing[:3] or 'none given'}")
        return collate([self.dataset[i] for i in at if i is not None])

    def control_batch(self, n: int, exclude: set[str]) -> tuple[dict[str, Any], list[str]]:
        """``n`` normal samples, spread evenly over the dataset (deterministic), none of ``exclude``."""
        stride = max(1, len(self.dataset) // (4 * max(n, 1)))
        ids = (self.dataset.sample_id(i) for i in range(0, len(self.dataset), stride))
        chosen = list(itertools.islice((sid for sid in ids if sid not in exclude), n))
        return self.batch(chosen), chosen

    @staticmethod
    def loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return lm_loss(model, batch).loss


def replay_hooks(config: dict[str, Any], job: Any = None) -> Any:
    """Fresh model, optimizer and dataset built exactly as a single-process run of this job.

    With ``job`` (its JobSpec), samples that a drill's data fault corrupted are rebuilt as the
    training saw them, so a replay of a drill reproduces what the workers trained on.
    """
    from examples.tinylm.train import build  # the entrypoint module imports this one
    from supervisor.drills.glue import replay_view  # drills

    model, optimizer, _scheduler, dataset = build(config, int(config.get("max_steps", 200)))
    hooks = ReplayHooks(model=model, optimizer=optimizer, dataset=dataset)
    return replay_view(hooks, job) if job is not None else hooks
