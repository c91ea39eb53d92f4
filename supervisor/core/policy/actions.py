"""The action registry: every action a policy may list, with its validated parameters.

An action name maps to a pydantic params model (docs/architecture.md, Registries): a policy that names an
action missing here fails at load time with the list of valid names. The runtime executes
actions by the same names; the engine only plans them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from supervisor.core.policy.args import (
    ApplyArgs,
    Args,
    MessageArgs,
    NoArgs,
    ObserveArgs,
    ReplayArgs,
    RollbackArgs,
    SnapshotArgs,
)
from supervisor.errors import PolicyError

OnFailure = Literal["escalate", "stop", "continue"]
"""What the runtime does when an action fails: hand over to a person, stop the job, or go on."""


class ActionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AlertParams(ActionParams):
    """Send the incident summary (log + webhook). Never changes training."""

    message: str | None = Field(None, description="Extra line added to the incident summary.")
    page: bool = Field(
        True,
        description="POST the summary to the job's webhook (the page); false: the log line and the "
        "incident record only, a note no one is paged for.",
    )


class FreezeParams(ActionParams):
    """Pause every worker at the next step boundary (cooperative)."""


class SnapshotParams(ActionParams):
    """Save the current (suspect) state, marked `diagnostic`: evidence, never a rollback target."""

    include_optimizer: bool = Field(True, description="Also save optimizer moments (to inspect for NaN/Inf).")


class BlockLatestParams(ActionParams):
    """Stop `latest` from advancing while the incident is open."""


class ReplayParams(ActionParams):
    """Replay the suspect batch and a control batch from the last healthy checkpoint, at small scale."""

    batches: int = Field(1, ge=1, le=64, description="Suspect batches to replay (from the onset step).")
    control: bool = Field(True, description="Also replay a control batch from before the onset.")
    other_rank: bool = Field(
        False, description="Replay on a different rank than the first deviating one (hardware suspect test)."
    )


class RollbackParams(ActionParams):
    """Roll back to the newest healthy checkpoint at least `margin_steps` before the onset."""

    margin_steps: int = Field(100, ge=0, description="Steps between the target checkpoint and the onset.")
    require_verified: bool = Field(True, description="Always true: the target is re-verified before loading.")
    min_mark: Literal["healthy", "verified"] = Field(
        "healthy", description="Weakest health mark a target may have (`diagnostic` never qualifies)."
    )
    check_completeness: bool = Field(
        False,
        description="Also require every state component (optimizer, scheduler, scaler, rng, data cursor).",
    )
    lr_dated_margin_steps: int | None = Field(
        None,
        ge=0,
        description=(
            "The margin when the onset is the step the LR left its level (finding `lr_jump`, at or before "
            "the first anomaly): no earlier step ran at that LR, so the margin's room for an onset dated "
            "late is not needed; null: `margin_steps` applies."
        ),
    )
    from_start: bool = Field(
        True,
        description=(
            "With no checkpoint before the onset and the onset within the run's first checkpoint "
            "interval (checkpoint.every_steps), restart the worker group from the run's start (the job's "
            "initial state, its data from the beginning, the plan's exclusions kept) instead of escalating."
        ),
    )

    @field_validator("require_verified")
    @classmethod
    def _verified(cls, v: bool) -> bool:
        if not v:
            raise ValueError("cannot be false: a rollback target must always be verified")
        return v


class Exclude(ActionParams):
    """What to take out of the data stream. Symbolic values refer to the incident's diagnosis."""

    samples: Literal["suspects"] | list[str] | None = Field(
        None, description="`suspects` (the diagnosis' suspect samples) or explicit sample IDs."
    )
    sources: Literal["suspect"] | list[str] | None = Field(
        None, description="`suspect` (the source the incident is confined to) or explicit source names."
    )
    batch_range: Literal["incident"] | tuple[int, int] | None = Field(
        None, description="`incident` (onset..end step) or an explicit [first, last] step range."
    )

    @model_validator(mode="after")
    def _something(self) -> Exclude:
        if self.samples is None and self.sources is None and self.batch_range is None:
            raise ValueError("exclude needs at least one of samples, sources, batch_range")
        if isinstance(self.batch_range, tuple) and self.batch_range[0] > self.batch_range[1]:
            raise ValueError(f"batch_range first step > last step (got {list(self.batch_range)})")
        return self


