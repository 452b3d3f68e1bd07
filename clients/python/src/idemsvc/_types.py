# SPDX-License-Identifier: Apache-2.0
"""The values calls take and give, shared by the sync and asyncio clients."""

from __future__ import annotations

import base64
import contextvars
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass
class Response:
    """What an operation produced, as idemsvc stores and replays it byte for
    byte. Every part is optional (a queue consumer may store only a body)."""

    status_code: int | None = None
    headers: dict[str, str] | None = None
    body: bytes | None = None

    def to_wire(self) -> dict[str, Any]:
        """The API's StoredResponse: a body that is not UTF-8 goes as base64."""
        out: dict[str, Any] = {}
        if self.status_code is not None:
            out["status_code"] = self.status_code
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.body is not None:
            try:
                out["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                out["body"] = base64.b64encode(self.body).decode("ascii")
                out["body_encoding"] = "base64"
        return out

    @classmethod
    def from_wire(cls, stored: Mapping[str, Any] | None) -> Response:
        stored = stored or {}
        body = stored.get("body")
        raw: bytes | None = None
        if isinstance(body, str):
            raw = base64.b64decode(body) if stored.get("body_encoding") == "base64" else body.encode("utf-8")
        headers = stored.get("headers")
        return cls(status_code=stored.get("status_code"), headers=dict(headers) if headers else None, body=raw)


@dataclass
class Acquired:
    """A begin that acquired the key: run the operation, then complete or fail."""

    key: str
    attempt: int
    lease_token: str
    lease_expires_at: str
    recovered: bool


@dataclass
class Replay:
    """A begin that found the key finished: replay, do not run the operation."""

    status: str  # "completed" or "failed"
    key: str
    attempt: int
    response: Response
    error: str | None = None
    completed_at: str | None = None
    failed_at: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def begin_result(status: int, body: Mapping[str, Any]) -> Acquired | Replay:
    if status == 201:
        return Acquired(key=body["key"], attempt=body["attempt"], lease_token=body["lease_token"],
                        lease_expires_at=body["lease_expires_at"], recovered=bool(body.get("recovered")))
    return Replay(status=body["status"], key=body["key"], attempt=body["attempt"],
                  response=Response.from_wire(body.get("response")), error=body.get("error"),
                  completed_at=body.get("completed_at"), failed_at=body.get("failed_at"))


@dataclass
class Result:
    """The outcome of ``do``: the operation's, or the stored one of an earlier call."""

    response: Response
    replayed: bool  # the operation did not run here
    attempt: int  # the attempt that produced the outcome


@dataclass
class Lease:
    """The lease an operation runs under, as :func:`current_lease` gives it.

    ``lost`` is set when the lease was lost (another caller took the key
    over, or it could not be extended before it ran out): a long operation
    may check it and stop. ``attempt`` increases with every acquisition, so it
    may serve as a fencing token for the operation's own storage.
    """

    key: str
    attempt: int
    token: str
    recovered: bool
    lost: threading.Event = field(default_factory=threading.Event)
    lost_reason: BaseException | None = None


_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("idemsvc_lease", default=None)


def current_lease() -> Lease | None:
    """The lease of the operation running in this thread or task, if any."""
    return _current.get()


def new_owner() -> str:
    """A random owner for a begin, so that its retries get the lease it may already have."""
    return "idem-py-" + os.urandom(16).hex()


MAX_ERROR_BYTES = 1024


def short_message(msg: str) -> str:
    """msg cut to idemsvc's longest failure message, at a character boundary."""
    raw = msg.encode("utf-8")
    if len(raw) <= MAX_ERROR_BYTES:
        return msg
    return raw[:MAX_ERROR_BYTES].decode("utf-8", errors="ignore")
