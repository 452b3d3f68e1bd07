# SPDX-License-Identifier: Apache-2.0
"""The asyncio client: :class:`AsyncClient` has :class:`idemsvc.Client`'s
API, with coroutines. It calls idemsvc through httpx when httpx is
installed (a well-kept asyncio HTTP client with pooled keep-alive
connections), and otherwise through the synchronous client's pool on a
worker thread."""

from __future__ import annotations

import asyncio
import http.client
import time
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from . import _protocol as proto
from . import _steps as steps
from . import errors
from ._protocol import BeginItem, BeginOutcome, FinishItem, FinishOutcome, Tries
from ._types import Acquired, Lease, Replay, Response, Result, begin_result
from .client import (
    DEFAULT_CALL_TIMEOUT, DEFAULT_LEASE_MS, DEFAULT_RETRY_BUDGET, DEFAULT_WAIT_MS, USER_AGENT, Client, _Pool,
    _Target,
)

try:
    import httpx
except ImportError:  # pragma: no cover - exercised where httpx is absent
    httpx = None  # type: ignore[assignment]


# The errors of a call that got no answer, from either transport.
_NO_ANSWER: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
if httpx is not None:
    _NO_ANSWER += (httpx.TransportError,)


class _Transport(Protocol):
    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                      timeout: float) -> tuple[int, Any, bytes]: ...

    async def aclose(self) -> None: ...


class _HttpxTransport:
    def __init__(self, target: _Target, max_idle: int):
        base = f"{target.scheme}://{target.host_header}"
        verify: Any = target.ssl_context if target.ssl_context is not None else True
        self._client = httpx.AsyncClient(
            base_url=base, verify=verify, trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=max_idle))

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                      timeout: float) -> tuple[int, Any, bytes]:
        r = await self._client.request(method, path, content=body, headers=headers, timeout=timeout)
        return r.status_code, r.headers, r.content

    async def aclose(self) -> None:
        await self._client.aclose()


class _ThreadTransport:
    """Without httpx: the synchronous pool, each exchange on a worker thread."""

    def __init__(self, target: _Target, max_idle: int):
        self._pool = _Pool(target, max_idle)

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                      timeout: float) -> tuple[int, Any, bytes]:
        status, hdrs, data = await asyncio.to_thread(self._pool.request, method, path, body, headers, timeout)
        return status, hdrs, data

    async def aclose(self) -> None:
        self._pool.close()


class _Held:
    def __init__(self, lease: Lease, lease_ms: int):
        self.lease = lease
        self.lease_s = lease_ms / 1000
        self.expires = time.monotonic() + self.lease_s
        self.stopped = False
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    def lose(self, reason: BaseException) -> None:
        if not self.lease.lost.is_set():
            self.lease.lost_reason = reason
            self.lease.lost.set()


