# SPDX-License-Identifier: Apache-2.0
"""The calls of idemsvc's API without their I/O, shared by the sync and the
asyncio client: the request bodies, the retry rule, and the batch calls'
items and results. Each client only sends what this builds and sleeps for
what it says."""

from __future__ import annotations

import json
import random
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from . import errors
from ._types import Acquired, Replay, Response, begin_result, new_owner, short_message

MIN_BACKOFF = 0.05
MAX_BACKOFF = 2.0

# One encoder for every call: json.dumps with options makes one per call.
encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def backoff(attempt: int) -> float:
    """A full-jitter exponential delay for the attempt'th retry, as the Go SDK's."""
    d: float = min(MIN_BACKOFF * float(2 ** min(attempt, 16)), MAX_BACKOFF)
    return d / 2 + random.uniform(0, d / 2)


def retry_after(value: str | None) -> float | None:
    """Retry-After in whole seconds, as idemsvc sends it; None when absent or not a number."""
    if value and value.strip().isdigit():
        s = int(value.strip())
        return float(s) if s > 0 else None
    return None


def encode(payload: Mapping[str, Any] | None, tenant: str | None) -> bytes | None:
    """A request body: the payload as JSON, with the client's tenant."""
    if payload is None:
        return None
    if tenant is not None:
        payload = {**payload, "tenant": tenant}
    return encode_json(payload).encode("utf-8")


def with_request_id(headers: dict[str, str], request_id: str | None) -> dict[str, str]:
    if request_id and request_id.isprintable() and request_id.isascii():
        return {**headers, "X-Request-Id": request_id}
    return headers


def decode(data: bytes) -> Any:
    return json.loads(data) if data else None


class Tries:
    """The retry rule of one call: network errors, 503 and 429 are tried
    again after a backoff with jitter, or after ``Retry-After``, until the
    budget ends (a wait beyond it is not waited for); every other error
    answer is raised at once as its problem's exception."""

    __slots__ = ("op", "deadline", "n")

    def __init__(self, op: str, budget: float):
        self.op = op
        self.deadline = time.monotonic() + budget
        self.n = 0

    def no_answer(self, e: BaseException) -> float:
        """The pause before trying again after a call that got no answer; raises Unreachable when out of budget."""
        err = errors.Unreachable(f"idemsvc: {self.op}: unavailable: {e!r}")
        err.__cause__ = e
        return self._pause(err, None)

    def answer(self, status: int, headers: Any, data: bytes) -> float | None:
        """None for a success; else the pause before trying again, or the answer's problem raised."""
        if status < 300:
            return None
        ra = retry_after(headers.get("Retry-After"))
        err = errors.problem_error(status, headers.get("Content-Type", ""), data, ra, self.op)
        if status not in (503, 429):
            raise err
        return self._pause(err, ra)

    def _pause(self, err: errors.IdemError, ra: float | None) -> float:
        wait = ra if ra is not None else backoff(self.n)
        self.n += 1
        if time.monotonic() + wait > self.deadline:
            raise err
        return wait


# --- the single calls' bodies -------------------------------------------------


def begin_body(key: str, owner: str | None, fingerprint: str | None, lease_ms: int | None,
               retention_s: int | None, wait_ms: int | None) -> dict[str, Any]:
    """A begin's body; without an owner, one is made up, so that the call's
    own retries get the lease it may have been given."""
    payload: dict[str, Any] = {"key": key, "owner": owner or new_owner()}
    if fingerprint:
        payload["fingerprint"] = fingerprint
    if lease_ms:
        payload["lease_ms"] = lease_ms
    if retention_s:
        payload["retention_s"] = retention_s
    if wait_ms:
        payload["wait_ms"] = wait_ms
    return payload


def complete_body(key: str, lease_token: str, response: Response | None, retention_s: int | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"key": key, "lease_token": lease_token, "response": (response or Response()).to_wire()}
    if retention_s:
        payload["retention_s"] = retention_s
    return payload


def fail_body(key: str, lease_token: str, retryable: bool, error: str | None,
              response: Response | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"key": key, "lease_token": lease_token, "retryable": retryable}
    if error:
        payload["error"] = short_message(error)
    if response is not None:
        payload["response"] = response.to_wire()
    return payload


def extend_body(key: str, lease_token: str, lease_ms: int | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"key": key, "lease_token": lease_token}
    if lease_ms:
        payload["lease_ms"] = lease_ms
    return payload


