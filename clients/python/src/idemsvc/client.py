# SPDX-License-Identifier: Apache-2.0
"""The synchronous client: the standard library's http.client, keep-alive
connections pooled per client, safe to share between threads."""

from __future__ import annotations

import heapq
import http.client
import itertools
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Mapping, Sequence

from . import _protocol as proto
from . import _steps as steps
from . import errors
from ._protocol import (  # noqa: F401 (backoff, encode_json and retry_after are the client's API since 0.1)
    BeginItem, BeginOutcome, FinishItem, FinishOutcome, Tries, backoff, encode_json, retry_after,
)
from ._steps import BODY_OMITTED_HEADER as BODY_OMITTED_HEADER
from ._steps import replayed as replayed
from ._types import Acquired, Lease, Replay, Response, Result, begin_result

VERSION = "0.1.0"
USER_AGENT = "idemsvc-python/" + VERSION

DEFAULT_CALL_TIMEOUT = 10.0  # seconds per HTTP exchange, plus a begin's wait
DEFAULT_RETRY_BUDGET = 15.0  # seconds spent retrying one call
DEFAULT_LEASE_MS = 30_000
DEFAULT_WAIT_MS = 5_000  # how long each begin of do() waits for another caller's attempt
class _Target:
    """Where the client's calls go: scheme, host, port and path prefix of the base URL."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"idemsvc: {base_url!r} is not an http:// or https:// URL")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl_context = ssl_context
        default_port = 443 if u.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"


class _Pool:
    """Keep-alive HTTP/1.1 connections to one idemsvc: each call takes an idle
    one (or opens one) and gives it back once the answer is read."""

    def __init__(self, target: _Target, max_idle: int):
        self.target = target
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        t = self.target
        if t.scheme == "https":
            return http.client.HTTPSConnection(t.host, t.port, timeout=timeout, context=t.ssl_context)
        return http.client.HTTPConnection(t.host, t.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                timeout: float) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One exchange. A connection from the pool that idemsvc closed while it
        was idle fails before any answer: the request goes once more, on a new
        connection (every call of this client is safe to send twice)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._exchange(conn, method, path, body, headers, timeout)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                pass
        return self._exchange(self._new(timeout), method, path, body, headers, timeout)

    def _exchange(self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
                  headers: dict[str, str], timeout: float) -> tuple[int, http.client.HTTPMessage, bytes]:
        try:
            if conn.timeout != timeout:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            with self._lock:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    conn = None  # type: ignore[assignment]
            if conn is not None:
                conn.close()
        return resp.status, resp.headers, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Beats:
    """The heartbeats of a client's leases: one thread that sleeps until the
    next lease is due for an extend, started with the first lease (and ended
    after 30 s without any). A lease's entry stays until it is due, also once
    its operation ended, so that the thread wakes only for the earliest
    entry: an operation shorter than lease/3 costs a heap push and no
    wake-up of the thread."""

    def __init__(self, extend: Callable[[_Held], None]):
        self._extend = extend
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Held]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._sleeps_until = 0.0  # when the thread wakes by itself; it is told of an earlier entry

    def schedule(self, held: _Held, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), held))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idemsvc-heartbeat", daemon=True)
                self._sleeps_until = 0.0
                self._thread.start()
            elif due < self._sleeps_until:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if not self._heap:
                        self._sleeps_until = now + 30
                        if not self._cond.wait(timeout=30) and not self._heap:
                            self._thread = None
                            return
                        continue
                    due, _, held = self._heap[0]
                    if due > now:
                        self._sleeps_until = due
                        self._cond.wait(timeout=due - now)
                        continue
                    heapq.heappop(self._heap)
                    if not held.stopped:
                        self._sleeps_until = 0.0
                        break
            # The extend runs on a thread of its own: a slow idemsvc must not
            # hold back the beats of other leases.
            threading.Thread(target=self._extend, args=(held,), name="idemsvc-extend", daemon=True).start()


class _Held:
    """A lease held while its operation runs, and its heartbeat's state."""

    def __init__(self, lease: Lease, lease_ms: int):
        self.lease = lease
        self.lease_s = lease_ms / 1000
        self.expires = time.monotonic() + self.lease_s  # on this clock; a little late at worst
        self.stopped = False

    def lose(self, reason: BaseException) -> None:
        if not self.lease.lost.is_set():
            self.lease.lost_reason = reason
            self.lease.lost.set()


