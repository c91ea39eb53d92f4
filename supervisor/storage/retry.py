"""Bounded retries for S3 calls: which failures are worth another try, and how long to wait.

botocore's own retries are switched off (see s3.py) so that this is the one place that
decides: a caller sees either success or one ``StorageError`` naming the attempts spent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from botocore import exceptions as bex
from pydantic import BaseModel, ConfigDict, Field
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from supervisor.errors import StorageError
from supervisor.logging import get_logger

T = TypeVar("T")

_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "TooManyRequests",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
}
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    bex.ConnectionError,  # EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ...
    bex.ResponseStreamingError,
    bex.IncompleteReadError,
    ConnectionError,  # builtin: resets seen below botocore's wrappers
    TimeoutError,
)


class RetrySettings(BaseModel):
    """How S3 calls are retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempts: int = Field(6, ge=1, description="Total attempts per call (1 = no retry).")
    initial_s: float = Field(0.2, ge=0, description="First backoff; doubles each attempt.")
    max_s: float = Field(10.0, ge=0, description="Cap of one backoff.")
    jitter_s: float = Field(0.2, ge=0, description="Random extra wait added to each backoff.")


def is_retryable(exc: BaseException) -> bool:
    """Throttling / SlowDown, 5xx, and dropped or timed-out connections; never 4xx client errors."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # follow S3UploadFailedError -> ClientError chains
        seen.add(id(cur))
        if isinstance(cur, bex.ClientError):
            err = cur.response.get("Error", {})
            status = cur.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return err.get("Code") in _THROTTLE_CODES or int(status) >= 500 or int(status) == 429
        if isinstance(cur, _TRANSPORT_ERRORS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def call_with_retry(fn: Callable[[], T], *, settings: RetrySettings, what: str, source: str) -> T:
    """Run ``fn`` with bounded exponential backoff + jitter; non-retryable errors pass straight through."""
    log = get_logger("storage.retry", source=source, op=what)

    def _log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "retrying storage call",
            attempt=state.attempt_number,
            of=settings.attempts,
            error=describe(exc) if exc else None,
            wait_s=round(state.next_action.sleep, 3) if state.next_action else None,
        )

    retrying = Retrying(
        stop=stop_after_attempt(settings.attempts),
        wait=wait_exponential(multiplier=settings.initial_s, max=settings.max_s)
        + wait_random(0, settings.jitter_s),
        retry=retry_if_exception(is_retryable),
        before_sleep=_log,
        reraise=True,
    )
    try:
        return retrying(fn)
    except Exception as exc:
        if isinstance(exc, StorageError) or not is_retryable(exc):
            raise
        raise StorageError(
            f"{what} failed after {settings.attempts} attempts: {describe(exc)}", source=source
        ) from exc


def describe(exc: BaseException) -> str:
    """A one-line description of a boto error without request ids or credentials."""
    cur: Any = exc
    while cur is not None:
        if isinstance(cur, bex.ClientError):
            err = cur.response.get("Error", {})
            status = cur.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return f"{err.get('Code', 'error')} (HTTP {status}): {err.get('Message', '')}".strip()
        if cur.__cause__ is None:
            break
        cur = cur.__cause__
    return f"{type(exc).__name__}: {exc}"
