"""Directives: what the supervisor asks a training job to do at its next step boundary.

Plain dataclasses with ``to_dict``/``from_dict`` (JSON-ready) and no torch import, so the
runtime can build and send them. Every directive has an ``id``; the probe acknowledges it
in the record of the step at whose boundary it took effect, as the event
``directive_applied:<id>:<kind>`` (or ``directive_failed:<id>:<kind>``). All data-parallel
ranks apply the same directive at the same step (rank 0 broadcasts it), otherwise ranks
would deadlock in collectives.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from supervisor.errors import SupervisorError


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Exclusions:
    """Data the loader must never yield again (merged into its persistent exclusion set)."""

    samples: tuple[str, ...] = ()
    """Stable sample IDs."""
    sources: tuple[str, ...] = ()
    """Source labels."""
    batch_ranges: tuple[tuple[int, int], ...] = ()
    """Inclusive ``(first, last)`` global batch indices (``attrs.batch`` in records)."""

    def __bool__(self) -> bool:
        return bool(self.samples or self.sources or self.batch_ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": list(self.samples),
            "sources": list(self.sources),
            "batch_ranges": [list(r) for r in self.batch_ranges],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Exclusions:
        d = d or {}
        ranges = tuple((int(a), int(b)) for a, b in d.get("batch_ranges", ()))
        return cls(tuple(map(str, d.get("samples", ()))), tuple(map(str, d.get("sources", ()))), ranges)


@dataclass(frozen=True)
class Directive:
    kind: ClassVar[str] = "directive"
    id: str = field(default_factory=_new_id, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, **asdict(self)}
        for k in list(out):
            value = getattr(self, k, None)
            if isinstance(value, Exclusions):
                out[k] = value.to_dict()
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Directive:
        """Rebuild any directive from its ``to_dict`` form; an unknown kind names the valid ones."""
        kind = d.get("kind")
        cls = DIRECTIVES.get(str(kind))
        if cls is None:
            raise SupervisorError(
                f"unknown directive kind {kind!r}; valid: {', '.join(sorted(DIRECTIVES))}", field="kind"
            )
        kw = {k: v for k, v in d.items() if k != "kind"}
        if "exclusions" in kw:
            kw["exclusions"] = Exclusions.from_dict(kw["exclusions"])
        return cls(**kw)


@dataclass(frozen=True)
class Continue(Directive):
    """Carry on; also releases a freeze."""

    kind: ClassVar[str] = "continue"


@dataclass(frozen=True)
class Freeze(Directive):
    """Park at the boundary with all state in memory until another directive arrives."""

    kind: ClassVar[str] = "freeze"
    reason: str = ""


@dataclass(frozen=True)
class Snapshot(Directive):
    """Save a diagnostic checkpoint (health mark ``diagnostic``: never a rollback target)."""

    kind: ClassVar[str] = "snapshot"
    reason: str = ""


@dataclass(frozen=True)
class RollbackInPlace(Directive):
    """Load model, optimizer, scheduler, scaler, RNG and data cursor from checkpoint ``step``."""

    kind: ClassVar[str] = "rollback"
    step: int = 0
    exclusions: Exclusions = field(default_factory=Exclusions)
    """Added to the restored exclusion set, so the suspect data is not replayed."""


@dataclass(frozen=True)
class ApplyOverrides(Directive):
    """Change the run from the next step on; ``None`` leaves a setting as it is."""

    kind: ClassVar[str] = "apply"
    lr_scale: float | None = None
    """Multiplier on the scheduled learning rate (1.0 restores it)."""
    warmup_steps: int | None = None
    """Re-warm the LR linearly from ~0 to its scheduled value over this many steps."""
    grad_clip: float | None = None
    """Max global grad norm (<= 0 turns clipping off)."""
    exclusions: Exclusions = field(default_factory=Exclusions)
    skip_batches: int = 0
    """Consume the next N batches without training on them."""


@dataclass(frozen=True)
class Stop(Directive):
    """End training at this boundary (the loader stops yielding)."""

    kind: ClassVar[str] = "stop"
    reason: str = ""


@dataclass(frozen=True)
class Finish(Directive):
    """Training reached its last step and the supervisor has nothing left to do with it: the
    ranks holding at that boundary may end (elsewhere it changes nothing)."""

    kind: ClassVar[str] = "finish"
    reason: str = ""


@dataclass(frozen=True)
class Replay(Directive):
    """Run the suspect batch and a control batch on every rank from checkpoint ``step``'s state,
    loaded in place of the live state, which is put back afterwards (``supervisor.sdk.replay``)."""

    kind: ClassVar[str] = "replay"
    step: int = 0
    suspects: tuple[str, ...] = ()
    """Stable sample IDs of the suspect batch."""
    numeric: bool = False
    """Also run the suspect batch in fp32 with the math SDPA backend."""
    deadline_s: float = 300.0
    """The replay gives up (live state put back, directive failed) when it runs longer."""


DIRECTIVES: dict[str, type[Directive]] = {
    c.kind: c for c in (Continue, Freeze, Snapshot, RollbackInPlace, ApplyOverrides, Stop, Finish, Replay)
}

END_REACHED = "end_reached"
"""Event of the control message a rank sends while it holds at its last step (``end_reached:<step>``)."""


def ack_event(directive: Directive, ok: bool = True) -> str:
    return f"directive_{'applied' if ok else 'failed'}:{directive.id}:{directive.kind}"
