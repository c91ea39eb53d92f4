"""From detector updates to incidents and plans: open, plan, carry out, close.

One incident is acted on at a time (the *active* plan); incidents that become ready while
another is being handled wait their turn (``state.waiting``, persisted). In
``observe_only`` mode incidents are recorded and never acted on.

Guarantees kept here:

* a resolved, dismissed or escalated incident is never planned again -- except that a fault
  that comes back within ``recurrence.reopen_within_steps`` of a resolved incident *reopens*
  it (same id, next attempt; the policy's ``recurrence.max_attempts`` bounds the attempts);
* while no irreversible action has started, a diagnosis that changes class re-makes the
  plan, and the reason is recorded;
* an action that could not run because training ended is recorded as skipped, and the
  incident says so (``unfinished``) -- it never counts as done;
* the supervisor's own interventions (rollbacks, LR overrides, clip changes, exclusions)
  are told to the detector as expected changes.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.config.job import JobSpec
from supervisor.core.analysis import StreamingAnalyzer
from supervisor.core.detect import DetectorSettings
from supervisor.core.model import Cause, Diagnosis, Severity
from supervisor.core.policy import JobState, Plan, PlannedAction, Policy, plan
from supervisor.core.policy.actions import TERMINAL, names_where
from supervisor.core.policy.args import ObserveArgs, RollbackArgs
from supervisor.core.policy.evidence import findings
from supervisor.core.policy.recurrence import Resolved, reopens, replan_reason
from supervisor.core.records import Record
from supervisor.core.reference import healthy_reference
from supervisor.incidents import Artifact, EventKind, EventStatus, Incident, IncidentState
from supervisor.logging import get_logger
from supervisor.ranks.replay import has_replay_hooks
from supervisor.runtime import effects
from supervisor.runtime.actions.base import Outcome
from supervisor.runtime.observe import Baseline, StepStats, baseline
from supervisor.runtime.plans import PlanRunner, action_id, can_move
from supervisor.runtime.state import ActivePlan, JobPhase, RuntimeState

log = get_logger("supervisor.runtime.incidents")

NEEDS_WORKERS = names_where("needs_workers")  # skipped at the end of training: the fault is unhandled
BASELINE_STEPS = 200  # steps before the onset a plan's baseline is taken from


def timeline_of(step: int, rollback_targets: list[int]) -> int:
    """Which run a step was trained on: the newest rollback n (of ``rollback_targets``, oldest first)
    whose target is before it; 0: the original run."""
    for n in range(len(rollback_targets), 0, -1):
        if rollback_targets[n - 1] < step:
            return n
    return 0


#: Timeline events of the supervisor's own effects on the run, as ``rebuild_interventions`` reads them.
_EFFECTS = frozenset({EventKind.FIX_APPLIED, EventKind.ROLLED_BACK, EventKind.WORKER_RESTARTED})


def _went_back_to(ev: Any) -> float:
    """The step a rollback or restart event sent training back to (inf: it sent it nowhere)."""
    result = ev.result or {}
    to = (
        result.get("to_step") if ev.kind is EventKind.ROLLED_BACK else result.get("resume_step", float("inf"))
    )
    if ev.kind is EventKind.WORKER_RESTARTED and to is None:
        return -1  # from scratch
    return float(to) if isinstance(to, int | float) else float("inf")


#: Findings specific enough that sharing one makes two incidents the same fault.
_SPECIFIC = ("lr_jump", "update_jump", "nonfinite", "checksum", "after_resume")


def same_fault(a: Diagnosis, b: Diagnosis) -> bool:
    """Whether ``b`` can be ``a`` coming back: the same first rank, data source or specific finding,
    else the same top cause at medium severity or more (a ``low`` blip that shares only a cause is
    a blip of its own). A worker-group restart is never a fault that comes back."""
    if Cause.DISTRIBUTED in (a.top_cause, b.top_cause) and not (a.rank_local and b.rank_local):
        return False
    if a.rank_local and b.rank_local and a.first_rank is not None:
        return a.first_rank == b.first_rank
    if a.source_local and a.source_local == b.source_local:
        return True
    if set(findings(a)) & set(findings(b)) & set(_SPECIFIC):
        return True
    return a.top_cause is b.top_cause and b.severity.rank >= Severity.MEDIUM.rank


@dataclass(frozen=True)
class PreOnset:
    """The run before an incident's onset, as a plan's window is judged against it: the baseline of
    its last ``BASELINE_STEPS`` steps and the (step, grad norm) of those ``baseline`` counts.

    The first plan of an onset keeps it in its artifact (``pre_onset``), and a later plan of the
    same onset reuses it (``kept_pre_onset``): by then a rollback may have cut the history back and
    re-run the steps before the onset under the first plan's fix, and a baseline taken from them
    would judge the second window against that fix (a stricter one where the fix trains calmer,
    one that passes the same failure where it does not cure)."""

    onset: int
    baseline: Baseline | None
    grad_norms: tuple[tuple[int, float], ...]
    #: The LR the ranks reported last before the onset (None: none reported, or a plan stored
    #: before it was kept): the LR a plan's fix is written against.
    lr: float | None = None

    @classmethod
    def of(cls, history: Sequence[StepStats], onset: int) -> PreOnset:
        pre = [h for h in history if h.step < onset][-BASELINE_STEPS:]
        grads = tuple((h.step, h.grad_norm) for h in pre if h.grad_norm is not None and _counted(h))
        return cls(onset, baseline(pre), grads, _last_lr(history, onset))

    def to_json(self) -> dict[str, Any]:
        return {"onset": self.onset, "baseline": self.baseline.to_json() if self.baseline else None,
                "grad_norms": [list(g) for g in self.grad_norms], "lr": self.lr}  # fmt: skip

    @classmethod
    def from_json(cls, d: Any) -> PreOnset | None:
        """None for what is not one (a plan an older supervisor stored without it)."""
        if not isinstance(d, dict) or not isinstance(d.get("onset"), int) or "grad_norms" not in d:
            return None
        base = Baseline.from_json(d["baseline"]) if d.get("baseline") else None
        lr = d.get("lr")
        lr = float(lr) if isinstance(lr, int | float) and not isinstance(lr, bool) else None
        return cls(d["onset"], base, tuple((int(s), float(g)) for s, g in d["grad_norms"]), lr)


def _last_lr(history: Sequence[StepStats], onset: int) -> float | None:
    """The LR the ranks reported last before ``onset`` (None: none reported)."""
    return next((h.lr for h in reversed(history) if h.step < onset and h.lr is not None), None)


def kept_pre_onset(artifacts: Iterable[Artifact], onset: int) -> tuple[PreOnset, str] | None:
    """What the incident's earliest plan that kept one kept for ``onset``, and that plan's ref; None
    when none did (another onset: a reopened incident's new diagnosis; a plan stored without it)."""
    for a in artifacts:
        kept = PreOnset.from_json(a.meta.get("pre_onset")) if a.kind == "plan" else None
        if kept is not None and kept.onset == onset:
            return kept, a.ref
    return None


def plan_baseline(
    pre: PreOnset, p: Plan, step: int, level_window: int
) -> tuple[Baseline | None, dict[str, Any] | None]:
    """The baseline a plan's observation window is judged against, from the run before the onset,
    and how its grad norm was set. The grad norm's is what the healthy run did over the window's
    steps (``core.reference``): the median of every step before the onset misjudges a grad norm that
    rose (or fell) as the run trained. The window starts where the plan sends training back (the
    run's start, its rollback target) or, with no rollback, at the current step."""
    base = pre.baseline
    observe, rollback = p.action("observe"), p.action("rollback")
    if base is None or observe is None or not isinstance(observe.args, ObserveArgs):
        return base, None
    start = step
    if rollback is not None and isinstance(rollback.args, RollbackArgs):
        r = rollback.args
        start = 0 if r.to_start else r.target_step if r.target_step is not None else r.max_target_step
    window = range(start + 1, start + 1 + observe.args.window_steps(start))
    ref = healthy_reference(pre.grad_norms, pre.onset, window, level_window)
    if ref is None:
        return base, None
    why = {"window": [window.start, window.stop - 1], "onset": pre.onset, "level_window": level_window,
           "reference": ref, "median_before_onset": base.grad_norm}  # fmt: skip
    return replace(base, grad_norm=ref), why


def _counted(h: StepStats) -> bool:
    """A step ``baseline`` counts (finite, not skipped by the AMP loss scaler), with a finite grad norm."""
    g = h.grad_norm
    return not h.nonfinite and not h.skipped and math.isfinite(h.loss) and g is not None and math.isfinite(g)


@dataclass(frozen=True)
class Now:
    """The job's moment, passed in with each call (the flow keeps no reference to the controller)."""

    step: int
    history: Sequence[StepStats]
    downtime_s: float
    stop_reason: str | None = None  # why a person asked the job to stop (None: nobody did)


Effects = list[effects.Effect]
Flow = Generator[effects.Effect, Any, None]
"""Effects yielded one at a time, each carried out before the flow resumes (``Controller.drive``)."""


class IncidentFlow:
    """Incidents from the detector's updates, and the plans that handle them. The calls that may
    change the job return effects, which the controller alone carries out, in order."""

    def __init__(
        self, job: JobSpec, policy: Policy, store: Any, state: RuntimeState, checkpoints: Any,
        healthy_after: int = 0,
    ) -> None:  # fmt: skip
        self.job = job
        self.healthy_after = healthy_after  # RuntimeSettings.healthy_after_steps
        self.policy = policy
        self.store = store  # IncidentStore
        self.state = state
        self.checkpoints = checkpoints  # CheckpointStore, or None
        self.analyzer = StreamingAnalyzer(DetectorSettings.from_telemetry(job.telemetry))
        if state.analyzer:
            try:
                self.analyzer.load_state_dict(state.analyzer)
            except Exception as exc:  # an unreadable saved state must not stop supervision: start empty
                log.warning("analyzer_state_not_restored", error=repr(exc))
        self.runner = PlanRunner(store)
        self._out: Effects = []
        self.unfinished: str | None = None
        """Set when training ended before an incident's fix could be carried out."""
        self._diagnosis: Diagnosis | None = None
        self._opened_at: list[tuple[int, int]] = []  # (step, incident id) of incidents opened this run
        self._dismiss_after = False
        self._plan_unsaved = False
        self.can_replay = has_replay_hooks(job.entrypoint)
        """False: the job defines no ``replay_hooks`` (the policy then excludes without replay)."""

    def _take(self) -> Effects:
        out, self._out = self._out, []
        return out

    def observe(self, step: int, records: Sequence[Record], now: Now) -> Flow:
        """The step's detector updates. An incident opened or reopened is yielded as it happens and
        carried out before the flow goes on (what follows reads it; ``OpenIncident`` gets its id
        sent back); every other effect comes after the last update, in order."""
        for update in self.analyzer.observe_step(step, records):
            yield from self._on_update(update.kind, update.key, update.diagnosis, step, now)
        yield from self._take()

    def _on_update(self, kind: str, key_: int, d: Diagnosis, step: int, now: Now) -> Flow:
        key = str(key_)
        incident_id = self.state.incident_keys.get(key)
        again = (
            None if incident_id is None or kind != "refined" else self._chain_occurrence(key_, d, incident_id)
        )
        folded = key in self.state.folded_keys
        if (
            folded
            and again is None
            and incident_id is not None
            and _evidence_of(self.store.get(incident_id), d)
        ):
            return  # still the occurrence it was noted on: its updates change nothing there
        if folded:  # a fault of its own after all (or its next occurrence): handled as one from here
            self.state.folded_keys.remove(key)
            incident_id = None
        if again is not None:  # a periodic fault's next occurrence: the fault came back
            d = again
            incident_id = self.state.incident_keys[key] = yield from self._open(d, key_, step)
            if self._active_id != incident_id and incident_id not in self.state.waiting:
                self.state.waiting.append(incident_id)  # planned again: ``ready`` came long ago
        elif incident_id is None:
            incident_id = self.state.incident_keys[key] = yield from self._open(
                d, key_, step, fold=not folded
            )
            if key in self.state.folded_keys or self._read_as_logging_error(incident_id, key_, d):
                return
        elif self._read_as_logging_error(incident_id, key_, d):
            if kind == "ready" and key not in self.state.ready_keys:
                self.state.ready_keys.append(key)
            return
        elif kind in ("refined", "closed", "ready"):
            d = self._dated(incident_id, d)
            self.store.update_diagnosis(incident_id, d, step=step)
            if _against_checkpoints(d):  # a refinement may date the fault further back, or make it real
                self.state.note_onset(d.onset_step)
        active = self._plan
        if active is not None and incident_id == active.incident_id:
            self._maybe_replan(active, d, now)
            self._diagnosis = d
        if kind == "ready" and self.job.mode == "supervised" and key not in self.state.ready_keys:
            self.state.ready_keys.append(key)
            if (
                self._active_id != incident_id  # its plan is not running
                and not self.store.get(incident_id).state.is_terminal
                and incident_id not in self.state.waiting
            ):
                self.state.waiting.append(incident_id)

    def _open(
        self, d: Diagnosis, key: int, step: int, fold: bool = True
    ) -> Generator[effects.Effect, Any, int]:
        # A supervisor killed after it recorded this incident but before its state reached disk
        # left it in the store: the same records give the same key, so it is the same incident
        # (a reopened one carries the new key too).
        existing = self.store.find(self.job.name, key)
        if existing is not None and existing.state.is_active and existing.onset_step == d.onset_step:
            log.info("incident_found_again", incident=existing.id, key=key, why="recorded before a restart")
            return int(existing.id)
        same = self._occurrence_of(d) if fold else None
        if same is not None:
            self._fold(same, d, key, step)
            return same
        observed = self._recurred_in_window(d, step)
        if observed is not None:
            return observed
        again = self._recurrence_of(d)
        if again is not None:  # same id, next attempt: ``recurrence.max_attempts`` bounds them
            (earlier, why), incident_id = again, again[0].incident_id
            yield effects.ReopenIncident(incident_id, d, why, earlier.attempts + 1, step, key)
            self.state.attempts_of[str(incident_id)] = earlier.attempts
            log.warning("incident_reopened", incident=incident_id, onset=d.onset_step, attempt=earlier.attempts + 1,
                        why=why)  # fmt: skip
        else:
            incident_id = int((yield effects.OpenIncident(d, key, step)))
        if d.severity.rank >= Severity.MEDIUM.rank:  # low blips do not fail an observation ...
            self._opened_at.append((step, incident_id))
        self.state.note_incident(step, d.onset_step if _against_checkpoints(d) else None)
        return incident_id

    def _read_as_logging_error(self, incident_id: int, key: int, d: Diagnosis) -> bool:
        """``d``, from a detector incident that is not the incident's own (its fault come back inside
        its window), puts a logging error first where the incident has a real fault: an LR bug back
        while one rank's reported loss is wrong. The occurrence is recorded as it reads and fails the
        window; the incident keeps its diagnosis, so the plan made again handles the real fault
        (wrong numbers never explain a fault away). Any other reading refines the incident as the
        occurrence it is (the data's next bad batch carries its own samples)."""
        inc = self.store.get(incident_id)
        a = inc.diagnosis
        if a is None or inc.analyzer_key == key or d.top_cause is not Cause.METRIC_ARTIFACT:
            return False
        return a.top_cause is not None and a.top_cause is not Cause.METRIC_ARTIFACT

    def _occurrence_of(self, d: Diagnosis) -> int | None:
        """The incident being handled whose occurrence ``d`` is: one not closed, dated at the same
        onset on the timeline it was detected on (no rollback or restart since has sent training
        back before it: what is seen there after one is the fault coming back). Another signal
        that crossed its band later (the update ratio a few steps after the loss, say) is more
        evidence of that step, not a fault of its own -- unless it reads worse (``_evidence_of``)."""
        for inc in self.store.active(self.job.name):
            if _evidence_of(inc, d) and not any(
                _went_back_to(e) < d.onset_step for e in self._since_detected(inc.id)
            ):
                return int(inc.id)
        return None

    def _since_detected(self, incident_id: int) -> list[Any]:
        """The incident's rollbacks and restarts done since its newest occurrence was detected."""
        out: list[Any] = []
        for e in self.store.timeline(incident_id):
            if e.kind is EventKind.DETECTED and not e.payload.get("in_window"):
                out = []
            elif (
                e.kind in (EventKind.ROLLED_BACK, EventKind.WORKER_RESTARTED) and e.status is EventStatus.DONE
            ):
                out.append(e)
        return out

    def _fold(self, incident_id: int, d: Diagnosis, key: int, step: int) -> None:
        """Note ``d`` on the incident it is an occurrence of (once, even after a restart); the
        detector's later updates of ``key`` change nothing there while it stays one."""
        self.state.folded_keys.append(str(key))
        self.state.note_incident(step, d.onset_step if _against_checkpoints(d) else None)
        noted = any(
            e.kind is EventKind.NOTE and (e.payload.get("same_occurrence") or {}).get("key") == key
            for e in self.store.timeline(incident_id)
        )
        if not noted:
            self._note(incident_id, step, {"same_occurrence": {"key": key, "diagnosis": d.to_json()}})
        log.info("same_occurrence_noted", incident=incident_id, key=key, onset=d.onset_step,
                 severity=d.severity.value)  # fmt: skip

    def _chain_occurrence(self, key_: int, d: Diagnosis, incident_id: int) -> Diagnosis | None:
        """The diagnosis dated at a periodic chain's new occurrence after its incident was resolved or
        while it is observed (``core.periodic`` attaches it to the chain's head, whose key the incident
        has), else None: a recurrence is never folded silently into a closed incident."""
        if d.period is None or d.end_step is not None:
            return None
        head = next((i for i in self.analyzer.incidents if i.key == key_), None)
        if head is None or len(head.facts.occurrences) < 2:
            return None
        onset = int(head.facts.occurrences[-1])
        inc = self.store.get(incident_id)
        if inc.state not in (IncidentState.RESOLVED, IncidentState.OBSERVING):
            return None
        window = self._window_end(incident_id) if inc.state is IncidentState.RESOLVED else None
        if onset <= (window if window is not None else (inc.onset_step or 0)):
            return None
        return replace(d, onset_step=onset, peak_step=max(onset, d.peak_step))

    def _dated(self, incident_id: int, d: Diagnosis) -> Diagnosis:
        """A periodic chain's refinement keeps the onset of the occurrence the incident was reopened
        for: the chain's own (its first occurrence) would move the rollback target back to a fault
        already handled."""
        onset = self.store.get(incident_id).onset_step if d.period is not None else None
        if onset is None or onset <= d.onset_step:
            return d
        return replace(d, onset_step=onset, peak_step=max(onset, d.peak_step))

    def _recurred_in_window(self, d: Diagnosis, step: int) -> int | None:
        """The observed incident's id when its fault came back inside its window: whatever its
        severity, an occurrence recorded on it (the window fails on it), never an incident of its own."""
        active = self._plan
        if active is None or self.store.get(active.incident_id).state is not IncidentState.OBSERVING:
            return None
        if not same_fault(self.active_diagnosis, d):
            return None
        seen = self._this_timeline(active.incident_id)
        if not any(r["onset_step"] == d.onset_step for r in seen):  # once, even after a restart
            self.store.record(active.incident_id, EventKind.DETECTED, actor="detector", step=step,
                              payload={"diagnosis": d.to_json(), "in_window": True})  # fmt: skip
            log.warning("fault_recurred_in_window", incident=active.incident_id, onset=d.onset_step,
                        severity=d.severity.value)  # fmt: skip
        self.state.note_incident(step, d.onset_step)
        return active.incident_id

    def recurrences_since(self, step: int) -> list[dict[str, Any]]:
        plan = self._plan
        if plan is None:
            return []
        return [r for r in self._this_timeline(plan.incident_id) if r["step"] > step]

    def _this_timeline(self, incident_id: int) -> list[dict[str, Any]]:
        """The in-window occurrences since the incident's last rollback or restart: one on an
        abandoned timeline neither fails the next window nor stands for the fault coming back."""
        out: list[dict[str, Any]] = []
        for e in self.store.timeline(incident_id):
            if e.kind in (EventKind.ROLLED_BACK, EventKind.WORKER_RESTARTED) and e.status is EventStatus.DONE:
                out = []
            elif e.kind is EventKind.DETECTED and e.payload.get("in_window"):
                d = e.payload.get("diagnosis") or {}
                out.append({"step": e.step, "onset_step": d.get("onset_step"), "severity": d.get("severity")})
        return out

    def _recurrence_of(self, d: Diagnosis) -> tuple[Resolved, str] | None:
        """The resolved incident of the same fault (``same_fault``) this one repeats, and why
        (``core.policy.recurrence.reopens`` decides)."""
        rec = self.policy.recurrence
        if not rec.reopen_within_steps:
            return None
        resolved = []
        for inc in self.store.list_incidents(job=self.job.name, state=IncidentState.RESOLVED):
            if inc.onset_step is None or inc.diagnosis is None or not same_fault(inc.diagnosis, d):
                continue
            window = self._window_end(inc.id)
            attempts = self.state.attempts_of.get(str(inc.id)) or max(1, self._plans_so_far(inc.id))
            resolved.append(Resolved(int(inc.id), int(inc.onset_step), window, attempts))
        return reopens(resolved, d.onset_step, rec)

    def _window_end(self, incident_id: int) -> int | None:
        """The last step of the incident's last observation window (None: it was never observed)."""
        obs = self.store.last_done(incident_id, EventKind.OBSERVATION)
        return ((obs.result or {}).get("window") or [None, None])[-1] if obs is not None else None

    def finalize_open(self, now: Now) -> Generator[effects.Effect, Any, bool]:
        """No more steps will come: an incident the detector still holds open is judged now. True
        when one was."""
        inc = self.analyzer.open
        if inc is None:
            judged = yield from self._judge_end(now)
            yield from self._take()
            return judged
        if str(inc.key) in self.state.ready_keys or str(inc.key) in self.state.folded_keys:
            return False
        d = inc.diagnosis(self.analyzer.settings)
        log.warning("incident_ready_at_end", key=inc.key, onset=d.onset_step,
                    why="training reached its last step before the incident was confirmed")  # fmt: skip
        yield from self._on_update("ready", inc.key, d, now.step, now)
        yield from self._take()
        return True

    def _judge_end(self, now: Now) -> Generator[effects.Effect, Any, bool]:
        """Nothing open at the last step: what no later step can confirm is judged as it stands
        (``core.run_end``), before the final checkpoint is marked. True when an incident opened."""
        from supervisor.core.run_end import judge_end

        updates = judge_end(self.analyzer)
        for u in updates:
            yield from self._on_update(u.kind, u.key, u.diagnosis, now.step, now)
        if updates:
            d = updates[-1].diagnosis
            log.warning("incident_at_end", key=updates[-1].key, onset=d.onset_step,
                        why="the update ratio left its band in the last steps; no step follows to confirm it")  # fmt: skip
        return bool(updates)

    def notify_rollback(self, to_step: int, reason: str, now: Now) -> Flow:
        updates = self.analyzer.notify_rollback(
            to_step, from_step=now.step, reason=reason, observe_steps=self._observe_steps()
        )
        for u in updates:
            yield from self._on_update(u.kind, u.key, u.diagnosis, to_step, now)
        self._abandon_after(to_step)
        yield from self._take()

    def _abandon_after(self, to_step: int) -> None:
        """Incidents that began after ``to_step`` are of a timeline training no longer has: they
        neither fail an observation nor get a plan (a fault that persists is detected again)."""
        self._opened_at = [(s, i) for s, i in self._opened_at if s <= to_step]
        active = self._active_id
        keep = []
        for incident_id in self.state.waiting:
            inc = self.store.get(incident_id)
            if incident_id != active and inc.onset_step is not None and inc.onset_step > to_step:
                why = (f"abandoned timeline: training went back to step {to_step}, before its onset "
                       f"{inc.onset_step}" + (f" (while incident {active} was handled)" if active else ""))  # fmt: skip
                self._move(incident_id, IncidentState.DISMISSED, why, to_step)
                log.info("incident_abandoned", incident=incident_id, why=why)
            else:
                keep.append(incident_id)
        self.state.waiting = keep

    def note_overrides(self, step: int, params: dict[str, Any], reason: str) -> None:
        """The workers applied an ``apply`` after ``step``: an expected change, never evidence. The
        one call site of ``StreamingAnalyzer.note_overrides`` (a loader skip or an exclusion changes
        the data of steps that still train: ``data=True``)."""
        if any(
            iv.kind == "override" and iv.step == step and iv.reason == reason
            for iv in self.analyzer.interventions
        ):
            return  # already known (the same fix polled again by a restarted supervisor)
        precision = params.get("precision")
        self.analyzer.note_overrides(
            step,
            lr_scale=params.get("lr_scale"),
            warmup_steps=params.get("warmup_steps"),
            grad_clip=params.get("grad_clip"),
            data=bool(params.get("exclude") or params.get("skip_batches")),
            precision=str(precision) if precision else None,
            reason=reason,
            observe_steps=self._observe_steps(),
        )

    def _observe_steps(self) -> int | None:
        """How many steps the active plan's ``observe`` watches (the detector then expects its own
        fix's effects over the same steps), or None."""
        active = self._plan
        if active is None:
            return None
        for pa in active.plan.actions[active.index :]:
            if pa.name == "observe":
                steps = pa.params.get("steps")
                return int(steps) if isinstance(steps, int | float) and not isinstance(steps, bool) else None
        return None

    def rebuild_interventions(self) -> list[str]:
        """What this job's supervisor did, rebuilt from its own records before it reads a record:
        the detector's saved state may be older than the incident store's record of a fix done (a
        supervisor killed between the two writes). A fix the detector does not know, and that no
        later rollback or restart took back, is noted again, so a restarted detector never takes its
        own re-warm, clip or exclusion for a new fault. Returns the reasons of the fixes noted again."""
        done = [
            ev
            for inc in self.store.list_incidents(job=self.job.name)
            for ev in self.store.timeline(inc.id)
            if ev.status is EventStatus.DONE and ev.kind in _EFFECTS
        ]
        done.sort(key=lambda ev: ev.id)  # the order the supervisor began them in
        known = {(iv.step, iv.reason) for iv in self.analyzer.interventions if iv.kind == "override"}
        noted = []
        for n, ev in enumerate(done):
            step = (ev.result or {}).get("acked_at_step")
            params = ev.payload.get("params") or {}
            if ev.kind is not EventKind.FIX_APPLIED or not isinstance(step, int) or not params:
                continue
            reason = f"fix of incident {ev.incident_id}"
            if (step, reason) in known or any(_went_back_to(later) <= step for later in done[n + 1 :]):
                continue  # known, or a later rollback or restart took it back (the workers restored an older state)
            self.note_overrides(step, params, reason)
            noted.append(reason)
            log.warning("intervention_rebuilt", incident=ev.incident_id, step=step, params=sorted(params),
                        why="recorded done in the incident store, missing from the saved detector state")  # fmt: skip
        return noted

    def opened_since(self, step: int) -> int:
        return sum(1 for s, i in self._opened_at if s > step and i != self._active_id)

    @property
    def _plan(self) -> ActivePlan | None:
        """The plan in force as this call sees it: one it made or ended (its ``StartPlan`` or
        ``EndPlan`` not carried out yet), else the state's."""
        for effect in reversed(self._out):
            if isinstance(effect, effects.StartPlan):
                return effect.active
            if isinstance(effect, effects.EndPlan):
                return None
        return self.state.active

    @property
    def _active_id(self) -> int | None:
        plan = self._plan
        return plan.incident_id if plan else None

    @property
    def idle(self) -> bool:
        return self._plan is None and not self.state.waiting

    @property
    def active_diagnosis(self) -> Diagnosis:
        if self._diagnosis is None:
            plan = self._plan
            assert plan is not None
            d = self.store.get(plan.incident_id).diagnosis
            assert d is not None
            self._diagnosis = d
        return self._diagnosis

    def begin(self, now: Now) -> tuple[ActivePlan | None, Effects]:
        """The plan to step now (the next waiting incident's when none runs; None: nothing to act
        on) and what puts it on disk first."""
        if self._plan is None and not self._next(now):
            return None, self._take()
        if self._plan_unsaved:  # here, not where the plan was made: that may be amid a batch of steps
            self._out.append(effects.Persist())
            self._plan_unsaved = False
        return self._plan, self._take()

    def settle(self, active: ActivePlan, failed: Outcome | None, now: Now) -> Effects:
        """After the runner's step: a failed action's follow-up, or the plan closed once all ran."""
        if failed is not None:
            self._on_failure(active, failed, now)
        elif active.index >= len(active.plan.actions):
            self._close_plan(active, now)
        return self._take()

    def _next(self, now: Now) -> bool:
        while self.state.waiting:
            incident_id = self.state.waiting.pop(0)
            incident = self.store.get(incident_id)
            if incident.state.is_terminal or incident.diagnosis is None:
                log.info("not_replanned", incident=incident_id, state=incident.state.value)
                continue
            self._start_plan(incident_id, incident.diagnosis, now, plan_no=self._plans_so_far(incident_id) + 1,
                             observation_failures=0)  # fmt: skip
            return True
        return False

    def _plans_so_far(self, incident_id: int) -> int:
        return sum(1 for a in self.store.artifacts(incident_id) if a.kind == "plan")

    def _start_plan(
        self, incident_id: int, d: Diagnosis, now: Now, *, plan_no: int, observation_failures: int
    ) -> None:
        ref = f"plan-{plan_no}"
        pre, pre_from = self._run_before_onset(incident_id, d, now, ref)
        js = self._job_state(incident_id, d, observation_failures, now, pre)
        p = plan(d, js, self.policy)
        rule = p.rule or "fallback"
        attempt = self._count_attempt(incident_id, rule, +1)
        base, reference = plan_baseline(pre, p, now.step, self.analyzer.settings.level_window)
        # ``attempt``: this incident's recovery attempt (a reopened incident goes on counting);
        # ``rule_attempt``: the rule's own count, which its cooldown may have started over.
        note = {"plan": f"rule {rule}: {', '.join(p.action_names)}", "why": p.matched_because,
                "escalate": p.escalate_reason, "attempt": attempt, "rule_attempt": p.attempt}  # fmt: skip
        self._note(incident_id, now.step, note, actor="policy")
        meta = {"plan": p.to_json(), "job_state": js.to_json(), "baseline": base.to_json() if base else None,
                "grad_norm_reference": reference, "baseline_from": pre_from}  # fmt: skip
        if pre_from == ref:  # taken from the history: kept for the later plans of this onset
            meta["pre_onset"] = pre.to_json()
        self.store.add_artifact(incident_id, "plan", ref, meta)
        self._attach_series(incident_id, d, now.history)
        previous = self._plan
        since = previous.downtime_from if previous and previous.incident_id == incident_id else now.downtime_s
        made = ActivePlan(downtime_from=since, incident_id=incident_id, plan_no=plan_no, plan=p,
                          baseline=base.to_json() if base else None,
                          observation_failures=observation_failures)  # fmt: skip
        self._diagnosis = d
        self._out += [
            effects.StartPlan(made),
            effects.SetPhase(JobPhase.INCIDENT, f"incident {incident_id}: plan {plan_no} ({rule})"),
        ]
        log.info("plan", incident=incident_id, rule=p.rule, actions=p.action_names, escalate=p.escalate_reason,
                 baseline_from=pre_from)  # fmt: skip
        self._dismiss_after = d.top_cause is Cause.METRIC_ARTIFACT and all(
            a.name == "alert" for a in p.actions
        )
        # The plan in force is on disk before its first action begins (``advance``): a supervisor
        # killed during that action (an alert being sent) finds this plan's action again, never
        # makes a second plan that would send a second alert and leave the first one pending.
        self._plan_unsaved = True

    def _count_attempt(self, incident_id: int, rule: str, delta: int) -> int:
        """Count (or uncount) one recovery attempt under ``rule``; returns the incident's attempts."""
        self.state.attempts[rule] = max(0, self.state.attempts.get(rule, 0) + delta)
        key = str(incident_id)
        n = self.state.attempts_of[key] = max(0, self.state.attempts_of.get(key, 0) + delta)
        return n

    def _run_before_onset(self, incident_id: int, d: Diagnosis, now: Now, ref: str) -> tuple[PreOnset, str]:
        """The run before ``d``'s onset and the plan it was taken for: what an earlier plan of this
        onset kept, else the history now (for plan ``ref``). A run kept by an older version has no
        LR: the history's stands in for it, as before."""
        kept = kept_pre_onset(self.store.artifacts(incident_id), d.onset_step)
        if kept is None:
            return PreOnset.of(now.history, d.onset_step), ref
        run, taken_for = kept
        return (
            run if run.lr is not None else replace(run, lr=_last_lr(now.history, d.onset_step))
        ), taken_for

    def _job_state(
        self, incident_id: int, d: Diagnosis, observation_failures: int, now: Now, run: PreOnset
    ) -> JobState:
        """The job as the policy engine sees it now; its grad norm and LR are the run's before the
        onset (``run``: for a later plan of the onset, what the first plan kept, not the re-run since)."""
        last = self.state.last_incident_step
        refs = None
        if self.checkpoints is not None:
            refs = tuple((m.step, m.health) for m in self.checkpoints.manifests())
        grads = sorted(g for _, g in run.grad_norms)
        return JobState(
            step=now.step,
            attempts=self.state.attempts,
            observation_failures=observation_failures,
            steps_since_last_incident=None if last is None else now.step - last,
            checkpoints=refs,
            state_maybe_nonfinite=d.nonfinite,
            lr=run.lr,
            # the supervisor's own LR override in force (a fix is relative to it)
            lr_scale=float(self.analyzer.lr_multiplier(now.step + 1)),
            grad_clip=self._grad_clip(now.step),
            grad_norm=grads[len(grads) // 2] if grads else None,
            incident_attempt=self.state.attempts_of.get(str(incident_id), 0),
            rank_incidents=self._rank_incidents(incident_id, d),
            earlier_onsets=self._earlier_onsets(incident_id, d),
            can_replay=self.can_replay,
            checkpoint_every=self.job.checkpoint.every_steps,
            healthy_after=self.healthy_after,
            max_steps=self.job.max_steps,
        )

    def _grad_clip(self, step: int) -> float | None:
        """The clip in force: the supervisor's newest override on this timeline, else the job's
        (``attrs.grad_clip`` in its records, or ``grad_clip`` in job.yaml's ``config:``), else None."""
        for iv in reversed(self.analyzer.interventions):
            if iv.kind == "override" and iv.grad_clip is not None and iv.step <= step:
                return float(iv.grad_clip)
        if self.state.reported_grad_clip is not None:
            return self.state.reported_grad_clip
        clip = dict(self.job.config or {}).get("grad_clip")
        return float(clip) if isinstance(clip, int | float) and not isinstance(clip, bool) else None

    def _rank_incidents(self, incident_id: int, d: Diagnosis) -> tuple[tuple[int, int], ...]:
        """(onset, rank) of every earlier rank-local occurrence in this job -- each occurrence of a
        reopened incident counts -- except dismissed ones (not a fault of the rank) and this one."""
        out = []
        dismissed = {
            i.id for i in self.store.list_incidents(job=self.job.name, state=IncidentState.DISMISSED)
        }
        for inc_id, seen in self.store.detections(self.job.name):
            if inc_id in dismissed or not seen.rank_local or seen.first_rank is None:
                continue
            if inc_id == incident_id and seen.onset_step == d.onset_step:
                continue
            out.append((seen.onset_step, int(seen.first_rank)))
        return tuple(out)

    def _earlier_onsets(self, incident_id: int, d: Diagnosis) -> tuple[int, ...]:
        """Onsets of this incident's occurrences before ``d``'s (each reopen, each one met again
        inside a window): a rollback before one re-runs that occurrence's data."""
        return tuple(
            sorted({seen.onset_step for inc_id, seen in self.store.detections(self.job.name)
                    if inc_id == incident_id and seen.onset_step < d.onset_step})
        )  # fmt: skip

    def _maybe_replan(self, active: ActivePlan, d: Diagnosis, now: Now) -> None:
        """Re-make the plan when the policy now plans differently, before anything irreversible ran
        (``core.policy.recurrence.replan_reason``)."""
        if active.irreversible:
            return
        # The plan in force ran nothing irreversible: it was no recovery attempt. Planned again from
        # the same counts, a re-made plan is the same attempt (never one that uses up the bound).
        old_rule = active.plan.rule or "fallback"
        self._count_attempt(active.incident_id, old_rule, -1)
        run, _ = self._run_before_onset(active.incident_id, d, now, f"plan-{active.plan_no}")
        new = plan(
            d, self._job_state(active.incident_id, d, active.observation_failures, now, run), self.policy
        )
        why = replan_reason(active.plan, new, active.index)
        if why is None:
            self._count_attempt(active.incident_id, old_rule, +1)
            return
        self._note(active.incident_id, now.step, {"plan_remade": why})
        log.warning("plan_remade", incident=active.incident_id, why=why)
        prefix = f"i{active.incident_id}-p{active.plan_no}-"
        for ev in self.store.pending_events(active.incident_id):  # the old plan's action in flight
            if (ev.action_id or "").startswith(prefix):
                superseded = {"reason": f"superseded by plan {active.plan_no + 1}: {why}"}
                self._out.append(effects.FinishAction(ev.id, superseded, failed=True))
        self._start_plan(active.incident_id, d, now, plan_no=active.plan_no + 1,
                         observation_failures=active.observation_failures)  # fmt: skip

    def _attach_series(self, incident_id: int, d: Diagnosis, history: Sequence[StepStats]) -> None:
        """The per-step aggregates around the onset, each row into the timeline it was trained on:
        ``replay`` 0 for the original run, n for steps re-run after this incident's n-th rollback
        (a re-plan after a rollback must never overwrite the abandoned timeline's rows)."""
        targets = [
            int(e.result["to_step"])
            for e in self.store.timeline(incident_id)
            if e.kind is EventKind.ROLLED_BACK and e.status is EventStatus.DONE and (e.result or {}).get("to_step") is not None
        ]  # fmt: skip
        by_replay: dict[int, list[dict[str, Any]]] = {}
        for h in history:
            if h.step >= d.onset_step - 200:
                by_replay.setdefault(timeline_of(h.step, targets), []).append(h.to_json())
        for replay, rows in sorted(by_replay.items()):
            self.store.attach_series(incident_id, rows, replay=replay)

    def _on_failure(self, active: ActivePlan, out: Outcome, now: Now) -> None:
        pa = active.plan.actions[active.index]
        log.warning("action_failed", incident=active.incident_id, action=pa.name, reason=out.reason,
                    on_failure=pa.on_failure, skipped=out.skipped)  # fmt: skip
        if out.skipped:
            self._skipped_at_end(active, pa, out.reason, now)
            return
        if pa.name == "observe":
            self._move(
                active.incident_id, IncidentState.ACTING, f"observation failed: {out.reason}", now.step
            )
            self._start_plan(active.incident_id, self.active_diagnosis, now, plan_no=active.plan_no + 1,
                             observation_failures=active.observation_failures + 1)  # fmt: skip
            return
        past = effects.NextAction(active.incident_id, active.plan_no, active.index)
        if pa.on_failure == "continue":
            self._out.append(past)
            return
        follow = "stop" if pa.on_failure == "stop" else "escalate"
        rest = PlannedAction(follow, {"message": f"{pa.name} failed: {out.reason}"},
                             f"on_failure={pa.on_failure} of action {pa.name}", "stop")  # fmt: skip
        amended = replace(active.plan, actions=active.plan.actions[: active.index + 1] + (rest,))
        self._out += [effects.AmendPlan(active.incident_id, active.plan_no, amended), past]

    def _skipped_at_end(self, active: ActivePlan, pa: PlannedAction, reason: str, now: Now) -> None:
        """What was left when training ended is recorded as skipped, never as done."""
        left = [a.name for a in active.plan.actions[active.index :]]
        if now.stop_reason is not None:
            self._stopped_mid_plan(active, left, now.stop_reason, reason, now.step)
        elif pa.name == "observe" or not (set(left) & NEEDS_WORKERS):
            why = f"every fix applied; {pa.name} skipped: {reason} (the fix is unverified)"
            self._move(active.incident_id, IncidentState.RESOLVED, why, now.step)
            self._out.append(effects.ReleaseLatest(active.incident_id))
        else:
            why = f"training ended before the fix could be carried out; skipped: {', '.join(left)} ({reason})"
            if can_move(self.store, active.incident_id, IncidentState.ESCALATED):
                self._move(active.incident_id, IncidentState.ESCALATED, why, now.step)
            else:
                self._note(active.incident_id, None, {"unfinished": why})
            self.unfinished = f"incident {active.incident_id}: {why}"
        self._note(active.incident_id, now.step, {"skipped": left, "reason": reason})
        self._end_plan(now)

    def _stopped_mid_plan(
        self, active: ActivePlan, left: list[str], stop: str, reason: str, step: int
    ) -> None:
        """A person stopped the job while the plan ran: the incident is ``stopped`` (final, left to a
        person; never resolved: an unobserved fix is unverified), with what was done and what not."""
        done = []
        for i, a in enumerate(active.plan.actions[: active.index]):
            ev = self.store.event_for_action(active.incident_id, action_id(active, i, a.name))
            if ev is not None and ev.status is EventStatus.DONE:
                done.append(a.name)
        unverified = " (the fix is unverified)" if "apply" in done else ""
        why = (f"stopped on request ({stop}) during the plan: done {', '.join(done) or 'nothing'}; "
               f"not done {', '.join(left)}{unverified}")  # fmt: skip
        self._move(active.incident_id, IncidentState.STOPPED, why, step)
        self._note(active.incident_id, step, {"stopped": {"reason": stop, "done": done, "not_done": left,
                                                          "why": reason}})  # fmt: skip
        log.warning("incident_stopped", incident=active.incident_id, done=done, not_done=left, why=stop)

    def _close_plan(self, active: ActivePlan, now: Now) -> None:
        names = [a.name for a in active.plan.actions]
        step = now.step
        if names and names[-1] in TERMINAL:
            self._move(active.incident_id, IncidentState.ESCALATED, f"plan ended with {names[-1]}", step)
        elif self._dismiss_after:
            self._move(active.incident_id, IncidentState.DISMISSED, "metric artifact: alert only", step)
        else:
            self._move(active.incident_id, IncidentState.RESOLVED, "every planned action done", step)
            self._out.append(effects.ReleaseLatest(active.incident_id))
        self._end_plan(now)

    def _end_plan(self, now: Now) -> None:
        active = self._plan
        if active is not None:
            self._note(active.incident_id, now.step, {
                "downtime_s": round(now.downtime_s - active.downtime_from, 2),
                "why": "wall time training did not advance while this incident was handled (frozen, "
                       "restarting, held at the end)"})  # fmt: skip
        self._dismiss_after = False
        self._diagnosis = None
        self._out += [
            effects.EndPlan(),
            effects.SetPhase(JobPhase.RUNNING, "no incident is being acted on", JobPhase.INCIDENT),
        ]

    def close_at_end(self, phase: JobPhase, reason: str, step: int | None) -> Effects:
        """The job ends: no incident stays open or observing without a recorded reason (stopped on
        request: each one still open is recorded as stopped)."""
        to = IncidentState.STOPPED if phase is JobPhase.STOPPED else IncidentState.ESCALATED
        for incident in self.store.active(self.job.name):
            why = f"job ended ({phase.value}: {reason}) before the incident was handled"
            if can_move(self.store, incident.id, to):
                self._move(incident.id, to, why, step)
                log.warning("incident_left_for_a_person", incident=incident.id, why=why)
        return self._take()

    def _move(self, incident_id: int, to: IncidentState, reason: str, step: int | None) -> None:
        self._out.append(effects.MoveIncident(incident_id, to, reason, step))

    def _note(
        self, incident_id: int, step: int | None, payload: dict[str, Any], actor: str = "supervisor"
    ) -> None:
        self._out.append(effects.RecordEvent(incident_id, EventKind.NOTE, step, payload, actor))

    def summary(self) -> dict[str, Any] | None:
        active = self._plan
        if active is None:
            return None
        actions = active.plan.actions
        current = actions[active.index].name if active.index < len(actions) else None
        began = self.runner.began.get(action_id(active, active.index, current)) if current else None
        return {
            "id": active.incident_id,
            "rule": active.plan.rule,
            "phenotype": self._diagnosis.phenotype.value if self._diagnosis else None,
            "action": current,
            "action_began": began,
            "progress": f"{min(active.index + 1, len(actions))}/{len(actions)}",
            "waiting": list(self.state.waiting),
        }


def _evidence_of(inc: Incident, d: Diagnosis) -> bool:
    """Whether ``d`` can be more evidence of ``inc``'s occurrence: dated at its onset, and reading
    no worse (no more severe, no NaN/Inf it lacked, not confined to another rank)."""
    a = inc.diagnosis
    if a is None or inc.onset_step != d.onset_step or d.severity.rank > a.severity.rank:
        return False
    return not (d.nonfinite and not a.nonfinite) and not (
        d.rank_local and a.rank_local and d.first_rank != a.first_rank
    )


def _against_checkpoints(d: Diagnosis) -> bool:
    """An incident that keeps the checkpoints within ``healthy_after_steps`` of its onset from being
    marked healthy: any but a metric artifact, whose numbers are wrong while the training is sound
    (a logging error that lasts would keep every later checkpoint from the rollback a real fault
    needs). A refinement that makes it a real fault notes its onset then."""
    return d.top_cause is not Cause.METRIC_ARTIFACT
