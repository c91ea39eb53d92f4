"""alert: a log line always, and the incident summary POSTed to the job's webhook, retried.

The payload's format (Slack-compatible or generic JSON) and the auth headers are described in
``supervisor.observability.alerts``. What is recorded in the incident's timeline (the memo) is
the format and a redacted webhook address: never the URL's path (a Slack webhook URL is a
credential) nor a header value; both are read again when the alert is sent.
"""

from __future__ import annotations

from typing import Any

from supervisor.logging import get_logger
from supervisor.observability import alerts
from supervisor.runtime import effects
from supervisor.runtime.actions.base import Outcome, Runtime

log = get_logger("supervisor.runtime.alert")


def send(url: str, body: dict[str, Any], key: str | None = None) -> int:
    """The webhook POST as the supervisor's I/O pool runs it: URL and headers resolved from the
    environment here, in the supervisor's process; ``key``: the alert's idempotency key."""
    headers = alerts.headers_from_env() | ({alerts.IDEMPOTENCY_HEADER: key} if key else {})
    return alerts.post(alerts.resolve_url(url), body, headers)


class AlertAction:
    """Sent exactly once: the idempotency key is made in ``prepare`` and recorded with the pending
    event before anything is sent; a supervisor killed before the endpoint's answer was recorded
    sends it again with the same key (the receiver drops the repeat), and never once it was."""

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        # The memo is recorded in the timeline: no payload (it is rebuilt from the diagnosis when
        # sent, and the store drops `text` keys), no URL path, no header.
        url = rt.job.alert.webhook_url
        return {
            "format": getattr(rt.job.alert, "format", "json"),
            "webhook": alerts.redacted(url) if url and params.get("page", True) else None,
            "step": rt.current_step,
            "task": f"alert:{action_id}",
            "key": alerts.idempotency_key(rt.job.name, action_id),
        }

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        d = rt.diagnosis
        log.warning(
            "ALERT", job=rt.job.name, incident=rt.incident_id, phenotype=d.phenotype.value,
            onset=d.onset_step, first_rank=d.first_rank, causes=[c.cause.value for c in d.causes[:3]],
            message=params.get("message"),
        )  # fmt: skip
        url = rt.job.alert.webhook_url
        if memo["webhook"] and url:
            doc = {
                "job": rt.job.name,
                "incident": rt.incident_id,
                "step": memo["step"],
                "message": params.get("message"),
                "diagnosis": d.to_json(),
                "idempotency_key": memo.get("key"),
            }
            return (
                effects.Submit(
                    memo["task"], send, (url, alerts.payload(doc, memo["format"]), memo.get("key"))
                ),
            )
        return ()

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if not memo["webhook"]:
            return Outcome.done(channels=["log"])
        res = rt.result_of(memo["task"])
        if res is None:
            return None
        ok, value = res
        if ok:
            return Outcome.done(channels=["log", "webhook"], format=memo["format"], http_status=value,
                                idempotency_key=memo.get("key"))  # fmt: skip
        return Outcome.fail(f"webhook POST failed: {alerts.describe_failure(value)}", channels=["log"])
