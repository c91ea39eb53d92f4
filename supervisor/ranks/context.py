"""What a supervised training function receives as ``ctx``: who it is and how to talk back.

No Ray import here: the SDK's ``sdk.init(ctx)`` reads these attributes, and a test or an
offline run can build one by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.config.job import JobSpec


@dataclass
class WorkerContext:
    """One rank of the worker group, as seen by the training function."""

    rank: int
    world_size: int
    job: JobSpec
    #: The SDK ``Transport`` to the supervisor: ``send(batch)`` never blocks, ``poll()`` gives directives.
    transport: Any
    #: Step of the checkpoint to resume from (None: start fresh).
    resume_step: int | None = None
    #: Worker-group generation: 0 at launch, +1 at every restart of the group.
    generation: int = 0
    local_rank: int = 0
    #: "cpu" or "cuda" (Ray sets CUDA_VISIBLE_DEVICES per worker, so the device index is 0).
    device: str = "cpu"
    #: The job's ``CheckpointStore`` (opened by the worker from ``job.storage``), or None.
    checkpoint_store: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.job.config)

    @property
    def max_steps(self) -> int:
        return self.job.max_steps

    @property
    def checkpoint_every(self) -> int:
        return self.job.checkpoint.every_steps
