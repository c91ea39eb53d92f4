"""Alert payloads and their delivery: Slack-compatible or generic JSON, auth headers from the environment.

Two formats (``alert.format`` in job.yaml):

- ``json`` (default): a generic document a webhook receiver can route on — ``kind``, ``job``,
  ``incident``, ``step``, ``severity``, ``summary``, ``message``, ``idempotency_key`` (also the
  ``Idempotency-Key`` header of every format: a repeat after a supervisor restart has the same
  key) and the full ``diagnosis`` (the stable contract of ``supervisor analyze --json``). It also carries ``text`` (the summary), so
  a Slack-compatible endpoint shows something readable even when pointed at it.
- ``slack``: what Slack incoming webhooks (and Mattermost, Rocket.Chat, Discord's ``/slack``
  endpoints) take: ``text`` (the notification and fallback) and ``blocks`` (Block Kit).

Secrets stay out of job.yaml, logs and the incident record: ``webhook_url`` may be
``env:NAME`` (read from the supervisor's environment when the alert is sent), and every
``SUPERVISOR_ALERT_HEADER_<NAME>`` variable becomes a request header ``<Name>``
(``SUPERVISOR_ALERT_HEADER_AUTHORIZATION="Bearer ..."`` → ``Authorization: Bearer ...``).
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from supervisor.errors import ConfigError

FORMATS = ("json", "slack")
HEADER_PREFIX = "SUPERVISOR_ALERT_HEADER_"
KIND = "spike_supervisor.alert"
IDEMPOTENCY_HEADER = "Idempotency-Key"
"""Every alert POST carries its key here (and the generic JSON in ``idempotency_key``): a repeat
after a supervisor restart has the same key, so a receiver shows the alert once."""


def idempotency_key(job: str, action_id: str) -> str:
    """The key of one alert: its job, its action (incident, plan, index) and a random part, so a
    job name used again for a new run never repeats an old alert's key. Made once, recorded with
    the alert's pending event before it is sent."""
    return f"{job}:{action_id}:{uuid.uuid4().hex[:12]}"


def _title(word: str) -> str:
    return word.replace("_", " ")


def summary_line(doc: Mapping[str, Any]) -> str:
    """One line a person reads in a notification: what, where, how bad."""
    d = doc.get("diagnosis") or {}
    causes = d.get("causes") or []
    top = f", top cause {causes[0]['cause']} ({causes[0]['score']:.2f})" if causes else ""
    onset = d.get("onset_step")
    where = f" at step {onset}" if onset is not None else ""
    phen = _title(str(d.get("phenotype", "loss")))
    return (
        f"{doc['job']}: incident #{doc['incident']} — {phen} spike{where}, "
        f"severity {d.get('severity', 'unknown')}{top}"
    )


def _facts(d: Mapping[str, Any]) -> list[tuple[str, str]]:
    facts = [("Phenotype", _title(str(d.get("phenotype"))))]
    if d.get("onset_step") is not None:
        det = d.get("detected_step")
        facts.append(
            ("Onset", f"step {d['onset_step']}" + (f", detected at {det}" if det is not None else ""))
        )
    if d.get("first_rank") is not None:
        facts.append(
            ("First rank", f"rank {d['first_rank']}" + (" (rank-local)" if d.get("rank_local") else ""))
        )
    fa = d.get("first_anomaly") or {}
    if fa.get("metric"):
        facts.append(("First anomaly", f"{fa['metric']} at step {fa.get('step')}"))
    attrs = [a for a in ("nonfinite", "rank_local", "after_resume") if d.get(a)]
    if d.get("source_local"):
        attrs.append(f"source_local ({d['source_local']})")
    if attrs:
        facts.append(("Attributes", ", ".join(attrs)))
    return facts