class ApplyParams(ActionParams):
    """Change the training recipe from the resume point on."""

    lr_scale: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Multiply the LR the job runs now (its schedule times any override in force) by this.",
    )
    lr_scale_on_retry: float | None = Field(
        None,
        gt=0,
        lt=1,
        description=(
            "On a later attempt of the same incident (it came back after a recovery), also multiply "
            "the LR in force by this: the same recipe is not tried twice."
        ),
    )
    warmup_steps: int | Literal["to_onset"] | None = Field(
        None,
        description=(
            "Re-warm the LR from zero over this many steps (>= 1), or `to_onset`: over the steps from the "
            "rollback target to the incident's onset, so the stretch that blew up is re-run at a lower LR "
            "and the schedule is back on plan from the onset on."
        ),
    )
    grad_clip: float | None = Field(
        None,
        gt=0,
        description="Clip the global grad norm at this value (dropped when the job already clips at or below it).",
    )
    grad_clip_scale: float | None = Field(
        None,
        gt=0,
        lt=1,
        description=(
            "Clip at this share of the clip in force (e.g. 0.5: half); a job that does not clip is "
            "clipped at this share of its median grad norm before the onset."
        ),
    )
    precision: Literal["fp32", "bf16", "fp16"] | None = Field(None, description="Switch compute precision.")
    exclude: Exclude | None = Field(None, description="Data to quarantine.")
    skip_batches: int | None = Field(None, ge=1, description="Skip this many batches after the resume point.")

    @field_validator("warmup_steps")
    @classmethod
    def _warmup(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be >= 1 or `to_onset` (got {v})")
        return v

    @model_validator(mode="after")
    def _something(self) -> ApplyParams:
        if all(getattr(self, f) is None for f in type(self).model_fields):
            names = ", ".join(type(self).model_fields)
            raise ValueError(f"apply needs at least one of {names}")
        if self.grad_clip is not None and self.grad_clip_scale is not None:
            raise ValueError("set grad_clip (absolute) or grad_clip_scale (relative), not both")
        return self


class PassCriteria(ActionParams):
    """Checks of the observation window against the pre-incident baseline."""

    loss_within_mads: float = Field(3.0, gt=0, description="Loss stays within N MADs of the baseline median.")
    grad_norm_ratio_max: float = Field(2.0, gt=1, description="Grad norm median ≤ N × baseline median.")
    update_ratio_max: float = Field(2.0, gt=1, description="Update ratio median ≤ N × baseline median.")
    throughput: bool | Literal["auto"] | None = Field(
        None,
        description="Judge throughput: true, false or auto (default: the policy's observation.throughput).",
    )
    throughput_min_ratio: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Sustained tokens/s >= N x the run's own baseline (default: observation.throughput_min_ratio).",
    )


