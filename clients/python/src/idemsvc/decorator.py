# SPDX-License-Identifier: Apache-2.0
"""``@idempotent``: any function, sync or async, run at most once per key."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar, cast

from ._types import Response
from .canonical import canonical_json
from .client import DEFAULT_LEASE_MS, DEFAULT_WAIT_MS, Client

if TYPE_CHECKING:
    from .aio import AsyncClient

F = TypeVar("F", bound=Callable[..., Any])


class Codec(Protocol):
    """How a function's result is stored and read back."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JSONCodec:
    """Results as JSON (the default): dicts, lists, strings, numbers, booleans, None."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


_default_lock = threading.Lock()
_default_client: Client | None = None


def default_client() -> Client:
    """The client of ``IDEMSVC_URL`` (default ``http://127.0.0.1:8080``) with
    ``IDEMSVC_API_KEY``, made on first use and shared."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            _default_client = Client(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"),
                                     os.environ.get("IDEMSVC_API_KEY") or None)
        return _default_client


MAX_KEY_BYTES = 255


def stored_key(prefix: str, key: Any) -> str:
    """``<prefix>:<key>`` (the key alone for an empty prefix); a prefix too
    long for idemsvc's key limit goes by its digest."""
    k = key if isinstance(key, str) else str(key)
    full = f"{prefix}:{k}" if prefix else k
    if len(full.encode("utf-8")) > MAX_KEY_BYTES:
        full = hashlib.sha256(prefix.encode()).hexdigest()[:32] + ":" + k
    return full


def key_and_fingerprint(prefix: str, key: Any, digest: str | None, keyed: bool) -> tuple[str, str | None]:
    """The stored key and the begin's fingerprint of a call: the key is the
    payload's digest unless a key function gave one; then the digest, if
    any, is the fingerprint."""
    full = stored_key(prefix, key if keyed else digest)
    return full, ("sha256:" + digest if (digest is not None and keyed) else None)


def sync_client_of(client: Any) -> Client:
    """The client given (or a function's), else :func:`default_client`."""
    c = client() if callable(client) and not isinstance(client, Client) else client
    if c is None:
        c = default_client()
    if not isinstance(c, Client):
        raise TypeError("idemsvc: a synchronous function needs an idemsvc.Client")
    return c


def async_client_of(client: Any, cache: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]) -> AsyncClient:
    """The asyncio client given (or a function's); a synchronous one, or
    :func:`default_client`, as an asyncio client with its settings, one per
    event loop in cache: its connections belong to the loop."""
    from .aio import AsyncClient
    c = client() if callable(client) and not isinstance(client, (Client, AsyncClient)) else client
    if c is None:
        c = default_client()
    if isinstance(c, AsyncClient):
        return c
    loop = asyncio.get_running_loop()
    if loop not in cache:
        cache[loop] = AsyncClient.like(c)
    return cache[loop]  # type: ignore[no-any-return]


def payload_digest(value: Any) -> str:
    """The SHA-256 of a payload's canonical JSON (RFC 8785), in hex: the same
    for equal payloads whatever their member order. Objects that are not
    JSON (dataclasses, models) are taken by their ``__dict__``, or
    ``model_dump()`` / ``dict()`` where they have one."""
    return hashlib.sha256(canonical_json(_plain(value))).hexdigest()


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", errors="surrogateescape")
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    for method in ("model_dump", "dict", "_asdict"):
        m = getattr(v, method, None)
        if callable(m):
            return _plain(m())
    if hasattr(v, "__dict__"):
        return _plain({k: x for k, x in vars(v).items() if not k.startswith("_")})
    raise TypeError(f"idemsvc: {type(v).__name__} cannot be digested as a payload")


def idempotent(client: Any = None, *, key: Callable[..., str] | None = None, payload: str | None = None,
               prefix: str | None = None, codec: Codec | None = None, lease_ms: int = DEFAULT_LEASE_MS,
               retention_s: int | None = None, wait_ms: int = DEFAULT_WAIT_MS,
               terminal: tuple[type[BaseException], ...] = (),
               give_up_after: float | None = None) -> Callable[[F], F]:
    """Makes a function run at most once per key, across every process that
    calls it through idemsvc; a duplicate call returns the stored result.

    - ``key``: a function of the call's arguments that gives its key
      (``key=lambda order: order["id"]``); or
    - ``payload``: the name of an argument whose value is digested into the
      key (canonical JSON, SHA-256), as Powertools'
      ``idempotent_function(data_keyword_argument=...)`` does. With ``key``
      too, the digest is the begin's fingerprint: the same key with another
      payload raises :class:`~idemsvc.errors.FingerprintMismatch`.

    The stored key is ``<prefix>:<key>``; ``prefix`` defaults to the
    function's module and qualified name, and ``""`` uses the key as is. The
    result is stored with ``codec`` (JSON by default). An exception of a type
    in ``terminal`` (or :class:`~idemsvc.errors.TerminalError`) is stored,
    and every later call raises :class:`~idemsvc.errors.Failed`; any other
    releases the key and propagates. ``client`` is an
    :class:`idemsvc.Client` or :class:`idemsvc.AsyncClient`, or a function
    returning one (read at the first call); by default
    :func:`default_client`. Async functions get an asyncio client with the
    same settings.
    """
    if key is None and payload is None:
        raise TypeError("idempotent: give key= (a function of the arguments) or payload= (an argument's name)")
    store: Codec = codec or JSONCodec()

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        if payload is not None and payload not in sig.parameters:
            raise TypeError(f"idempotent: {fn.__qualname__} has no argument {payload!r}")
        name_prefix = f"{fn.__module__}.{fn.__qualname__}" if prefix is None else prefix

        def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str | None]:
            digest = None
            if payload is not None:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                digest = payload_digest(bound.arguments[payload])
            return key_and_fingerprint(name_prefix, key(*args, **kwargs) if key is not None else None, digest,
                                       key is not None)

        def encode(value: Any) -> Response:
            return Response(body=store.encode(value))

        def decode(resp: Response) -> Any:
            return store.decode(resp.body or b"")

        def as_terminal(e: BaseException) -> BaseException:
            from .errors import TerminalError
            if terminal and isinstance(e, terminal) and not isinstance(e, TerminalError):
                t = TerminalError(f"{type(e).__name__}: {e}")
                t.__cause__ = e
                return t
            return e

        if inspect.iscoroutinefunction(fn):
            aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

            def async_client() -> AsyncClient:
                return async_client_of(client, aclients)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                k, fp = key_of(args, kwargs)

                async def run() -> Response:
                    try:
                        return encode(await fn(*args, **kwargs))
                    except BaseException as e:
                        t = as_terminal(e)
                        if t is e:
                            raise
                        raise t from e

                res = await async_client().do(k, run, fingerprint=fp, lease_ms=lease_ms,
                                              retention_s=retention_s, wait_ms=wait_ms,
                                              give_up_after=give_up_after)
                return decode(res.response)

            return cast(F, async_wrapper)

        def sync_client() -> Client:
            return sync_client_of(client)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            k, fp = key_of(args, kwargs)

            def run() -> Response:
                try:
                    return encode(fn(*args, **kwargs))
                except BaseException as e:
                    t = as_terminal(e)
                    if t is e:
                        raise
                    raise t from e

            res = sync_client().do(k, run, fingerprint=fp, lease_ms=lease_ms, retention_s=retention_s,
                                   wait_ms=wait_ms, give_up_after=give_up_after)
            return decode(res.response)

        return cast(F, wrapper)

    return decorate
