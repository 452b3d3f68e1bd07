# SPDX-License-Identifier: Apache-2.0
"""idemsvc's Python SDK: a client of the idempotency service (sync and
asyncio), the ``@idempotent`` decorator, a batch helper for queue
consumers (:func:`process_batch`), and WSGI and ASGI middleware.

    from idemsvc import idempotent

    @idempotent(key=lambda msg: msg["id"])
    def handle(msg): ...
"""

from ._protocol import BeginItem, FinishItem
from ._types import Acquired, Lease, Replay, Response, Result, current_lease
from .client import VERSION as __version__
from .client import Client
from .batch import Outcome, aprocess_batch, process_batch
from .decorator import JSONCodec, default_client, idempotent, payload_digest
from .errors import (
    BlobUnavailable, Failed, FingerprintMismatch, Forbidden, IdemError, InProgress, InternalError, InvalidRequest,
    LeaseLost, MethodNotAllowed, NotFound, ProblemError, QuotaExceeded, RateLimited, StoreUnavailable, TerminalError,
    TooLarge, Unauthorized, Unavailable, UndocumentedAnswer, Unreachable, UnsupportedMediaType,
)


def __getattr__(name: str) -> object:
    # The asyncio client imports httpx when it is there: only on demand.
    if name == "AsyncClient":
        from .aio import AsyncClient
        return AsyncClient
    raise AttributeError(name)


__all__ = [
    "Acquired", "AsyncClient", "BeginItem", "BlobUnavailable", "FinishItem", "Outcome", "aprocess_batch",
    "process_batch", "Client", "Failed", "FingerprintMismatch", "Forbidden",
    "IdemError", "InProgress", "InternalError", "InvalidRequest", "JSONCodec", "Lease", "LeaseLost",
    "MethodNotAllowed", "NotFound", "ProblemError", "QuotaExceeded", "RateLimited", "Replay", "Response", "Result",
    "StoreUnavailable", "TerminalError", "TooLarge", "Unauthorized", "Unavailable", "UndocumentedAnswer",
    "Unreachable", "UnsupportedMediaType", "__version__", "current_lease", "default_client", "idempotent",
    "payload_digest",
]
