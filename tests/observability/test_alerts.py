"""Alerts reach a real HTTP endpoint on loopback: Slack-compatible and generic JSON payloads,
auth headers from the environment, retries on 5xx only, no secret in the incident record."""

from __future__ import annotations

import json
import time
import urllib.error
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.job import JobSpec
from supervisor.core.model import Diagnosis
from supervisor.observability import alerts
from supervisor.runtime import effects
from supervisor.runtime.actions.notify import AlertAction, send
from tests.incidents.builders import diagnosis
from tests.observability.conftest import Hook


def _doc(**over: Any) -> dict[str, Any]:
    return {
        "job": "tinylm",
        "incident": 3,
        "step": 103,
        "message": "look at rank 1",
        "diagnosis": diagnosis(**over),
    }


def test_slack_payload_has_text_and_valid_blocks(webhook: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_HOOK", webhook.url)
    monkeypatch.setenv("SUPERVISOR_ALERT_HEADER_AUTHORIZATION", "Bearer s3cr3t")
    assert send("env:SLACK_HOOK", alerts.payload(_doc(), "slack")) == 200
    (req,) = webhook.requests
    body = req["body"]
    assert req["path"] == "/services/T000/B000/secret-path"
    assert req["headers"]["Authorization"] == "Bearer s3cr3t"
    assert req["headers"]["Content-Type"] == "application/json"
    assert set(body) == {"text", "blocks"}  # what a Slack incoming webhook takes
    assert (
        body["text"]
        == "tinylm: incident #3 — transient spike at step 100, severity high, top cause data (0.82)"
    )
    types = [b["type"] for b in body["blocks"]]
    assert types[0] == "header" and types[-1] == "context" and "section" in types
    assert len(body["blocks"][0]["text"]["text"]) <= 150
    fields = next(b["fields"] for b in body["blocks"] if "fields" in b)
    assert [f["text"].split("\n")[0] for f in fields] == [
        "*Phenotype*", "*Onset*", "*First rank*", "*First anomaly*", "*Attributes*"
    ]  # fmt: skip
    assert fields[1]["text"] == "*Onset*\nstep 100, detected at 103"
    text = json.dumps(body["blocks"])
    assert "rank 1 (rank-local)" in text and "loss rose on rank 1 only" in text and "look at rank 1" in text


def test_generic_json_payload_carries_the_diagnosis(webhook: Hook) -> None:
    d = diagnosis(
        first_anomaly={"step": 100, "metric": "loss", "rank": 1, "value": float("nan"), "z": float("inf")}
    )
    assert alerts.post(webhook.url, alerts.payload({**_doc(), "diagnosis": d}, "json")) == 200
    body = webhook.requests[0]["body"]  # parsed strictly: NaN/Infinity would have been rejected
    assert body["kind"] == "spike_supervisor.alert" and body["version"] == 1
    assert (body["job"], body["incident"], body["step"], body["severity"]) == ("tinylm", 3, 103, "high")
    assert body["text"] == body["summary"] and body["text"].startswith("tinylm: incident #3")
    assert body["diagnosis"]["causes"][0]["cause"] == "data"
    assert (
        body["diagnosis"]["first_anomaly"]["value"] == "nan"
        and body["diagnosis"]["first_anomaly"]["z"] == "inf"
    )
    assert "Authorization" not in webhook.requests[0]["headers"]


def test_headers_from_env_names() -> None:
    env = {
        "SUPERVISOR_ALERT_HEADER_AUTHORIZATION": "Bearer x",
        "SUPERVISOR_ALERT_HEADER_X_API_KEY": "k",
        "SUPERVISOR_ALERT_HEADER_": "ignored",
        "OTHER": "no",
    }
    assert alerts.headers_from_env(env) == {"Authorization": "Bearer x", "X-Api-Key": "k"}


def test_retries_server_errors_then_succeeds(webhook: Hook) -> None:
    webhook.statuses = [503, 500]
    assert alerts.post(webhook.url, {"text": "x"}, initial_wait_s=0.01) == 200
    assert len(webhook.requests) == 3


def test_a_rejected_payload_is_not_retried(webhook: Hook) -> None:
    webhook.statuses = [400, 400, 400]
    with pytest.raises(urllib.error.HTTPError) as info:
        alerts.post(webhook.url, {"text": "x"}, initial_wait_s=0.01)
    assert info.value.code == 400 and len(webhook.requests) == 1


def test_unknown_format_and_unset_url_variable_are_clear_errors() -> None:
    from supervisor.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown alert format 'teams' \(valid: json, slack\)"):
        alerts.payload(_doc(), "teams")
    with pytest.raises(ConfigError, match=r"\$NO_SUCH_HOOK_VAR, which is not set"):
        alerts.resolve_url("env:NO_SUCH_HOOK_VAR", {})


class _Runtime:
    """The slice of the controller an executor sees (actions.base.Runtime): a real job spec and
    diagnosis, and a real thread pool for the POST, as the controller's I/O pool runs it."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.incident_id = 3
        self.current_step = 103
        self.diagnosis = Diagnosis.from_json(diagnosis())
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.tasks: dict[str, Future[Any]] = {}

    def start(self, action: AlertAction, params: dict[str, Any], memo: dict[str, Any]) -> None:
        """``action.start``, and its effects carried out as the controller does (``Submit``)."""
        for effect in action.start(self, params, memo):  # type: ignore[arg-type]
            assert isinstance(effect, effects.Submit)
            self.tasks[effect.name] = self.pool.submit(effect.fn, *effect.args)

    def result_of(self, name: str) -> tuple[bool, Any] | None:
        fut = self.tasks[name]
        if not fut.done():
            return None
        exc = fut.exception()
        return (False, exc) if exc else (True, fut.result())


def _job(tmp_path: Path, url: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "tinylm",
            "entrypoint": "examples.tinylm.train:main",
            "storage": {"path": str(tmp_path)},
            "max_steps": 10,
            "alert": {"webhook_url": url},
        }
    )


def _poll(action: AlertAction, rt: _Runtime, memo: dict[str, Any]) -> Any:
    deadline = time.monotonic() + 30
    while (out := action.poll(rt, {}, memo)) is None:
        assert time.monotonic() < deadline, "alert never finished"
        time.sleep(0.01)
    return out


def test_alert_action_posts_and_records_no_secret(
    webhook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPERVISOR_ALERT_HEADER_AUTHORIZATION", "Bearer s3cr3t")
    rt = _Runtime(_job(tmp_path, webhook.url))
    action = AlertAction()
    memo = action.prepare(rt, {"message": "m"}, "i3-p1-a0-alert")  # type: ignore[arg-type]
    recorded = json.dumps(memo)
    assert "secret-path" not in recorded and "s3cr3t" not in recorded
    assert memo["webhook"] == "http://127.0.0.1/…" and set(memo) == {
        "format",
        "webhook",
        "step",
        "task",
        "key",
    }
    rt.start(action, {"message": "m"}, memo)
    out = _poll(action, rt, memo)  # type: ignore[arg-type]
    assert out.ok and out.result["http_status"] == 200 and out.result["channels"] == ["log", "webhook"]
    (req,) = webhook.requests
    assert req["headers"]["Authorization"] == "Bearer s3cr3t"
    assert req["body"]["text"].startswith("tinylm: incident #3") and req["body"]["message"] == "m"


def test_alert_action_fails_when_the_endpoint_keeps_refusing(webhook: Hook, tmp_path: Path) -> None:
    webhook.statuses = [404]
    rt = _Runtime(_job(tmp_path, webhook.url))
    action = AlertAction()
    memo = action.prepare(rt, {}, "a")  # type: ignore[arg-type]
    rt.start(action, {}, memo)
    out = _poll(action, rt, memo)  # type: ignore[arg-type]
    assert not out.ok and out.result["channels"] == ["log"]
    assert (
        out.reason
        == "webhook POST failed: HTTP 404 Not Found (not retried: the endpoint rejected the request)"
    )


def test_an_alert_sent_again_after_a_restart_carries_the_same_key(webhook: Hook, tmp_path: Path) -> None:
    """A supervisor killed before the endpoint's answer was recorded sends the alert again from the
    recorded memo: same idempotency key (header and JSON), so the receiver shows it once."""
    rt = _Runtime(_job(tmp_path, webhook.url))
    action = AlertAction()
    memo = action.prepare(rt, {}, "i3-p1-a0-alert")  # type: ignore[arg-type]
    assert memo["key"].startswith("tinylm:i3-p1-a0-alert:")
    assert action.prepare(rt, {}, "i3-p1-a0-alert")["key"] != memo["key"]  # type: ignore[arg-type]  # a new run's
    rt.start(action, {}, memo)
    first = _poll(action, rt, memo)  # type: ignore[arg-type]
    again = _Runtime(_job(tmp_path, webhook.url))  # the restarted supervisor, the same recorded memo
    again.start(action, {}, json.loads(json.dumps(memo)))
    _poll(action, again, memo)  # type: ignore[arg-type]
    keys = [(r["headers"]["Idempotency-Key"], r["body"]["idempotency_key"]) for r in webhook.requests]
    assert keys == [(memo["key"], memo["key"])] * 2 and first.result["idempotency_key"] == memo["key"]
