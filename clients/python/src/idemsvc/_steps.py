# SPDX-License-Identifier: Apache-2.0
"""The SDK's rules for running an operation, written once for the sync and
the asyncio client: each rule is a generator that yields the client calls
it needs (:func:`call`) and is sent their results (or thrown their
exceptions); :func:`drive` runs it on a :class:`~idemsvc.Client`,
:func:`adrive` on an :class:`~idemsvc.AsyncClient`, awaiting what is
awaitable."""

from __future__ import annotations

import inspect
import itertools
import time
from typing import Any, Callable, Generator, TypeVar

from . import errors
from ._protocol import backoff
from ._types import Acquired, Replay, Response, Result, _current, new_owner

T = TypeVar("T")

Step = tuple[str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Step, Any, T]

BODY_OMITTED_HEADER = "Idempotent-Body-Omitted"


def call(method: str, *args: Any, **kwargs: Any) -> Step:
    """A call of the client's method; ``"sleep"`` pauses, ``"invoke"`` calls
    a function of the caller, ``"shielded"`` runs steps that a cancelled
    asyncio task still finishes."""
    return method, args, kwargs


def _do(client: Any, step: Step, sleep: Callable[[float], Any], sub: Callable[[Steps[Any]], Any]) -> Any:
    """One step's call (an awaitable, for an asyncio client)."""
    name, args, kwargs = step
    if name == "sleep":
        return sleep(*args)
    if name == "invoke":
        return args[0](*args[1:])
    if name == "shielded":
        return sub(args[0])
    return getattr(client, name)(*args, **kwargs)


def drive(steps: Steps[T], client: Any) -> T:
    """Runs steps on a synchronous client."""
    def sub(s: Steps[Any]) -> Any:
        return drive(s, client)

    try:
        step = next(steps)
        while True:
            try:
                res = _do(client, step, time.sleep, sub)
            except BaseException as e:
                step = steps.throw(e)
            else:
                step = steps.send(res)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(steps: Steps[T], client: Any) -> T:
    """Runs steps on an asyncio client, awaiting what is awaitable."""
    import asyncio

    def sub(s: Steps[Any]) -> Any:
        return asyncio.shield(adrive(s, client))

    try:
        step = next(steps)
        while True:
            try:
                res = _do(client, step, asyncio.sleep, sub)
                if inspect.isawaitable(res):
                    res = await res
            except BaseException as e:
                step = steps.throw(e)
            else:
                step = steps.send(res)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def replayed(r: Replay) -> Result:
    """The Result of a finished attempt's stored outcome; a terminal failure raises Failed."""
    if r.failed:
        raise errors.Failed(r.error or "", response=r.response, attempt=r.attempt, replayed=True)
    return Result(response=r.response, replayed=True, attempt=r.attempt)


def do(key: str, fn: Callable[[], Any], fingerprint: str | None, lease_ms: int, retention_s: int | None,
       wait_ms: int, give_up_after: float | None) -> Steps[Result]:
    """``Client.do``: begin (waiting for another caller's attempt, and again
    with backoff), replay, or run under the lease."""
    owner = new_owner()
    end = None if give_up_after is None else time.monotonic() + give_up_after
    for attempt in itertools.count():
        try:
            r = yield call("begin", key, fingerprint=fingerprint, owner=owner, lease_ms=lease_ms,
                           retention_s=retention_s, wait_ms=wait_ms)
        except errors.InProgress:
            pause = backoff(attempt)
            if end is not None and time.monotonic() + pause > end:
                raise
            yield call("sleep", pause)
            continue
        if isinstance(r, Replay):
            return replayed(r)
        return (yield from run(r, fn, lease_ms, retention_s, False))
    raise AssertionError("unreachable")


def run(acquired: Acquired, fn: Callable[[], Any], lease_ms: int, retention_s: int | None,
        omit_body: bool) -> Steps[Result]:
    """``Client.run``: fn under the held lease, then complete or fail."""
    held = yield call("hold", acquired, lease_ms)
    token = _current.set(held.lease)
    try:
        resp = yield call("invoke", fn)
    except BaseException as e:
        yield call("release", held)
        # The operation ran (or broke off): its outcome is stored even if
        # an asyncio task is being cancelled.
        yield call("shielded", fail_for(acquired, e))
        if isinstance(e, errors.TerminalError):
            raise errors.Failed(str(e), response=e.response, attempt=acquired.attempt) from e
        raise
    finally:
        _current.reset(token)
    yield call("release", held)
    yield call("shielded", complete_for(acquired, resp, retention_s, omit_body))
    return Result(response=resp, replayed=False, attempt=acquired.attempt)


def complete_for(a: Acquired, resp: Response, retention_s: int | None, omit_body: bool) -> Steps[None]:
    try:
        yield call("complete", a.key, a.lease_token, resp, retention_s=retention_s)
        return
    except errors.TooLarge as e:
        if not omit_body:
            refused: errors.ProblemError = e
        else:
            headers = {**(resp.headers or {}), BODY_OMITTED_HEADER: "true"}
            try:
                yield call("complete", a.key, a.lease_token, Response(resp.status_code, headers),
                           retention_s=retention_s)
                return
            except (errors.TooLarge, errors.InvalidRequest) as e2:
                refused = e2
    except errors.InvalidRequest as e:
        refused = e
    # The operation ran but its outcome cannot be stored: a terminal
    # failure keeps duplicates from running it again.
    msg = f"the response could not be stored: {refused}"
    try:
        yield call("fail", a.key, a.lease_token, retryable=False, error=msg)
    except errors.IdemError as ferr:
        refused.add_note(f"and failing the attempt: {ferr}")
    raise errors.Failed(msg, response=resp, attempt=a.attempt) from refused


def fail_for(a: Acquired, e: BaseException) -> Steps[None]:
    try:
        if isinstance(e, errors.TerminalError):
            resp = e.response if isinstance(e.response, Response) else None
            try:
                yield call("fail", a.key, a.lease_token, retryable=False, error=str(e), response=resp)
            except errors.TooLarge:
                # Store the failure without its response rather than not at all.
                yield call("fail", a.key, a.lease_token, retryable=False, error=str(e))
        else:
            yield call("fail", a.key, a.lease_token, error=f"{type(e).__name__}: {e}")
    except errors.IdemError as ferr:
        e.add_note(f"idemsvc: failing the attempt: {ferr}")


def beat(held: Any) -> Steps[bool]:
    """One heartbeat of a held lease: an extend, retried only while the
    lease may still be live; whether to beat again. A lease taken over, or
    not extended before it ran out, is marked lost."""
    sent = time.monotonic()
    lease = held.lease
    try:
        yield call("extend", lease.key, lease.token, int(held.lease_s * 1000), budget=max(0.0, held.expires - sent))
    except (errors.LeaseLost, errors.NotFound) as e:
        if not held.stopped:
            held.lose(e)
        return False
    except errors.IdemError as e:
        if held.stopped:
            return False
        if time.monotonic() >= held.expires:
            held.lose(e)
            return False
    else:
        held.expires = sent + held.lease_s
    return not held.stopped
