# SPDX-License-Identifier: Apache-2.0
"""What the WSGI and ASGI middleware share, as the Go SDK's middleware has
it (clients/go/middleware.go): the settings, the key header's parsing, the
fingerprint, the answers the middleware writes itself, and which of the
application's answers are stored."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from datetime import datetime, timezone
from http import HTTPStatus
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import errors
from ._steps import BODY_OMITTED_HEADER as BODY_OMITTED_HEADER
from ._types import Replay, Response
from .canonical import canonicalize

REPLAYED_HEADER = "Idempotent-Replayed"
DEFAULT_STORED_HEADERS = ("Content-Type", "Content-Language", "Location", "ETag", "Last-Modified")
MAX_KEY_BYTES = 255
PROBLEM_TYPE_PREFIX = "https://idemsvc.dev/problems/"
TITLES = {
    "invalid-request": "Invalid request", "too-large": "Too large", "in-progress": "In progress",
    "fingerprint-mismatch": "Fingerprint mismatch", "rate-limited": "Rate limited",
    "quota-exceeded": "Quota exceeded", "store-unavailable": "Store unavailable", "internal": "Internal error",
}


@dataclass
class Settings:
    """The middleware's options; see :class:`idemsvc.wsgi.IdempotencyMiddleware`."""

    key_header: str = "Idempotency-Key"
    methods: Sequence[str] = ("POST", "PATCH")
    optional: bool = False
    headers: Sequence[str] | None = None  # None: DEFAULT_STORED_HEADERS
    lease_ms: int = 30_000
    retention_s: int | None = None
    wait_ms: int = 0
    max_body_bytes: int = 1 << 20
    max_stored_body_bytes: int = 1 << 20
    budget_s: float = 2.0
    scope: Callable[[Any], str | None] | None = None
    credential_cookies: Sequence[str] = ()
    credential_secret: bytes | str | None = None
    unscoped: bool = False
    legacy_fingerprints: bool = True
    method_set: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        if self.scope is not None and self.unscoped:
            raise ValueError("idemsvc: scope and unscoped contradict each other: set one")
        # Requests name methods in upper case: a configured "post" is POST.
        self.methods = tuple(m.upper() for m in self.methods)
        self.method_set = frozenset(self.methods)
        self.headers = DEFAULT_STORED_HEADERS if self.headers is None else tuple(self.headers)
        self.credential_cookies = tuple(self.credential_cookies)
        if isinstance(self.credential_secret, str):
            self.credential_secret = self.credential_secret.encode("utf-8")
        if self.lease_ms <= 0:
            self.lease_ms = 30_000
        if self.max_body_bytes <= 0:
            self.max_body_bytes = 1 << 20
        if self.max_stored_body_bytes <= 0:
            self.max_stored_body_bytes = 1 << 20
        if self.budget_s <= 0:
            self.budget_s = 2.0


def credential_key_of(s: Settings, client_config: dict[str, Any]) -> bytes:
    """The key of the credentials' digest: from credential_secret, or else
    the client's API key, as the Go SDK's middleware derives it."""
    secret = s.credential_secret
    if secret is None:
        secret = client_config.get("api_key") or ""
    return credential_key(secret.encode("utf-8") if isinstance(secret, str) else secret)