class Client:
    """A client of one idemsvc, safe to share between threads.

    Every call is retried on network errors, 503 answers and 429 answers,
    with exponential backoff and jitter, honouring ``Retry-After``, until the
    retry budget ends; a ``Retry-After`` beyond the budget is not waited for.
    Retries are safe: a begin carries an owner, complete and fail carry the
    lease token.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8080", api_key: str | None = None, *,
                 tenant: str | None = None, call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 retry_budget: float = DEFAULT_RETRY_BUDGET, max_idle: int = 32,
                 ssl_context: ssl.SSLContext | None = None):
        if api_key is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in api_key):
            raise ValueError("idemsvc: the API key has a control character (a line end read from a file, say), "
                             "which no HTTP header can carry")
        self._config: dict[str, Any] = dict(base_url=base_url, api_key=api_key, tenant=tenant,
                                            call_timeout=call_timeout, retry_budget=retry_budget,
                                            max_idle=max_idle, ssl_context=ssl_context)
        self._target = _Target(base_url, ssl_context)
        self._pool = _Pool(self._target, max_idle)
        self.tenant = tenant
        self.call_timeout = call_timeout
        self.retry_budget = retry_budget
        self._headers = {"Host": self._target.host_header, "User-Agent": USER_AGENT,
                         "Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = "Bearer " + api_key
        self._beats = _Beats(self._beat)

    def close(self) -> None:
        """Closes the idle connections; the client may still be used."""
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one call -------------------------------------------------------

    def _call(self, op: str, method: str, path: str, payload: Mapping[str, Any] | None, *,
              timeout: float | None = None, budget: float | None = None,
              request_id: str | None = None, batch: bool = False) -> tuple[int, Any]:
        """Runs one API call until it succeeds, fails for good, or the retry
        budget ends; returns the status and the decoded JSON answer. A batch's
        items carry the tenant, its envelope does not."""
        body = proto.encode(payload, None if batch else self.tenant)
        headers = proto.with_request_id(self._headers, request_id)
        tries = Tries(op, self.retry_budget if budget is None else budget)
        timeout = timeout or self.call_timeout
        full = self._target.prefix + path
        while True:
            try:
                status, hdrs, data = self._pool.request(method, full, body, headers, timeout)
            except (OSError, http.client.HTTPException) as e:
                pause = tries.no_answer(e)
            else:
                got = tries.answer(status, hdrs, data)
                if got is None:
                    return status, proto.decode(data)
                pause = got
            time.sleep(pause)

    # --- the API ----------------------------------------------------------

    def begin(self, key: str, *, fingerprint: str | None = None, owner: str | None = None,
              lease_ms: int | None = None, retention_s: int | None = None, wait_ms: int | None = None,
              budget: float | None = None, timeout: float | None = None,
              request_id: str | None = None) -> Acquired | Replay:
        """Starts an attempt for key. A key in progress elsewhere raises
        :class:`~idemsvc.errors.InProgress`. Without an owner, one is made up,
        so that the call's own retries get the lease it may have been given."""
        payload = proto.begin_body(key, owner, fingerprint, lease_ms, retention_s, wait_ms)
        status, body = self._call("begin", "POST", "/v1/begin", payload,
                                  timeout=timeout or self.call_timeout + (wait_ms or 0) / 1000, budget=budget,
                                  request_id=request_id)
        return begin_result(status, body)

    def complete(self, key: str, lease_token: str, response: Response | None = None, *,
                 retention_s: int | None = None) -> dict[str, Any]:
        """Stores response as the outcome of the attempt holding lease_token."""
        payload = proto.complete_body(key, lease_token, response, retention_s)
        return self._call("complete", "POST", "/v1/complete", payload)[1]  # type: ignore[no-any-return]

    def fail(self, key: str, lease_token: str, *, retryable: bool = True, error: str | None = None,
             response: Response | None = None) -> dict[str, Any]:
        """Ends the attempt holding lease_token with a failure: retryable
        releases the key; otherwise the failure is stored for replay."""
        payload = proto.fail_body(key, lease_token, retryable, error, response)
        return self._call("fail", "POST", "/v1/fail", payload)[1]  # type: ignore[no-any-return]

    def extend(self, key: str, lease_token: str, lease_ms: int | None = None, *,
               budget: float | None = None) -> dict[str, Any]:
        """Pushes the lease of the attempt holding lease_token to now + lease_ms."""
        payload = proto.extend_body(key, lease_token, lease_ms)
        return self._call("extend", "POST", "/v1/extend", payload, budget=budget)[1]  # type: ignore[no-any-return]

    def status(self, key: str, include_response: bool = False, *, budget: float | None = None,
               timeout: float | None = None) -> dict[str, Any]:
        """key's record; :class:`~idemsvc.errors.NotFound` when there is none."""
        return self._call("status", "GET", proto.status_path(key, include_response, self.tenant), None,  # type: ignore[no-any-return]
                          budget=budget, timeout=timeout)[1]

    def delete(self, key: str) -> None:
        """Forgets key's record; deleting an absent record is no error."""
        self._call("delete", "DELETE", proto.delete_path(key, self.tenant), None)

    def begin_batch(self, items: Sequence[BeginItem | str], *,
                    budget: float | None = None) -> list[BeginOutcome]:
        """Begins every item in one call (POST /v1/begin/batch), for a queue
        consumer's batch: at most the service's batch size (100 by default).
        The outcomes come in the items' order, each what :meth:`begin` would
        have given: an :class:`Acquired`, a :class:`Replay`, or the item's
        problem as its exception (:class:`~idemsvc.errors.InProgress`,
        :class:`~idemsvc.errors.FingerprintMismatch`, ...), returned, not
        raised: one item's problem does not fail the others. A batch never
        waits. An item without an owner gets one made up, kept when the call
        is retried, so that a retry gets the same leases. Raised: the whole
        call's error (unreachable, a 400 for the batch)."""
        payload = proto.begin_batch_body(items, self.tenant)
        _, answer = self._call("begin batch", "POST", "/v1/begin/batch", payload, budget=budget, batch=True)
        return proto.begin_batch_results(answer, len(items))

    def finish_batch(self, items: Sequence[FinishItem], *, budget: float | None = None) -> list[FinishOutcome]:
        """Completes or fails every item in one call (POST /v1/finish/batch).
        The outcomes come in the items' order: the single call's answer, or
        the item's problem as its exception (:class:`~idemsvc.errors.LeaseLost`,
        ...), returned, not raised. Retrying is safe: the same token finishing
        again gets the same result. Raised: the whole call's error."""
        payload = proto.finish_batch_body(items, self.tenant)
        _, answer = self._call("finish batch", "POST", "/v1/finish/batch", payload, budget=budget, batch=True)
        return proto.finish_batch_results(answer, len(items))

    # --- running an operation --------------------------------------------

    def do(self, key: str, fn: Callable[[], Response], *, fingerprint: str | None = None,
           lease_ms: int = DEFAULT_LEASE_MS, retention_s: int | None = None,
           wait_ms: int = DEFAULT_WAIT_MS, give_up_after: float | None = None) -> Result:
        """Runs fn at most once for key, across every caller of idemsvc, and
        gives every caller its outcome:

        - a key completed before is replayed without calling fn
          (``Result.replayed``); one failed terminally raises
          :class:`~idemsvc.errors.Failed`;
        - a key in progress elsewhere is waited for (``wait_ms`` per begin),
          and begun again with backoff, until ``give_up_after`` seconds
          (forever by default), then :class:`~idemsvc.errors.InProgress`;
        - otherwise fn runs under the lease, extended every lease/3 while it
          runs (:func:`idemsvc.current_lease` gives it to fn); its response
          is completed. :class:`~idemsvc.errors.TerminalError` fails the
          attempt terminally, storing its response for replay; any other
          exception releases the key (the next caller runs fn) and is raised
          again. A response idemsvc refuses to store fails the attempt
          terminally, so that no duplicate runs fn again.
        """
        return steps.drive(steps.do(key, fn, fingerprint, lease_ms, retention_s, wait_ms, give_up_after), self)

    def run(self, acquired: Acquired, fn: Callable[[], Response], *, lease_ms: int = DEFAULT_LEASE_MS,
            retention_s: int | None = None, omit_body: bool = False) -> Result:
        """Runs fn under an acquired lease, with a heartbeat, and completes or
        fails the attempt, as :meth:`do` does once it acquired the key."""
        return steps.drive(steps.run(acquired, fn, lease_ms, retention_s, omit_body), self)

    def _complete_for(self, a: Acquired, resp: Response, retention_s: int | None, omit_body: bool) -> None:
        steps.drive(steps.complete_for(a, resp, retention_s, omit_body), self)

    def _fail_for(self, a: Acquired, e: BaseException) -> None:
        steps.drive(steps.fail_for(a, e), self)

    # --- heartbeat ----------------------------------------------------------

    def hold(self, acquired: Acquired, lease_ms: int = DEFAULT_LEASE_MS) -> _Held:
        """Starts the heartbeat of an acquired lease: it is extended every
        lease/3 until :meth:`release`; ``Lease.lost`` is set when it is lost."""
        lease = Lease(key=acquired.key, attempt=acquired.attempt, token=acquired.lease_token,
                      recovered=acquired.recovered)
        held = _Held(lease, lease_ms)
        self._beats.schedule(held, time.monotonic() + held.lease_s / 3)
        return held

    @staticmethod
    def release(held: _Held) -> None:
        held.stopped = True

    def _beat(self, held: _Held) -> None:
        if not held.stopped and steps.drive(steps.beat(held), self):
            self._beats.schedule(held, time.monotonic() + held.lease_s / 3)
