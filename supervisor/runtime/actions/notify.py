"""alert: a log line always, and the incident summary POSTed to the job's webhook, retried."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tenacity import retry, stop_after_attempt, wait_exponential_jitter

from supervisor.incidents import EventKind
from supervisor.logging import get_logger
from supervisor.runtime.actions.base import Outcome, Runtime

log = get_logger("supervisor.runtime.alert")


@retry(stop=stop_after_attempt(4), wait=wait_exponential_jitter(exp_base=2, max=8.0), reraise=True)
def post_json(url: str, body: dict[str, Any], timeout_s: float = 10.0) -> int:
    """POST ``body`` as JSON; retried with exponential backoff and jitter; returns the HTTP status."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body, default=str).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - URL comes from job.yaml
        return int(resp.status)


class AlertAction:
    event = EventKind.ALERT_SENT

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        summary = {
            "job": rt.job.name,
            "incident": rt.incident_id,
            "step": rt.current_step,
            "message": params.get("message"),
            "diagnosis": rt.diagnosis.to_json(),
        }
        return {"summary": summary, "webhook": rt.job.alert.webhook_url, "task": f"alert:{action_id}"}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> None:
        d = rt.diagnosis
        log.warning(
            "ALERT", job=rt.job.name, incident=rt.incident_id, phenotype=d.phenotype.value,
            onset=d.onset_step, first_rank=d.first_rank, causes=[c.cause.value for c in d.causes[:3]],
            message=params.get("message"),
        )  # fmt: skip
        if memo["webhook"]:
            rt.submit(memo["task"], post_json, memo["webhook"], memo["summary"])

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if not memo["webhook"]:
            return Outcome.done(channels=["log"])
        res = rt.result_of(memo["task"])
        if res is None:
            return None
        ok, value = res
        if ok:
            return Outcome.done(channels=["log", "webhook"], http_status=value)
        return Outcome.fail(f"webhook POST failed after retries: {value!r}", channels=["log"])
