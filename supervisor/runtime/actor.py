"""The supervisor as a named Ray actor (``supervisor:<job>`` in the ``spike-supervisor`` namespace).

A threaded actor: the control loop runs in its own thread, started by ``__init__`` (so a
restart by Ray's ``max_restarts`` resumes the loop with no caller), while Ray's thread pool
serves ``ingest`` / ``directives`` / ``status`` / ``stop`` concurrently. ``__init__`` with
``attach=True`` (or any restart) resumes from the incident store and the runtime state file.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from supervisor.config.job import JobSpec
from supervisor.errors import SupervisorError
from supervisor.logging import configure as configure_logging
from supervisor.logging import get_logger
from supervisor.runtime.controller import Controller
from supervisor.runtime.settings import RuntimeSettings
from supervisor.runtime.state import JobPhase


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
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="supervisor-loop", daemon=True)
        self.thread.start()

    def _worker_supervision(self, spec: JobSpec, settings: RuntimeSettings) -> Any:
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

    def ingest(
        self,
        rank: int,
        batch: list[dict[str, Any]],
        seqs: list[int] | None = None,
        link: str | None = None,
        held: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Queue a batch; answers the link's durable mark (and ``resend_from`` when it must resend)."""
        return self.ctl.ingest_batch(rank, batch, seqs, link, held)

    def ingest_many(self, calls: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Several links' batches in one call (``(rank, batch, seqs, link, held)`` each), answered
        in order: one Ray call per process and interval instead of one per rank."""
        ingest = self.ctl.ingest_batch
        return [ingest(*call) for call in calls]

    def directives(self, rank: int, after_seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Directives after ``after_seq``; a long poll of up to ``wait_s`` when there are none yet."""
        return self.ctl.directives_after(rank, after_seq, min(wait_s, 5.0))

    def status(self) -> dict[str, Any]:
        out = self.ctl.status()
        out["supervisor_node"] = self.node_id
        if self.error:
            out["error"] = self.error
        return out

    def spec(self) -> dict[str, Any]:
        return self.ctl.job.model_dump(mode="json")

    def stop(self, reason: str = "stop requested") -> None:
        self.ctl.request_stop(reason)

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until the job reaches a terminal phase (or the timeout); returns the status."""
        self.done.wait(timeout_s)
        return self.status()
