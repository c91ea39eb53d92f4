"""The supervisor as a named Ray actor (``supervisor:<job>`` in the ``spike-supervisor`` namespace).

A threaded actor: the control loop runs in a thread started by ``__init__`` (so a restart by
Ray's ``max_restarts`` resumes the loop with no caller) while Ray's thread pool serves the calls.
With ``attach=True`` (or on any restart) it resumes from the incident store and the state file.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from typing import Any

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.errors import SupervisorError
from supervisor.logging import configure as configure_logging
from supervisor.logging import get_logger
from supervisor.runtime.controller import Controller
from supervisor.runtime.machinery import Workers
from supervisor.runtime.state import JobPhase
from supervisor.sdk.wire import WireError

GC_YOUNG = 50_000
"""Allocations between two young-generation collections in the supervisor's process."""


class SupervisorActor:
    def __init__(self, job: dict[str, Any], settings: dict[str, Any], attach: bool) -> None:
        import ray

        spec = JobSpec.model_validate(job)
        # A restart by Ray (max_restarts) re-runs __init__ with the original arguments: attach then.
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        runtime_settings = RuntimeSettings.model_validate(settings)
        configure_logging(runtime_settings.log_level)
        self.log = get_logger("supervisor.runtime.actor", job=spec.name)
        self.error: str | None = None
        self.node_id = ray.get_runtime_context().get_node_id()  # shown by `status`: where the supervisor runs
        self.ctl = Controller(spec, runtime_settings, attach=attach or restarted,
                              workers=self._worker_supervision(spec, runtime_settings))  # fmt: skip
        self.refused = 0
        """Record batches refused as malformed (``sdk/wire.py``); their senders count the records dropped."""
        self.record_calls = 0
        """Record batches received: one per rank and interval, or per node through its relay."""
        self._calls_lock = threading.Lock()
        self._dicts = self.ctl.settings.trace_path is not None  # the trace writes records as sent
        # Each step allocates a burst of short-lived objects (decoded records, columns, summaries)
        # that form no cycles; at the default threshold (700) the collector ran every few records,
        # and its older generations, which hold the long-lived state, far more often than that state
        # changes. What exists once started (Ray, the job, the stores) is frozen out of it.
        gc.freeze()
        gc.set_threshold(GC_YOUNG, 20, 20)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="supervisor-loop", daemon=True)
        self.thread.start()

    def _worker_supervision(self, spec: JobSpec, settings: RuntimeSettings) -> Workers | None:
        """Who supervises the worker group: None for the real one (``machinery.WorkerSupervision``).
        The rank emulator (``supervisor/drills/emulator.py``) answers its own."""
        return None

    def _run(self) -> None:
        try:
            self.ctl.run()
        except SupervisorError as exc:  # an expected failure (Ray, storage) nothing handled: name it
            self.error = exc.one_line()
            self.log.error("supervisor_failed", error=self.error, tb=traceback.format_exc()[-3000:])
            self.ctl.state.exit_code = exc.exit_code
            self.ctl.set_phase(JobPhase.FAILED, f"the supervisor cannot go on: {self.error}")
        except BaseException as exc:  # the loop died: report it; workers keep training meanwhile
            self.error = f"{type(exc).__name__}: {exc}"
            self.log.error("supervisor_loop_crashed", error=self.error, tb=traceback.format_exc()[-3000:])
            self.ctl.set_phase(JobPhase.FAILED, f"the supervisor loop crashed: {self.error}")
        finally:
            self.done.set()

    def ingest_packed(self, batch: Any) -> list[dict[str, Any]] | dict[str, Any]:
        """A packed batch of several links' records (``sdk/wire.py``), decoded in bulk: one answer per
        link, in order, as ``ingest`` answers; a malformed batch is refused whole (``refused``: why)."""
        with self._calls_lock:  # calls run on Ray's threads
            self.record_calls += 1
        try:
            return self.ctl.ingest_wire(batch, as_dicts=self._dicts)
        except WireError as exc:
            self.refused += 1
            if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                self.log.warning("record_batch_refused", error=str(exc), refused_total=self.refused)
            return {"refused": str(exc), "acked": 0}

    def directives(self, rank: int, after_seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """A long poll of up to ``wait_s`` (at most 5 s) when there are none after ``after_seq`` yet."""
        return self.ctl.directives.after(after_seq, min(wait_s, 5.0))

    def status(self) -> dict[str, Any]:
        out = self.ctl.status()
        out["supervisor_node"] = self.node_id
        out["batches_refused"] = self.refused
        out["record_calls"] = self.record_calls
        out["cpu_s"] = round(time.process_time(), 3)  # the supervisor process's CPU, every thread
        if self.error:
            out["error"] = self.error
        return out

    def spec(self) -> dict[str, Any]:
        return self.ctl.job.model_dump(mode="json")

    def stop(self, reason: str = "stop requested") -> None:
        self.ctl.request_stop(reason)

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        self.done.wait(timeout_s)
        return self.status()
