# SPDX-License-Identifier: Apache-2.0
"""WSGI middleware: the contract's "one middleware behaviour everywhere" for
Flask, Django and any WSGI application.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, Client(url, api_key))
"""

from __future__ import annotations

import io
import itertools
import logging
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from . import errors
from ._middleware import (
    Answer, Settings, begin_error_answer, credential_digest, credential_key_of, fingerprint, legacy_answer,
    legacy_fingerprint, parse_key, problem, replay_answer,
    retry_again, status_line, stored_headers, stored_key_of, UNSCOPABLE_KEY,
)
from ._types import Acquired, Replay, Response
from .client import BODY_OMITTED_HEADER, Client

log = logging.getLogger("idemsvc")

StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class IdempotencyMiddleware:
    """Makes a WSGI application idempotent per the Idempotency-Key header
    draft (draft-ietf-httpapi-idempotency-key-header). A request of a
    configured method (POST, PATCH) with the key header runs the application
    at most once per key: a duplicate gets the stored answer byte for byte,
    with ``Idempotent-Replayed: true``. The header's value is a Structured
    Field String (``"abc"``), or a bare ``abc`` (the same key); an empty,
    malformed or over-long key gets 400, and so does a missing one unless
    ``optional``. The fingerprint covers the method, path, query and body
    (JSON in canonical form), so the same key with another request gets 422;
    a duplicate of a request still running gets 409 with Retry-After (or
    waits ``wait_ms``). 5xx, 408 and 429 answers and exceptions release the
    key, so that a retry runs the application again. An answer too large to
    store is stored without its body (``Idempotent-Body-Omitted: true``).
    Without idemsvc it answers 503 and the application does not run.

    Keys are scoped to the end user: ``scope(environ)`` names a stable
    subject (a user id), made part of the stored key; without it (or for a
    request it names no subject for), a keyed digest of the
    ``Authorization`` header and the ``credential_cookies`` is part of the
    fingerprint, keyed from ``credential_secret`` or else the client's API
    key, as the Go middleware computes it. ``unscoped=True`` turns both off
    (together with ``scope``: ValueError). ``methods`` are taken in upper
    case. After a 422, unless ``legacy_fingerprints=False``, the record is
    read, never begun again, and replayed when it holds the fingerprint of
    the SDKs' earlier versions.
    """

    def __init__(self, app: WSGIApp, client: Client, *, key_header: str = "Idempotency-Key",
                 methods: Sequence[str] = ("POST", "PATCH"), optional: bool = False,
                 headers: Sequence[str] | None = None, lease_ms: int = 30_000, retention_s: int | None = None,
                 wait_ms: int = 0, max_body_bytes: int = 1 << 20, max_stored_body_bytes: int = 1 << 20,
                 budget_s: float = 2.0, scope: Callable[[dict[str, Any]], str | None] | None = None,
                 credential_cookies: Sequence[str] = (), credential_secret: bytes | str | None = None,
                 unscoped: bool = False, legacy_fingerprints: bool = True):
        self.app = app
        self.client = client
        self.settings = s = Settings(key_header, methods, optional, headers, lease_ms, retention_s, wait_ms,
                                     max_body_bytes, max_stored_body_bytes, budget_s, scope, credential_cookies,
                                     credential_secret, unscoped, legacy_fingerprints)
        self._key_env = "HTTP_" + key_header.upper().replace("-", "_")
        self._credential_key = credential_key_of(s, client._config)
        self._scoped = s.scope is not None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        s = self.settings
        if environ.get("REQUEST_METHOD", "GET").upper() not in s.method_set:
            return self.app(environ, start_response)  # not made idempotent: runs every time
        raw = environ.get(self._key_env)
        if raw is None:
            if not s.optional:
                return _send(start_response, problem("invalid-request", 400, f"the {s.key_header} header is required"))
            return self.app(environ, start_response)
        key = parse_key([raw])
        if key is None:
            return _send(start_response, problem(
                "invalid-request", 400, f"the {s.key_header} header must be one non-empty Structured Field String "
                "of at most 255 characters, such as \"8e03978e\""))
        scoped, with_credentials = stored_key_of(s, environ, key)
        if scoped is None:
            return _send(start_response, problem("invalid-request", 400, UNSCOPABLE_KEY))
        stored_key = scoped
        body = _read_body(environ, s.max_body_bytes)
        if body is None:
            return _send(start_response, problem("too-large", 413, "the request body is too large to be made idempotent"))
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))

        credentials = None
        if with_credentials:
            cookie = environ.get("HTTP_COOKIE")
            credentials = credential_digest(self._credential_key, environ.get("HTTP_AUTHORIZATION"),
                                            [cookie] if cookie else [], s.credential_cookies)
        method = environ["REQUEST_METHOD"].upper()
        path = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1")
        query = environ.get("QUERY_STRING", "").encode("latin-1")
        fp = fingerprint(method, path, query, environ.get("CONTENT_TYPE"), body, credentials)
        budget = s.budget_s + s.wait_ms / 1000
        deadline = time.monotonic() + budget

        def left() -> float:
            return max(0.001, deadline - time.monotonic())

        def begin(fp: str) -> Acquired | Replay:
            return self.client.begin(stored_key, fingerprint=fp, lease_ms=s.lease_ms, retention_s=s.retention_s,
                                     wait_ms=s.wait_ms or None, budget=left(), timeout=left(),
                                     request_id=environ.get("HTTP_X_REQUEST_ID"))

        try:
            r = begin(fp)
        except errors.FingerprintMismatch as e:
            if self._scoped or not s.legacy_fingerprints:
                return _send(start_response, begin_error_answer(e))
            # Perhaps a record stored before fingerprints had a version (a
            # scoped key never had one): looked up, never begun again.
            try:
                record = self.client.status(stored_key, include_response=True, budget=left(), timeout=left())
            except errors.NotFound:
                record = None
            except errors.IdemError as e2:
                return _send(start_response, begin_error_answer(e2))
            return _send(start_response, legacy_answer(record, legacy_fingerprint(method, path, query, body)))
        except errors.IdemError as e:
            return _send(start_response, begin_error_answer(e))
        if isinstance(r, Replay):
            return _send(start_response, replay_answer(r))
        return self._run(environ, start_response, r)

    def _run(self, environ: dict[str, Any], start_response: StartResponse, acquired: Acquired) -> Iterable[bytes]:
        s = self.settings
        c = self.client
        held = c.hold(acquired, s.lease_ms)
        head: dict[str, Any] = {}
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            head["status"], head["headers"] = status, headers
            return chunks.append  # the legacy write() callable

        result: Iterable[bytes] | None = None
        size = 0
        over = False
        try:
            result = self.app(environ, capture)
            it = iter(result)
            for chunk in it:
                if not chunk:
                    continue
                chunks.append(chunk)
                size += len(chunk)
                if size > s.max_stored_body_bytes:
                    over = True
                    break
            if "status" not in head:
                raise RuntimeError("the application answered without start_response")
        except BaseException as e:
            _close(result)
            c.release(held)
            c._fail_for(acquired, e)
            raise
        status = int(str(head["status"])[:3])
        if over:
            # From here the answer goes to the caller as the application
            # writes it, and is stored without its body.
            start_response(head["status"], head["headers"])
            return self._stream(chunks, it, result, held, acquired, status, head["headers"])
        _close(result)
        c.release(held)
        resp = Response(status, stored_headers(s.headers, head["headers"]), b"".join(chunks))
        self._finish(acquired, resp)
        start_response(head["status"], head["headers"])
        return chunks

    def _stream(self, held_chunks: list[bytes], it: Iterator[bytes], result: Iterable[bytes], held: Any,
                acquired: Acquired, status: int, headers: list[tuple[str, str]]) -> Iterator[bytes]:
        c = self.client
        # The last chunk waits for the answer to be stored: a caller that
        # has it all may send its next request at once.
        pending: bytes | None = None
        try:
            for chunk in itertools.chain(held_chunks, it):
                if pending is not None:
                    yield pending
                pending = chunk
        except BaseException as e:
            _close(result)
            c.release(held)
            c._fail_for(acquired, e)
            raise
        _close(result)
        c.release(held)
        stored = {**(stored_headers(self.settings.headers, headers) or {}), BODY_OMITTED_HEADER: "true"}
        self._finish(acquired, Response(status, stored))
        if pending is not None:
            yield pending

    def _finish(self, acquired: Acquired, resp: Response) -> None:
        """Stores the answer, or releases the key for one not to store. The
        application ran: its caller gets its answer whether or not this worked."""
        c = self.client
        assert resp.status_code is not None
        try:
            if retry_again(resp.status_code):
                c.fail(acquired.key, acquired.lease_token, error=f"the handler answered {resp.status_code}")
            else:
                c._complete_for(acquired, resp, self.settings.retention_s, omit_body=True)
        except errors.IdemError as e:
            log.warning("idemsvc: storing the answer of %r: %s", acquired.key, e)


def _send(start_response: StartResponse, a: Answer) -> list[bytes]:
    headers = [*a.headers, ("Content-Length", str(len(a.body)))]
    start_response(status_line(a.status), headers)
    return [a.body]


def _read_body(environ: dict[str, Any], limit: int) -> bytes | None:
    """The request body, or None when it is over limit."""
    inp = environ.get("wsgi.input")
    length = environ.get("CONTENT_LENGTH")
    if inp is None:
        return b""
    if length:
        n = int(length)
        if n > limit:
            if n <= 4 * limit:
                # Read and dropped, so that the caller, still sending, gets
                # the 413 rather than a broken connection; a larger body is
                # left unread, and the server closes the connection.
                while n > 0:
                    b = inp.read(min(n, 1 << 16))
                    if not b:
                        break
                    n -= len(b)
            return None
        parts = []
        while n > 0:
            b = inp.read(n)
            if not b:
                break
            parts.append(b)
            n -= len(b)
        return b"".join(parts)
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and no end: a body WSGI cannot read safely
    data: bytes = inp.read(limit + 1)
    return None if len(data) > limit else data


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()

