"""The job's phase (explicit, with ``is_terminal``) and the supervisor state that survives restarts.

::

    starting ──► running ◄──► incident ──► escalated
                   │  ▲            │
                   │  └─ restarting ◄── (worker died / hung / node lost)
                   ├──► finished
                   ├──► unfinished  (training ended while an incident still needed the workers)
                   ├──► failed      (the restart policy escalated, or the job itself raised)
                   └──► stopped     (`supervisor stop`)

The incident's own states live in the incident store (supervisor.incidents.states); the
phase says what the *job* is doing. Only ``Controller.set_phase`` changes it, logging the
old and new phase and the reason.
"""

from __future__ import annotations

import json
import operator
import os
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter

from supervisor.config.job import JobSpec
from supervisor.core.policy import Plan
from supervisor.incidents.paths import db_path_for_job
from supervisor.runtime.observe import StepStats

#: Incident steps of the current timeline kept (``RuntimeState.incident_steps``): checkpoints are
#: judged against the newest ones; older incidents lie far behind every checkpoint still unjudged.
INCIDENT_STEPS_KEPT = 64


class JobPhase(str, Enum):
    STARTING = "starting"
    """Ray connected; the worker group is being placed."""
    RUNNING = "running"
    """Training; records flow; no incident is being acted on."""
    INCIDENT = "incident"
    """A plan is being carried out (training may be frozen)."""
    RESTARTING = "restarting"
    """The worker group is being replaced from the newest verified checkpoint."""
    FINISHED = "finished"
    """Every rank finished its steps and no incident was left to handle."""
    UNFINISHED = "unfinished"
    """Training ended while an incident still needed the workers (the job could not be held at
    its last step): what was skipped is recorded, and a person decides."""
    ESCALATED = "escalated"
    """Stopped with state saved; a person must decide."""
    FAILED = "failed"
    """The job cannot go on (restarts exhausted, the training function raised, bad input)."""
    STOPPED = "stopped"
    """Stopped on request."""

    @property
    def is_terminal(self) -> bool:
        return self not in (JobPhase.STARTING, JobPhase.RUNNING, JobPhase.INCIDENT, JobPhase.RESTARTING)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for a job that ended in this phase (0 only when finished healthy)."""
        return 0 if self is JobPhase.FINISHED else 1


class ActivePlan(BaseModel):
    """The plan being carried out for one incident, and how far it got."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    incident_id: int
    plan_no: int
    plan: Plan
    index: int = 0
    baseline: dict[str, Any] | None = None
    observation_failures: int = 0
    downtime_from: float = 0.0
    """The job's downtime total when this incident's first plan started (its own share is the rest)."""
    irreversible: bool = False
    """An action that cannot be taken back (``irreversible`` in the action table,
    ``core.policy.actions``) has started: from here on a changed diagnosis no longer re-makes the plan."""