class ObserveParams(ActionParams):
    """Watch N steps after the fix; the action fails if a pass criterion fails."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    steps: int = Field(
        100,
        ge=50,
        le=200,
        description="Minimum length of the window; it also runs past the onset (observation.onset_margin_steps).",
    )
    pass_: PassCriteria = Field(default_factory=PassCriteria, alias="pass")  # type: ignore[arg-type]


class ResumeParams(ActionParams):
    """Let the workers continue (after a freeze / rollback)."""


class EscalateParams(ActionParams):
    """Hand the incident to a person; training stays frozen."""

    message: str | None = Field(None, description="Why, in the policy author's words.")


class StopParams(ActionParams):
    """Stop the job (after a final snapshot is the caller's choice)."""

    message: str | None = Field(None, description="Why, in the policy author's words.")


@dataclass(frozen=True, slots=True)
class ActionKind:
    """One row of the action table (docs/architecture.md, "The action table"): what an action
    means to every part of the supervisor. Nothing else lists action names by meaning."""

    name: str
    params: type[ActionParams]
    args: type[Args]  # its parameters resolved against one incident: what the runtime reads
    summary: str
    event: str  # the timeline event its run is recorded as (an ``incidents.EventKind`` value)
    did: str | None  # how the run summary says it was done (None: not listed; stop is a note)
    enters: str | None = None  # the incident state it moves into when it begins (``IncidentState``)
    irreversible: bool = False
    """Once started, a changed diagnosis no longer re-makes the plan: it changed the state or the
    data the run trains on, ran the suspect batch again, or handed over / ended the job."""
    needs_workers: bool = False  # skipped because training ended, it leaves the fault unhandled
    ends_plan: bool = False  # nothing after it in a plan runs
    continues: bool = False  # lets training go on with the current state (never a broken one)
    releases_freeze: bool = False  # lets frozen workers go on (a plan that froze ends with one)
    steer_only: bool = False  # needs the SDK at the step boundary (docs/integrations.md, "Recovery")


def action_names() -> list[str]:
    return sorted(ACTIONS)


def names_where(flag: str) -> frozenset[str]:
    """The names of the actions whose ``flag`` (an ``ActionKind`` field) is true."""
    return frozenset(n for n, k in ACTIONS.items() if getattr(k, flag))


def parse_args(name: str, params: Any) -> Args:
    """The typed arguments of action ``name`` from its JSON params (or the model itself)."""
    if name not in ACTIONS:
        raise ValueError(f"unknown action {name!r} (valid: {', '.join(action_names())})")
    model = ACTIONS[name].args
    return params if isinstance(params, model) else model.model_validate(dict(params or {}))


def get_action(name: str) -> ActionKind:
    """The registered action, or PolicyError naming the valid ones."""
    try:
        return ACTIONS[name]
    except (KeyError, TypeError):
        raise PolicyError(f"unknown action {name!r} (valid: {', '.join(action_names())})") from None


ACTIONS: dict[str, ActionKind] = {}
_K = ActionKind
for _kind in (
    _K("alert", AlertParams, MessageArgs, "send the incident summary", "alert_sent", "alert"),
    _K("freeze", FreezeParams, NoArgs, "pause all workers at the next step boundary", "froze", "froze",
       enters="frozen", needs_workers=True, steer_only=True),
    _K("snapshot", SnapshotParams, SnapshotArgs, "save the suspect state as a diagnostic checkpoint", "snapshot", "snapshot",
       enters="frozen", needs_workers=True, steer_only=True),
    _K("block_latest", BlockLatestParams, NoArgs, "stop `latest` from advancing", "latest_blocked", "blocked latest",
       enters="frozen"),
    _K("replay", ReplayParams, ReplayArgs, "replay the suspect and a control batch at small scale", "replayed", "replayed",
       enters="acting", irreversible=True, steer_only=True),
    _K("rollback", RollbackParams, RollbackArgs, "restore a verified healthy checkpoint before the onset", "rolled_back",
       "rolled back", enters="acting", irreversible=True, needs_workers=True),
    _K("apply", ApplyParams, ApplyArgs, "change LR / warmup / clipping / precision / data", "fix_applied", "applied fix",
       enters="acting", irreversible=True, needs_workers=True, continues=True),
    _K("observe", ObserveParams, ObserveArgs, "watch a window of steps against the baseline", "observation", "observed",
       enters="observing", continues=True, releases_freeze=True),
    _K("resume", ResumeParams, NoArgs, "let training continue", "resumed", "resumed", continues=True,
       releases_freeze=True),
    _K("escalate", EscalateParams, MessageArgs, "hand the incident to a person", "escalated", "escalated",
       irreversible=True, ends_plan=True),
    _K("stop", StopParams, MessageArgs, "stop the job", "note", None, irreversible=True, ends_plan=True),
):  # fmt: skip
    if ACTIONS.setdefault(_kind.name, _kind) is not _kind:
        raise ValueError(f"action {_kind.name!r} registered twice")
del _K

TERMINAL = names_where("ends_plan")
CONTINUES = names_where("continues")
