"""MANIFEST.json: the commit marker and the record of one checkpoint (docs/checkpoints.md).

A checkpoint exists for readers only once its manifest exists. After the commit the
manifest is the one mutable object of a checkpoint: health changes and verification
results rewrite it whole, atomically (temp + rename locally, a single PUT on S3).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError

FORMAT_VERSION = 1

COMPONENTS = ("model", "optimizer", "scheduler", "scaler", "rng", "data_cursor", "exclusions")
"""Everything a checkpoint can hold; the manifest lists which ones this one has."""

TRANSITIONS: dict[HealthMark, frozenset[HealthMark]] = {
    HealthMark.UNVERIFIED: frozenset({HealthMark.VERIFIED, HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED}),
    HealthMark.VERIFIED: frozenset({HealthMark.HEALTHY, HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED}),
    # healthy -> verified: a later look at its window found an anomaly after all.
    HealthMark.HEALTHY: frozenset({HealthMark.VERIFIED, HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED}),
    HealthMark.DIAGNOSTIC: frozenset({HealthMark.QUARANTINED}),
    # quarantined -> unverified: an operator releases it; it must pass verification again.
    HealthMark.QUARANTINED: frozenset({HealthMark.UNVERIFIED}),
}
"""Valid health transitions; everything else is refused with the list of valid targets."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FileEntry(_Model):
    """One file of a checkpoint, relative to its step directory."""

    name: str = Field(description="File name inside the step directory.")
    size: int = Field(ge=0)
    checksum: str = Field(description="`<algorithm>:<hex>`")
    rank: int | None = Field(None, description="Writing rank; None for files shared by all ranks.")
    components: list[str] = Field(default_factory=list, description="Which COMPONENTS this file holds.")


class HealthChange(_Model):
    time: float
    from_: HealthMark = Field(alias="from")
    to: HealthMark
    reason: str


class Verification(_Model):
    time: float
    ok: bool
    checks: list[str] = Field(
        description="Checks that ran: files, sizes, checksums, components, loadable, world_size."
    )
    problems: list[str] = Field(default_factory=list)
    by: str = Field("store", description="Who asked: store, rollback, cli.")


class Manifest(_Model):
    format: int = FORMAT_VERSION
    job: str
    step: int = Field(ge=0)
    world_size: int = Field(ge=1)
    created_at: float = Field(default_factory=time.time)
    layout: Literal["replicated", "sharded", "dcp"] = Field(
        "replicated",
        description="dcp: model + optimizer in a torch.distributed.checkpoint directory (any world size); "
        "replicated: one torch.save model copy (DDP); sharded: each rank's torch.save shard.",
    )
    source: str | None = Field(
        None,
        description="Adopted checkpoint: the storage key of the directory a framework wrote its files in "
        "(file names are relative to it); None: the files are in the step directory.",
    )
    files: list[FileEntry]
    components: list[str] = Field(default_factory=list)
    metrics: dict[str, float | None] = Field(default_factory=dict, description="Metrics at save time.")
    extra: dict[str, Any] = Field(default_factory=dict, description="Training facts: batch sizes, summaries.")
    health: HealthMark = HealthMark.UNVERIFIED
    history: list[HealthChange] = Field(default_factory=list)
    verifications: list[Verification] = Field(default_factory=list)

    @property
    def last_verification(self) -> Verification | None:
        return self.verifications[-1] if self.verifications else None

    def file(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> Manifest:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise CheckpointError(f"corrupt manifest: {err['msg']}", source=source, field=field) from None

    def with_health(self, to: HealthMark, reason: str) -> Manifest:
        """A copy moved to ``to``; raises CheckpointError naming the valid targets."""
        if to == self.health:
            return self
        allowed = TRANSITIONS[self.health]
        if to not in allowed:
            valid = ", ".join(sorted(m.value for m in allowed))
            raise CheckpointError(
                f"cannot mark step {self.step} {to.value}: it is {self.health.value}; valid: {valid}",
                source=self.job,
            )
        change = HealthChange.model_validate(
            {"time": time.time(), "from": self.health, "to": to, "reason": reason}
        )
        return self.model_copy(update={"health": to, "history": [*self.history, change]})
