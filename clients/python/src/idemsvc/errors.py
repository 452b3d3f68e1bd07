# SPDX-License-Identifier: Apache-2.0
"""The exceptions of idemsvc calls: one class per problem kind idemsvc answers.

Every answer of idemsvc that is an error is a :class:`ProblemError` of its
kind's class (``InProgress``, ``LeaseLost``, ...), read from the problem's
``code`` member, or else the last path segment of its ``type``. A call that
got no answer is :class:`Unreachable`. Both that and a 503 are
:class:`Unavailable`: the call may or may not have taken effect, and a retry
with the same owner or lease token is safe.
"""

from __future__ import annotations

import json
from typing import Any, Mapping


class IdemError(Exception):
    """Any error of an idemsvc call or of an operation run under idemsvc."""


class Unavailable(IdemError):
    """idemsvc could not be reached, or answered 503, until the retry budget ran out."""


class Unreachable(Unavailable):
    """The call got no answer (a refused or broken connection, a timeout)."""


class ProblemError(IdemError):
    """A problem detail (RFC 9457) that idemsvc answered."""

    kind = ""

    def __init__(self, status: int, problem: Mapping[str, Any], retry_after: float | None = None, op: str = ""):
        self.status = status
        self.problem = dict(problem)
        self.retry_after = retry_after  # seconds, from Retry-After
        self.op = op
        title = str(self.problem.get("title", ""))
        detail = str(self.problem.get("detail", ""))
        where = f"{op}: " if op else ""
        super().__init__(f"idemsvc: {where}{status} {title}: {detail}")

    @property
    def title(self) -> str:
        return str(self.problem.get("title", ""))

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail", ""))

    @property
    def type(self) -> str:
        return str(self.problem.get("type", ""))


class InvalidRequest(ProblemError):
    kind = "invalid-request"


class Unauthorized(ProblemError):
    kind = "unauthorized"


class Forbidden(ProblemError):
    kind = "forbidden"


class NotFound(ProblemError):
    kind = "not-found"


class MethodNotAllowed(ProblemError):
    kind = "method-not-allowed"


class UnsupportedMediaType(ProblemError):
    kind = "unsupported-media-type"


class TooLarge(ProblemError):
    kind = "too-large"


class InProgress(ProblemError):
    """Another caller holds the key; ``attempt`` and ``lease_expires_at`` say whose."""

    kind = "in-progress"

    @property
    def attempt(self) -> int | None:
        a = self.problem.get("attempt")
        return a if isinstance(a, int) else None

    @property
    def lease_expires_at(self) -> str | None:
        t = self.problem.get("lease_expires_at")
        return t if isinstance(t, str) else None


class LeaseLost(ProblemError):
    """The lease token is not the current attempt's: another caller took the key over."""

    kind = "lease-lost"


class FingerprintMismatch(ProblemError):
    kind = "fingerprint-mismatch"


class RateLimited(ProblemError):
    """A begin refused: the tenant is over its begin rate or its waiters."""

    kind = "rate-limited"


class QuotaExceeded(ProblemError):
    """A begin refused: the tenant is over its stored-bytes budget."""

    kind = "quota-exceeded"


class StoreUnavailable(ProblemError, Unavailable):
    kind = "store-unavailable"


class BlobUnavailable(ProblemError, Unavailable):
    kind = "blob-unavailable"


class InternalError(ProblemError):
    kind = "internal"


class UndocumentedAnswer(ProblemError):
    """An error answer that is not one of idemsvc's problems (a proxy's page, say)."""


PROBLEM_CLASSES: dict[str, type[ProblemError]] = {
    c.kind: c
    for c in (
        InvalidRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, UnsupportedMediaType, TooLarge,
        InProgress, LeaseLost, FingerprintMismatch, RateLimited, QuotaExceeded, StoreUnavailable,
        BlobUnavailable, InternalError,
    )
}


def problem_error(status: int, content_type: str, body: bytes, retry_after: float | None, op: str) -> ProblemError:
    """The exception of an error answer: its kind's class, by ``code`` or by ``type``."""
    problem: dict[str, Any] = {}
    if content_type.split(";")[0].strip().lower() == "application/problem+json":
        try:
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                problem = parsed
        except ValueError:
            pass
    return problem_of(status, problem, retry_after, op)


def problem_of(status: int, problem: Mapping[str, Any], retry_after: float | None, op: str) -> ProblemError:
    """The exception of a decoded problem (an error answer's, or a batch item's)."""
    kind = problem.get("code")
    if not isinstance(kind, str) or kind not in PROBLEM_CLASSES:
        t = problem.get("type")
        kind = t.rsplit("/", 1)[-1] if isinstance(t, str) else ""
    cls = PROBLEM_CLASSES.get(kind)
    if cls is None:
        if status == 503:
            cls = StoreUnavailable
        else:
            cls = UndocumentedAnswer
        if not problem.get("type"):
            problem = {"status": status, "title": f"HTTP {status}", "detail": "an answer idemsvc does not document"}
    return cls(status, problem, retry_after, op)


class Failed(IdemError):
    """A terminal failure, replayed from an earlier attempt or just stored.

    ``response`` is what the failed attempt stored for replay, ``error`` its
    message, ``attempt`` the attempt that failed, ``replayed`` whether it
    failed elsewhere (the operation did not run here).
    """

    def __init__(self, message: str, *, response: Any = None, attempt: int = 0, replayed: bool = False):
        super().__init__(f"idemsvc: failed terminally: {message}")
        self.error = message
        self.response = response
        self.attempt = attempt
        self.replayed = replayed


class TerminalError(Exception):
    """Raised by an operation to fail it terminally: the failure is stored and
    every later call for the key gets it (as :class:`Failed`) instead of
    running the operation again. Any other exception releases the key.

    ``response`` (an :class:`idemsvc.Response`, optional) is stored for replay.
    """

    def __init__(self, message: str, response: Any = None):
        super().__init__(message)
        self.response = response