class AsyncClient:
    """A client of one idemsvc for asyncio code, with :class:`idemsvc.Client`'s
    rules and options. Use it from one event loop."""

    def __init__(self, base_url: str = "http://127.0.0.1:8080", api_key: str | None = None, *,
                 tenant: str | None = None, call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 retry_budget: float = DEFAULT_RETRY_BUDGET, max_idle: int = 32,
                 ssl_context: Any = None, use_httpx: bool | None = None):
        # The synchronous client checks the options the same way.
        Client(base_url, api_key, tenant=tenant, ssl_context=ssl_context)
        self._config: dict[str, Any] = dict(base_url=base_url, api_key=api_key, tenant=tenant,
                                            call_timeout=call_timeout, retry_budget=retry_budget,
                                            max_idle=max_idle, ssl_context=ssl_context)
        self._target = _Target(base_url, ssl_context)
        if use_httpx is None:
            use_httpx = httpx is not None
        self._transport: _Transport
        if use_httpx:
            self._transport = _HttpxTransport(self._target, max_idle)
        else:
            self._transport = _ThreadTransport(self._target, max_idle)
        self.tenant = tenant
        self.call_timeout = call_timeout
        self.retry_budget = retry_budget
        self._headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = "Bearer " + api_key

    @classmethod
    def like(cls, client: Client) -> AsyncClient:
        """An asyncio client with the same settings as a synchronous one."""
        return cls(**client._config)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, op: str, method: str, path: str, payload: Mapping[str, Any] | None, *,
                    timeout: float | None = None, budget: float | None = None,
                    request_id: str | None = None, batch: bool = False) -> tuple[int, Any]:
        body = proto.encode(payload, None if batch else self.tenant)
        headers = proto.with_request_id(self._headers, request_id)
        tries = Tries(op, self.retry_budget if budget is None else budget)
        timeout = timeout or self.call_timeout
        full = self._target.prefix + path
        while True:
            try:
                status, hdrs, data = await self._transport.request(method, full, body, headers, timeout)
            except _NO_ANSWER as e:
                pause = tries.no_answer(e)
            else:
                got = tries.answer(status, hdrs, data)
                if got is None:
                    return status, proto.decode(data)
                pause = got
            await asyncio.sleep(pause)

    async def begin(self, key: str, *, fingerprint: str | None = None, owner: str | None = None,
                    lease_ms: int | None = None, retention_s: int | None = None, wait_ms: int | None = None,
                    budget: float | None = None, timeout: float | None = None,
                    request_id: str | None = None) -> Acquired | Replay:
        payload = proto.begin_body(key, owner, fingerprint, lease_ms, retention_s, wait_ms)
        status, body = await self._call("begin", "POST", "/v1/begin", payload,
                                        timeout=timeout or self.call_timeout + (wait_ms or 0) / 1000, budget=budget,
                                        request_id=request_id)
        return begin_result(status, body)

    async def complete(self, key: str, lease_token: str, response: Response | None = None, *,
                       retention_s: int | None = None) -> dict[str, Any]:
        payload = proto.complete_body(key, lease_token, response, retention_s)
        return (await self._call("complete", "POST", "/v1/complete", payload))[1]  # type: ignore[no-any-return]

    async def fail(self, key: str, lease_token: str, *, retryable: bool = True, error: str | None = None,
                   response: Response | None = None) -> dict[str, Any]:
        payload = proto.fail_body(key, lease_token, retryable, error, response)
        return (await self._call("fail", "POST", "/v1/fail", payload))[1]  # type: ignore[no-any-return]

    async def extend(self, key: str, lease_token: str, lease_ms: int | None = None, *,
                     budget: float | None = None) -> dict[str, Any]:
        payload = proto.extend_body(key, lease_token, lease_ms)
        return (await self._call("extend", "POST", "/v1/extend", payload, budget=budget))[1]  # type: ignore[no-any-return]

    async def status(self, key: str, include_response: bool = False, *, budget: float | None = None,
                     timeout: float | None = None) -> dict[str, Any]:
        return (await self._call("status", "GET", proto.status_path(key, include_response, self.tenant),  # type: ignore[no-any-return]
                                 None, budget=budget, timeout=timeout))[1]

    async def delete(self, key: str) -> None:
        await self._call("delete", "DELETE", proto.delete_path(key, self.tenant), None)

    async def begin_batch(self, items: Sequence[BeginItem | str], *,
                          budget: float | None = None) -> list[BeginOutcome]:
        """:meth:`idemsvc.Client.begin_batch`, awaited."""
        payload = proto.begin_batch_body(items, self.tenant)
        _, answer = await self._call("begin batch", "POST", "/v1/begin/batch", payload, budget=budget, batch=True)
        return proto.begin_batch_results(answer, len(items))

    async def finish_batch(self, items: Sequence[FinishItem], *,
                           budget: float | None = None) -> list[FinishOutcome]:
        """:meth:`idemsvc.Client.finish_batch`, awaited."""
        payload = proto.finish_batch_body(items, self.tenant)
        _, answer = await self._call("finish batch", "POST", "/v1/finish/batch", payload, budget=budget, batch=True)
        return proto.finish_batch_results(answer, len(items))

    async def do(self, key: str, fn: Callable[[], Awaitable[Response]], *, fingerprint: str | None = None,
                 lease_ms: int = DEFAULT_LEASE_MS, retention_s: int | None = None,
                 wait_ms: int = DEFAULT_WAIT_MS, give_up_after: float | None = None) -> Result:
        """:meth:`idemsvc.Client.do` for a coroutine function."""
        return await steps.adrive(steps.do(key, fn, fingerprint, lease_ms, retention_s, wait_ms, give_up_after),
                                  self)

    async def run(self, acquired: Acquired, fn: Callable[[], Awaitable[Response]], *,
                  lease_ms: int = DEFAULT_LEASE_MS, retention_s: int | None = None,
                  omit_body: bool = False) -> Result:
        """:meth:`idemsvc.Client.run` for a coroutine function."""
        return await steps.adrive(steps.run(acquired, fn, lease_ms, retention_s, omit_body), self)

    async def _complete_for(self, a: Acquired, resp: Response, retention_s: int | None, omit_body: bool) -> None:
        await steps.adrive(steps.complete_for(a, resp, retention_s, omit_body), self)

    async def _fail_for(self, a: Acquired, e: BaseException) -> None:
        await steps.adrive(steps.fail_for(a, e), self)

    def hold(self, acquired: Acquired, lease_ms: int = DEFAULT_LEASE_MS) -> _Held:
        """Starts the heartbeat of an acquired lease on the running loop: a
        timer until it first fires, then an extend every lease/3."""
        lease = Lease(key=acquired.key, attempt=acquired.attempt, token=acquired.lease_token,
                      recovered=acquired.recovered)
        held = _Held(lease, lease_ms)
        loop = asyncio.get_running_loop()
        held.timer = loop.call_later(held.lease_s / 3, self._due, held)
        return held

    @staticmethod
    def release(held: _Held) -> None:
        held.stopped = True
        if held.timer is not None:
            held.timer.cancel()

    def _due(self, held: _Held) -> None:
        if not held.stopped:
            held.task = asyncio.get_running_loop().create_task(self._beat(held))

    async def _beat(self, held: _Held) -> None:
        if await steps.adrive(steps.beat(held), self):
            held.timer = asyncio.get_running_loop().call_later(held.lease_s / 3, self._due, held)