class RuntimeState(BaseModel):
    """Everything a restarted supervisor needs besides the incident store and the checkpoints."""

    # NaN and the infinities are written as such (as ``json.dumps`` writes them, and ``load`` reads
    # them back), never as null: a diverged step's loss, an incident's infinite peak.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    _history_json: str | None = PrivateAttr(default=None)  # ``hold_history``
    _analyzer_json: str | None = PrivateAttr(default=None)  # ``hold_analyzer``

    job: str
    phase: JobPhase = JobPhase.STARTING
    reason: str = ""
    generation: int = 0
    directives: list[dict[str, Any]] = Field(default_factory=list)
    watermark: int = -1
    analyzer: Any = None
    active: ActivePlan | None = None
    incident_keys: dict[str, int] = Field(default_factory=dict)
    attempts: dict[str, int] = Field(default_factory=dict)
    attempts_of: dict[str, int] = Field(default_factory=dict)
    """Incident id -> recovery attempts (plans) of that incident, earlier recurrences included."""
    last_incident_step: int | None = None
    incident_steps: list[int] = Field(default_factory=list)
    """Onsets of the incidents of the current timeline, newest last: a checkpoint whose healthy window
    holds one is never marked healthy, however late the fault was detected (a rollback or restart
    drops those after its target: a re-trained step is judged on what it did itself)."""
    frozen: bool = False
    checkpoints_seen: list[int] = Field(default_factory=list)
    checkpoints_verified: list[int] = Field(default_factory=list)
    checkpoints_healthy: list[int] = Field(default_factory=list)
    receipts: dict[str, int] = Field(default_factory=dict)
    """Per worker link: every record up to this seq is reflected in this state (receipts.py)."""
    acks: dict[str, dict[int, int]] = Field(default_factory=dict)
    """Directive id -> {rank: step} of its acknowledgements (they arrive inside records)."""
    failures: dict[str, dict[int, int]] = Field(default_factory=dict)
    history: list[dict[str, Any]] = Field(default_factory=list)
    """The newest per-step aggregates (baselines and observation windows are computed from them)."""
    batches: dict[int, int] = Field(default_factory=dict)
    effects: list[str] = Field(default_factory=list)
    """Keys of one-off effects already carried out (e.g. ``rewind:<directive id>``)."""
    ready_keys: list[str] = Field(default_factory=list)
    """Detector incident keys that became ready (acted on, or waiting their turn)."""
    folded_keys: list[str] = Field(default_factory=list)
    """Detector incident keys noted as more evidence of another incident's occurrence (the same
    onset), not incidents of their own (``IncidentFlow._occurrence_of``)."""
    waiting: list[int] = Field(default_factory=list)
    """Incident ids ready and waiting for the active plan to finish."""
    held_at: dict[int, int] = Field(default_factory=dict)
    """Rank -> step where that rank holds at the end of training, waiting for a release."""
    restart_steps: list[int] = Field(default_factory=list)
    """Steps at which the worker group was restarted (the restart policy counts them)."""
    restart_resumed_at: int | None = None
    """The step the newest restarted group resumed from (-1: from scratch); None: never restarted."""
    restarts_without_progress: int = 0
    """Restarted groups in a row that failed again before training a step past their resume point."""
    reported_grad_clip: float | None = None
    """The clip the job reports in its records (``attrs.grad_clip``), newest; None: never reported."""
    stalled_since: float | None = None
    downtime_s: float = 0.0
    """Wall time during which training did not advance (frozen, restarting, held at the end)."""
    time_lost: dict[str, Any] = Field(default_factory=dict)
    """Time lost to instability (``time_lost.TimeLedger``): the run's start, its effective training
    time, and per incident the steps and the time re-trained."""
    exit_code: int | None = None
    """Set when the job ended because Ray, the supervisor or storage failed (3: a worker group that
    would not start) rather than the job itself; None: the phase's own code (``JobPhase.exit_code``)."""

    def ended_with(self) -> int | None:
        """The CLI's exit code for this job; None while it runs."""
        if not self.phase.is_terminal:
            return None
        return self.exit_code if self.exit_code is not None else self.phase.exit_code

    def note_incident(self, step: int, onset: int | None) -> None:
        """An incident was detected (or came back) at ``step`` of the current timeline; its fault
        began at ``onset`` (what keeps a checkpoint near it from being marked healthy; None: one
        that keeps none, a metric artifact)."""
        self.last_incident_step = step
        if onset is not None:
            self.note_onset(onset)

    def note_onset(self, onset: int) -> None:
        """An incident of the current timeline began at ``onset`` (also one dated back by a refinement)."""
        if onset not in self.incident_steps:
            self.incident_steps = [*self.incident_steps, onset][-INCIDENT_STEPS_KEPT:]

    def save(self, path: Path) -> None:
        write_state(path, self.dump())

    def hold_history(self, history: StepHistory) -> None:
        """From now on this state's ``history`` is ``history`` as it is now, whose entries were
        serialized once each as they came: a write joins them instead of serializing every entry
        again (the ``history`` field is then left empty)."""
        self.history = []
        self._history_json = f"[{','.join(history.json)}]"

    def hold_analyzer(self, state: dict[str, Any], encoder: BufferJSON) -> None:
        """From now on this state's ``analyzer`` is ``state`` (the analyzer's ``state_dict``) as
        ``encoder`` serialized it now, its rewind buffers' entries reused from the previous write
        (the ``analyzer`` field is then left empty)."""
        self.analyzer = None
        self._analyzer_json = encoder.dump(state)

    def dump(self) -> str:
        """The state as it is saved (compact JSON)."""
        parts = (("analyzer", self._analyzer_json), ("history", self._history_json))
        held = {k: v for k, v in parts if v is not None}
        if not held:
            return self.model_dump_json(indent=None)
        head = self.model_dump_json(indent=None, exclude=set(held))  # "job" is required: never "{}"
        return head[:-1] + "".join(f',"{k}":{v}' for k, v in held.items()) + "}"

    @classmethod
    def load(cls, path: Path) -> RuntimeState | None:
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None


_ANY = TypeAdapter(Any, config=ConfigDict(ser_json_inf_nan="constants"))
"""Serializes a history entry, the analyzer's state and its parts exactly as
``RuntimeState.model_dump_json`` serializes them."""


