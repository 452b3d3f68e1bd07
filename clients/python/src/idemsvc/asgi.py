# SPDX-License-Identifier: Apache-2.0
"""ASGI middleware: the contract's "one middleware behaviour everywhere" for
FastAPI, Starlette and any ASGI application.

    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(url, api_key))
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, MutableMapping, Sequence

from . import errors
from ._middleware import (
    Answer, Settings, begin_error_answer, credential_digest, credential_key_of, fingerprint, legacy_answer,
    legacy_fingerprint, parse_key, problem, replay_answer,
    retry_again, stored_headers, stored_key_of, UNSCOPABLE_KEY,
)
from ._types import Acquired, Replay, Response
from .aio import AsyncClient
from .client import BODY_OMITTED_HEADER, Client

log = logging.getLogger("idemsvc")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Disconnected(Exception):
    pass


class IdempotencyMiddleware:
    """Makes an ASGI application idempotent, as
    :class:`idemsvc.wsgi.IdempotencyMiddleware` does a WSGI one, with the
    same options; ``scope(asgi_scope)`` names the subject. ``client`` is an
    :class:`idemsvc.AsyncClient` (a :class:`idemsvc.Client` is taken as an
    asyncio client with its settings)."""

    def __init__(self, app: ASGIApp, client: AsyncClient | Client, *, key_header: str = "Idempotency-Key",
                 methods: Sequence[str] = ("POST", "PATCH"), optional: bool = False,
                 headers: Sequence[str] | None = None, lease_ms: int = 30_000, retention_s: int | None = None,
                 wait_ms: int = 0, max_body_bytes: int = 1 << 20, max_stored_body_bytes: int = 1 << 20,
                 budget_s: float = 2.0, scope: Callable[[Scope], str | None] | None = None,
                 credential_cookies: Sequence[str] = (), credential_secret: bytes | str | None = None,
                 unscoped: bool = False, legacy_fingerprints: bool = True):
        self.app = app
        self._client = client
        self._aclient: AsyncClient | None = client if isinstance(client, AsyncClient) else None
        self.settings = s = Settings(key_header, methods, optional, headers, lease_ms, retention_s, wait_ms,
                                     max_body_bytes, max_stored_body_bytes, budget_s, scope, credential_cookies,
                                     credential_secret, unscoped, legacy_fingerprints)
        self._key_name = key_header.lower().encode("latin-1")
        self._credential_key = credential_key_of(s, client._config)
        self._scoped = s.scope is not None

    @property
    def client(self) -> AsyncClient:
        if self._aclient is None:
            assert isinstance(self._client, Client)
            self._aclient = AsyncClient.like(self._client)
        return self._aclient

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = self.settings
        if scope["type"] != "http" or scope["method"].upper() not in s.method_set:
            await self.app(scope, receive, send)  # not made idempotent: runs every time
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
        values = [v.decode("latin-1") for k, v in headers if k.lower() == self._key_name]
        if not values:
            if not s.optional:
                await _send(send, problem("invalid-request", 400, f"the {s.key_header} header is required"))
                return
            await self.app(scope, receive, send)
            return
        key = parse_key(values)
        if key is None:
            await _send(send, problem(
                "invalid-request", 400, f"the {s.key_header} header must be one non-empty Structured Field String "
                "of at most 255 characters, such as \"8e03978e\""))
            return
        scoped, with_credentials = stored_key_of(s, scope, key)
        if scoped is None:
            await _send(send, problem("invalid-request", 400, UNSCOPABLE_KEY))
            return
        stored_key = scoped
        try:
            body = await _read_body(receive, s.max_body_bytes)
        except _Disconnected:
            return
        if body is None:
            await _send(send, problem("too-large", 413, "the request body is too large to be made idempotent"))
            return

        def header(name: bytes) -> str | None:
            vs = [v.decode("latin-1") for k, v in headers if k.lower() == name]
            return ", ".join(vs) if vs else None

        credentials = None
        if with_credentials:
            credentials = credential_digest(
                self._credential_key, next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), None),
                [v.decode("latin-1") for k, v in headers if k.lower() == b"cookie"], s.credential_cookies)
        raw_path = scope.get("raw_path")
        path = _unquote(raw_path.split(b"?", 1)[0]) if raw_path else scope["path"].encode("utf-8")
        root = scope.get("root_path", "").encode("utf-8")
        if root and not path.startswith(root):
            path = root + path
        method = scope["method"].upper()
        query = scope.get("query_string", b"")
        fp = fingerprint(method, path, query, header(b"content-type"), body, credentials)
        c = self.client
        deadline = time.monotonic() + s.budget_s + s.wait_ms / 1000

        def left() -> float:
            return max(0.001, deadline - time.monotonic())

        async def begin(fp: str) -> Acquired | Replay:
            return await c.begin(stored_key, fingerprint=fp, lease_ms=s.lease_ms, retention_s=s.retention_s,
                                 wait_ms=s.wait_ms or None, budget=left(), timeout=left(),
                                 request_id=header(b"x-request-id"))

        try:
            r = await begin(fp)
        except errors.FingerprintMismatch as e:
            if self._scoped or not s.legacy_fingerprints:
                await _send(send, begin_error_answer(e))
                return
            # Perhaps a record stored before fingerprints had a version (a
            # scoped key never had one): looked up, never begun again.
            try:
                record = await c.status(stored_key, include_response=True, budget=left(), timeout=left())
            except errors.NotFound:
                record = None
            except errors.IdemError as e2:
                await _send(send, begin_error_answer(e2))
                return
            await _send(send, legacy_answer(record, legacy_fingerprint(method, path, query, body)))
            return
        except errors.IdemError as e:
            await _send(send, begin_error_answer(e))
            return
        if isinstance(r, Replay):
            await _send(send, replay_answer(r))
            return
        await self._run(scope, receive, send, body, r)

    async def _run(self, scope: Scope, receive: Receive, send: Send, body: bytes, acquired: Acquired) -> None:
        s = self.settings
        c = self.client
        held = c.hold(acquired, s.lease_ms)
        given = False

        async def replay_receive() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        start: Message | None = None
        chunks: list[bytes] = []
        size = 0
        streaming = False

        last: Message | None = None

        async def send_streamed(message: Message) -> None:
            # The answer's end waits for it to be stored: a caller that has
            # it all may send its next request at once.
            nonlocal last
            if message.get("more_body", False):
                await send(message)
            else:
                last = message

        async def capture(message: Message) -> None:
            nonlocal start, size, streaming
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            if streaming:
                await send_streamed(message)
                return
            chunk = message.get("body", b"")
            if size + len(chunk) > s.max_stored_body_bytes:
                # From here the answer goes to the caller as the application
                # writes it, and is stored without its body.
                streaming = True
                await send(start)
                for held_chunk in chunks:
                    await send({"type": "http.response.body", "body": held_chunk, "more_body": True})
                chunks.clear()
                await send_streamed(message)
                return
            chunks.append(chunk)
            size += len(chunk)

        try:
            await self.app(scope, replay_receive, capture)
            if start is None:
                raise RuntimeError("the application returned without an answer")
        except BaseException as e:
            c.release(held)
            await c._fail_for(acquired, e)
            raise
        c.release(held)
        status = int(start["status"])
        raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
        kept = stored_headers(s.headers, raw_headers)
        if streaming:
            resp = Response(status, {**(kept or {}), BODY_OMITTED_HEADER: "true"})
        else:
            resp = Response(status, kept, b"".join(chunks))
        try:
            if retry_again(status):
                await c.fail(acquired.key, acquired.lease_token, error=f"the handler answered {status}")
            else:
                await c._complete_for(acquired, resp, s.retention_s, omit_body=True)
        except errors.IdemError as e:
            # The application ran: its caller gets its answer whether or not storing it worked.
            log.warning("idemsvc: storing the answer of %r: %s", acquired.key, e)
        if streaming:
            await send(last or {"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": False})


async def _send(send: Send, a: Answer) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in a.headers]
    headers.append((b"content-length", str(len(a.body)).encode()))
    await send({"type": "http.response.start", "status": a.status, "headers": headers})
    await send({"type": "http.response.body", "body": a.body, "more_body": False})


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None as soon as it is over limit."""
    parts: list[bytes] = []
    size = 0
    while True:
        m = await receive()
        if m["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = m.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not m.get("more_body", False):
            return b"".join(parts)


def _unquote(raw: bytes) -> bytes:
    """raw_path with its %XX escapes decoded, as the Go middleware's URL.Path holds it."""
    if b"%" not in raw:
        return raw
    from urllib.parse import unquote_to_bytes
    return unquote_to_bytes(raw)