def status_path(key: str, include_response: bool, tenant: str | None) -> str:
    q = {"key": key}
    if include_response:
        q["include_response"] = "true"
    if tenant is not None:
        q["tenant"] = tenant
    return "/v1/status?" + urllib.parse.urlencode(q)


def delete_path(key: str, tenant: str | None) -> str:
    q = {"key": key}
    if tenant is not None:
        q["tenant"] = tenant
    return "/v1/keys?" + urllib.parse.urlencode(q)


# --- the batch calls -------------------------------------------------------------


@dataclass
class BeginItem:
    """One begin of a batch (``Client.begin_batch``). Without an owner, one
    is made up when the call is built, and kept when it is retried."""

    key: str
    fingerprint: str | None = None
    owner: str | None = None
    lease_ms: int | None = None
    retention_s: int | None = None


@dataclass
class FinishItem:
    """One finish of a batch (``Client.finish_batch``): a complete of the
    attempt holding ``lease_token`` with ``response``, or, with ``fail``, a
    fail (``retryable`` releases the key; otherwise the failure, ``error``
    and ``response`` are stored for replay)."""

    key: str
    lease_token: str
    response: Response | None = None
    retention_s: int | None = None
    fail: bool = False
    retryable: bool = True
    error: str | None = None


BeginOutcome = Acquired | Replay | errors.ProblemError
FinishOutcome = dict[str, Any] | errors.ProblemError


def begin_batch_body(items: Sequence[BeginItem | str], tenant: str | None) -> dict[str, Any]:
    """The body of POST /v1/begin/batch. A batch never waits: no ``wait_ms``."""
    out = []
    for it in items:
        if isinstance(it, str):
            it = BeginItem(it)
        b = begin_body(it.key, it.owner, it.fingerprint, it.lease_ms, it.retention_s, None)
        if tenant is not None:
            b["tenant"] = tenant
        out.append(b)
    return {"items": out}


def finish_batch_body(items: Sequence[FinishItem], tenant: str | None) -> dict[str, Any]:
    """The body of POST /v1/finish/batch."""
    out = []
    for it in items:
        if it.fail:
            b = fail_body(it.key, it.lease_token, it.retryable, it.error, it.response)
            b["kind"] = "fail"
        else:
            b = complete_body(it.key, it.lease_token, it.response, it.retention_s)
            b["kind"] = "complete"
        if tenant is not None:
            b["tenant"] = tenant
        out.append(b)
    return {"items": out}


def _results(answer: Any, n: int, op: str) -> list[Mapping[str, Any]]:
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != n or not all(isinstance(r, dict) for r in results):
        raise errors.IdemError(f"idemsvc: {op}: an answer without one result per item")
    return results


def begin_batch_results(answer: Any, n: int) -> list[BeginOutcome]:
    """Each item's outcome, as :meth:`Client.begin` would have returned or raised it."""
    out: list[BeginOutcome] = []
    for r in _results(answer, n, "begin batch"):
        status, body = r.get("status"), r.get("body")
        if status in (200, 201) and isinstance(body, dict):
            out.append(begin_result(status, body))
        else:
            out.append(item_problem(status, body, "begin batch"))
    return out


def finish_batch_results(answer: Any, n: int) -> list[FinishOutcome]:
    """Each item's outcome: the single complete's or fail's answer, or its problem."""
    out: list[FinishOutcome] = []
    for r in _results(answer, n, "finish batch"):
        status, body = r.get("status"), r.get("body")
        if status == 200 and isinstance(body, dict):
            out.append(body)
        else:
            out.append(item_problem(status, body, "finish batch"))
    return out


def item_problem(status: Any, body: Any, op: str) -> errors.ProblemError:
    """A batch item's problem as its kind's exception; an in-progress item's
    ``retry_after`` is the time left on the other caller's lease (at least 1 s)."""
    st = status if isinstance(status, int) else 0
    problem = body if isinstance(body, dict) else {}
    ra = None
    expires = problem.get("lease_expires_at")
    if isinstance(expires, str):
        try:
            left = (datetime.fromisoformat(expires) - datetime.now(timezone.utc)).total_seconds()
            ra = float(max(1, round(left)))
        except ValueError:
            pass
    return errors.problem_of(st, problem, ra, op)