class BufferJSON:
    """The analyzer's state as JSON, written once per state write: its rewind buffers (each tracker's
    last 512 values, the per-rank losses) are lists of tuples that change only at their ends from
    one write to the next -- a new step appended, the oldest dropped, the newest taken back by a
    rollback -- so each entry's JSON is made once and reused while the entries are the same tuple
    objects in the same order. The text is byte for byte what serializing the whole state gives.

    A buffer is any list of tuples in the state's dicts, known by its path of keys; a tuple's contents
    are never changed in place (a rank-loss map is written only before its step's tuple is made)."""

    SEARCH = 64
    """How far into the previous write's buffer its new first entry is looked for (entries dropped
    at the front since); further, the buffer is serialized whole."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, ...], tuple[list[Any], list[str]]] = {}
        self._mark = f"@buffer-{uuid.uuid4().hex}-"

    def dump(self, state: dict[str, Any]) -> str:
        runs: list[str] = []
        seen: dict[tuple[str, ...], tuple[list[Any], list[str]]] = {}
        shell = self._swap(state, (), runs, seen)
        self._runs = seen
        head, *marked = _ANY.dump_json(shell).decode().split(f'"{self._mark}')
        out = [head]
        for part in marked:  # each '<i>"<text after the marker>'
            i, rest = part.split('"', 1)
            out += ("[", runs[int(i)], "]", rest)
        return "".join(out)

    def _swap(self, node: Any, path: tuple[str, ...], runs: list[str],
              seen: dict[tuple[str, ...], tuple[list[Any], list[str]]]) -> Any:  # fmt: skip
        """``node`` with each buffer replaced by a marker (dicts on the way copied, never changed)."""
        if type(node) is dict:
            out = None
            for k, v in node.items():
                new = self._swap(v, (*path, str(k)), runs, seen)
                if new is not v:
                    out = dict(node) if out is None else out
                    out[k] = new
            return node if out is None else out
        if type(node) is list and node and type(node[0]) is tuple:
            pieces = self._pieces(self._runs.get(path), node)
            seen[path] = (node, pieces)
            runs.append(",".join(pieces))
            return f"{self._mark}{len(runs) - 1}"
        return node

    def _pieces(self, prev: tuple[list[Any], list[str]] | None, items: list[Any]) -> list[str]:
        """Each entry's JSON: the previous write's where the entry is the same object, else new."""
        kept: list[str] = []
        if prev is not None:
            old, old_pieces = prev
            first = items[0]
            at = next((k for k in range(min(self.SEARCH, len(old))) if old[k] is first), None)
            if at is not None:
                n = min(len(old) - at, len(items))
                if all(map(operator.is_, items[:n], old[at : at + n])):  # the same entries, in order
                    kept = old_pieces[at : at + n]
        return kept + [_ANY.dump_json(t).decode() for t in items[len(kept) :]]


class StepHistory(Sequence[StepStats]):
    """The newest per-step aggregates (at most ``maxlen``), each kept with its JSON as the state file
    holds it, made once when its step is added: a state write joins the entries' JSON instead of
    serializing the whole history again (at a thousand steps that took most of each write)."""

    def __init__(self, entries: Iterable[StepStats] = (), maxlen: int | None = None) -> None:
        self._steps: deque[StepStats] = deque(maxlen=maxlen)
        self.json: deque[str] = deque(maxlen=maxlen)
        for h in entries:
            self.append(h)

    def append(self, h: StepStats) -> None:
        self._steps.append(h)
        self.json.append(_ANY.dump_json(h.to_json()).decode())

    def drop_after(self, step: int) -> None:
        """Forget the entries past ``step`` (a rollback or restart re-trains them)."""
        kept = [(h, j) for h, j in zip(self._steps, self.json, strict=True) if h.step <= step]
        self._steps = deque((h for h, _ in kept), maxlen=self._steps.maxlen)
        self.json = deque((j for _, j in kept), maxlen=self.json.maxlen)

    def __iter__(self) -> Iterator[StepStats]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    @overload
    def __getitem__(self, i: int) -> StepStats: ...
    @overload
    def __getitem__(self, i: slice) -> list[StepStats]: ...
    def __getitem__(self, i: int | slice) -> StepStats | list[StepStats]:
        return list(self._steps)[i] if isinstance(i, slice) else self._steps[i]


def runtime_state_path(job: JobSpec) -> Path:
    """The supervisor's own small state file (directive log, analyzer state, plan cursor)."""
    return db_path_for_job(job).parent / "runtime" / f"{job.name}.json"


def write_state(path: Path, data: str) -> None:
    """Write ``data`` (``RuntimeState.dump``) to ``path`` atomically: a temp file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