def parse_key(values: list[str]) -> str | None:
    """The key in the key header's values: one Structured Field String (RFC
    8941: ``"abc"``, with ``\\"`` and ``\\\\`` escapes, printable ASCII), or
    a bare token, accepted as the same key for compatibility. An empty key,
    a malformed string, several values and an over-long key give None."""
    if len(values) != 1:
        return None
    v = values[0].strip(" \t")
    if not v.startswith('"'):
        ok = v != "" and len(v) <= MAX_KEY_BYTES and not any(c in v for c in '",\\')
        return v if ok else None
    out: list[str] = []
    i = 1
    while i < len(v):
        c = v[i]
        if c == "\\":
            if i + 1 == len(v) or v[i + 1] not in '"\\':
                return None
            i += 1
            out.append(v[i])
        elif c == '"':
            key = "".join(out)
            return key if i == len(v) - 1 and key != "" and len(key) <= MAX_KEY_BYTES else None
        elif c < " " or c > "~":
            return None
        else:
            out.append(c)
        i += 1
    return None  # no closing quote


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON: application/json or
    application/<anything>+json, in any case, with or without parameters."""
    if not content_type:
        return False
    mt = content_type.split(";", 1)[0].strip(" \t").lower()
    if not mt.startswith("application/"):
        return False
    sub = mt[len("application/"):]
    return sub == "json" or (sub.endswith("+json") and len(sub) > len("+json"))


# The fingerprint's version: records stored by the SDKs' earlier
# versions hold "sha256:..." (legacy_fingerprint).
FINGERPRINT_PREFIX = "v2:sha256:"


def _target(h: Any, method: str, path: bytes, query: bytes) -> None:
    h.update(method.encode("ascii"))
    h.update(b"\0")
    h.update(path)
    h.update(b"?")
    h.update(query)
    h.update(b"\0")


def fingerprint(method: str, path: bytes, query: bytes, content_type: str | None, body: bytes,
                credentials: bytes | None) -> str:
    """The request's fingerprint, byte for byte the Go and TypeScript SDKs':
    ``v2:sha256:`` and the hex SHA-256 of the method, NUL, the decoded path,
    ``?``, the raw query, NUL, the hex digest of the caller's credentials
    (empty without one), NUL, and the body: the RFC 8785 canonical form of a
    JSON body that is one I-JSON value, the raw bytes of any other."""
    if is_json(content_type):
        canon = canonicalize(body)
        if canon is not None:
            body = canon
    h = hashlib.sha256()
    _target(h, method, path, query)
    if credentials:
        h.update(credentials.hex().encode("ascii"))
    h.update(b"\0")
    h.update(body)
    return FINGERPRINT_PREFIX + h.hexdigest()


def legacy_fingerprint(method: str, path: bytes, query: bytes, body: bytes) -> str:
    """The fingerprint of the SDKs' versions before fingerprints had a
    version (method, path, query, raw body): after a mismatch the middleware
    looks the record up, and replays it when it holds this fingerprint, so
    that records stored by a service on those versions replay until they
    expire (legacy_answer)."""
    h = hashlib.sha256()
    _target(h, method, path, query)
    h.update(body)
    return "sha256:" + h.hexdigest()


CREDENTIAL_KEY_LABEL = b"idemsvc middleware credentials"


def credential_key(secret: bytes) -> bytes:
    """The key of the credentials' digest: HMAC-SHA256 of a label under a
    secret (by default the client's API key), so that the digest is the same
    on every replica of a service, in any language, and means nothing to
    idemsvc."""
    return hmac.new(secret, CREDENTIAL_KEY_LABEL, hashlib.sha256).digest()


def credential_digest(key: bytes, authorization: str | None, cookie_headers: list[str],
                      cookie_names: Sequence[str]) -> bytes | None:
    """An HMAC-SHA256, under key, of the request's credentials: the
    Authorization header's value, then, for each configured cookie name and
    each cookie of that name in the Cookie header(s) in order, NUL, name,
    ``=`` and value. None for a request that carries none of them."""
    mac: Any = None

    def write(b: bytes) -> None:
        nonlocal mac
        if mac is None:
            mac = hmac.new(key, digestmod=hashlib.sha256)
        mac.update(b)

    if authorization:
        write(authorization.encode("latin-1"))
    if cookie_names and cookie_headers:
        pairs = "; ".join(cookie_headers).split(";")
        for name in cookie_names:
            for pair in pairs:
                n, eq, v = pair.strip(" \t").partition("=")
                if eq and n == name:
                    write(b"\0" + n.encode("latin-1") + b"=" + v.encode("latin-1"))
    return None if mac is None else bytes(mac.digest())


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def stored_key_of(s: Settings, request: Any, key: str) -> tuple[str | None, bool]:
    """The key stored for a request's key, and whether its credentials'
    digest joins the fingerprint: with a ``scope``, the key scoped to the
    subject it names (None for a key that cannot be scoped), and an
    anonymous request (no subject) shares one scope, with its credentials
    in the fingerprint, as without a scope."""
    if s.scope is None:
        return key, not s.unscoped
    subject = s.scope(request)
    return scoped_key(subject, key), not subject


UNSCOPABLE_KEY = "idempotency key: key must be visible ASCII (0x21-0x7E)"


def scoped_key(scope: str | None, key: str) -> str | None:
    """The key stored for key of the end user scope: ``~``, the unpadded
    base64url SHA-256 of the scope, ``~`` and the key; or, when that would be
    over idemsvc's 255 bytes, ``#`` and the key's own digest in place of
    ``~`` and the key (the Go SDK's construction). None for a key with a
    byte idemsvc refuses (outside visible ASCII)."""
    if any(c < "!" or c > "~" for c in key):
        return None
    prefix = "~" + _b64(hashlib.sha256((scope or "").encode("utf-8")).digest())
    if len(prefix) + 1 + len(key) <= MAX_KEY_BYTES:
        return prefix + "~" + key
    return prefix + "#" + _b64(hashlib.sha256(key.encode("ascii")).digest())


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def retry_again(status: int) -> bool:
    """An answer not to store, so that a retry runs the handler again: a
    server error, 408 Request Timeout and 429 Too Many Requests."""
    return status >= 500 or status == 408 or status == 429


@dataclass
class Answer:
    """An answer the middleware writes itself: a problem or a replay."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def problem(kind: str, status: int, detail: str, retry_after: int = 0) -> Answer:
    headers = [("Content-Type", "application/problem+json")]
    if retry_after > 0:
        headers.append(("Retry-After", str(retry_after)))
    body = json.dumps({"type": PROBLEM_TYPE_PREFIX + kind, "title": TITLES.get(kind, kind), "status": status,
                       "detail": detail, "code": kind}).encode() + b"\n"
    return Answer(status, headers, body)


def mismatch_answer() -> Answer:
    return problem("fingerprint-mismatch", 422, "the idempotency key was used for another request")


def begin_error_answer(e: BaseException) -> Answer:
    """The answer for a begin that neither acquired the key nor replayed."""
    if isinstance(e, errors.InProgress):
        ra = int(e.retry_after) if e.retry_after else 1
        return problem("in-progress", 409, "a request with this idempotency key is in progress", ra)
    if isinstance(e, errors.FingerprintMismatch):
        return mismatch_answer()
    if isinstance(e, (errors.RateLimited, errors.QuotaExceeded)):
        # Over this service's limits at idemsvc: the handler did not run.
        return problem(e.kind, 429, "this service is over its limits at the idempotency service",
                       max(1, int(e.retry_after or 0)))
    if isinstance(e, errors.InvalidRequest):
        return problem("invalid-request", 400, "idempotency key: " + e.detail)
    if isinstance(e, (errors.Unauthorized, errors.Forbidden)):
        # A misconfigured API key: retrying will not help.
        return problem("internal", 500, "the idempotency service refused this service's credentials")
    # Fail closed: without idemsvc, nothing may run.
    return problem("store-unavailable", 503, "the idempotency service cannot be reached", 1)


def legacy_answer(record: dict[str, Any] | None, legacy: str) -> Answer:
    """The answer to a request whose v2 fingerprint the key's record does
    not hold, from that record (status with its response; None when there
    is none): its stored answer, written as a begin's replay, when it holds
    legacy (the request's fingerprint of the SDKs' earlier versions) and is
    completed or failed terminally; 409 while such a record is in progress;
    422 otherwise. The record is only read, never acquired, so the legacy
    fingerprint never gets into a new record, where it would replay to any
    caller."""
    if record is None or record.get("fingerprint") != legacy:
        return mismatch_answer()
    state = record.get("state")
    if state == "completed" or (state == "failed" and record.get("retryable") is False):
        return replay_answer(Replay(status=state, key=record.get("key", ""), attempt=record.get("attempt", 0),
                                    response=Response.from_wire(record.get("response")), error=record.get("error")))
    if state == "in_progress":
        retry = 1
        try:
            left = (datetime.fromisoformat(record["lease_expires_at"]) - datetime.now(timezone.utc)).total_seconds()
            retry = max(1, math.ceil(left))
        except (KeyError, TypeError, ValueError):
            pass  # no lease end given: 1 s
        return problem("in-progress", 409, "a request with this idempotency key is in progress", retry)
    return mismatch_answer()  # a retryable failure: a new attempt would acquire it


def replay_answer(r: Replay) -> Answer:
    resp = r.response
    if r.failed and resp.status_code is None:
        # A failure stored without a response: the operation ran, and its
        # outcome is unknown here.
        a = problem("internal", 500, "the first request with this idempotency key failed")
        a.headers.append((REPLAYED_HEADER, "true"))
        return a
    headers = list((resp.headers or {}).items())
    headers.append((REPLAYED_HEADER, "true"))
    return Answer(resp.status_code or 200, headers, resp.body or b"")


def stored_headers(allowed: Sequence[str] | None, headers: list[tuple[str, str]]) -> dict[str, str] | None:
    """The allow-listed headers of an answer (None: the default list);
    several fields of one name are one field, their values joined."""
    out: dict[str, str] = {}
    for name in DEFAULT_STORED_HEADERS if allowed is None else allowed:
        low = name.lower()
        values = [v for k, v in headers if k.lower() == low]
        if values and ", ".join(values):
            out[name] = ", ".join(values)
    return out or None