def generic_payload(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The generic JSON document (see the module docstring)."""
    d = doc.get("diagnosis") or {}
    return {
        "kind": KIND,
        "version": 1,
        "text": summary_line(doc),
        "summary": summary_line(doc),
        "job": doc["job"],
        "incident": doc["incident"],
        "step": doc.get("step"),
        "severity": d.get("severity"),
        "message": doc.get("message"),
        "diagnosis": dict(d),
        "idempotency_key": doc.get("idempotency_key"),
    }


def slack_payload(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Slack-compatible: ``text`` (notification / fallback) and ``blocks`` (Block Kit)."""
    d = doc.get("diagnosis") or {}
    line = summary_line(doc)
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": f"Loss spike: {doc['job']} #{doc['incident']}"[:150]},
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": line}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in _facts(d)][:10],
        },
    ]
    causes = d.get("causes") or []
    if causes:
        rows = []
        for c in causes[:3]:
            ev = "; ".join(c.get("evidence") or []) or "no evidence recorded"
            rows.append(f"• *{c['cause']}* {c['score']:.2f} — {ev}")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(rows)[:3000]}})
    if doc.get("message"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": str(doc["message"])[:3000]}})
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"spike-supervisor · step {doc.get('step')} · "
                    f"`supervisor incidents show {doc['incident']}`",
                }
            ],
        }
    )
    return {"text": line, "blocks": blocks}


def payload(doc: Mapping[str, Any], fmt: str = "json") -> dict[str, Any]:
    if fmt == "slack":
        return slack_payload(doc)
    if fmt == "json":
        return generic_payload(doc)
    raise ConfigError(f"unknown alert format {fmt!r} (valid: {', '.join(FORMATS)})", field="alert.format")


def headers_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``SUPERVISOR_ALERT_HEADER_X_API_KEY=v`` → ``{"X-Api-Key": "v"}``."""
    env = os.environ if environ is None else environ
    out = {}
    for key, value in env.items():
        if key.startswith(HEADER_PREFIX) and len(key) > len(HEADER_PREFIX):
            name = "-".join(part.capitalize() for part in key[len(HEADER_PREFIX) :].split("_") if part)
            out[name] = value
    return out


def resolve_url(url: str, environ: Mapping[str, str] | None = None) -> str:
    """``env:NAME`` → the value of $NAME (a Slack webhook URL is itself a secret)."""
    if not url.startswith("env:"):
        return url
    env = os.environ if environ is None else environ
    name = url[4:]
    value = env.get(name)
    if not value:
        raise ConfigError(f"alert.webhook_url names ${name}, which is not set", field="alert.webhook_url")
    return value


def redacted(url: str) -> str:
    """What may be recorded about a webhook: its scheme and host, never its path or query."""
    if url.startswith("env:"):
        return url
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{'/…' if parts.path not in ('', '/') else ''}"


def describe_failure(exc: BaseException) -> str:
    """Why a POST failed, in one line (an HTTP error says whether it was retried)."""
    if isinstance(exc, urllib.error.HTTPError):
        retried = "after retries" if _retryable(exc) else "not retried: the endpoint rejected the request"
        return f"HTTP {exc.code} {exc.reason} ({retried})"
    if isinstance(exc, urllib.error.URLError):
        return f"cannot reach the endpoint: {exc.reason} (after retries)"
    return f"{type(exc).__name__}: {exc}"


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity: they travel as strings ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _retryable(exc: BaseException) -> bool:
    """Retry what may pass next time (no connection, 5xx, 429); a 4xx says the request is wrong."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code == 429 or exc.code >= 500
    return isinstance(exc, OSError)


def post(
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    *,
    timeout_s: float = 10.0,
    attempts: int = 4,
    initial_wait_s: float = 1.0,
) -> int:
    """POST ``body`` as JSON with the given extra headers; retried with exponential backoff and
    jitter on connection errors, 429 and 5xx; returns the HTTP status."""
    data = json.dumps(_finite(body), default=str, allow_nan=False).encode()
    req_headers = {"Content-Type": "application/json", "User-Agent": "spike-supervisor", **(headers or {})}
    for attempt in Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=initial_wait_s, max=8.0) + wait_random(0, initial_wait_s),
        retry=retry_if_exception(_retryable),
        reraise=True,
    ):
        with attempt:
            req = urllib.request.Request(url, data=data, headers=req_headers, method="POST")
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - URL from job.yaml
                return int(resp.status)
    raise AssertionError("unreachable: tenacity re-raises the last error")
