# SPDX-License-Identifier: Apache-2.0
"""The batch helper for queue consumers: a batch of records costs two calls
to idemsvc, one begin batch and one finish batch, not two per record.

    outcomes = process_batch(event["Records"], handle, key=lambda r: r["messageId"])
    return {"batchItemFailures": [{"itemIdentifier": o.record["messageId"]} for o in outcomes if o.retry]}

Every record gets an :class:`Outcome`, in the records' order:

=============== =============================================== ======= =========
status          what happened                                   ``ok``  ``retry``
=============== =============================================== ======= =========
``completed``   the function ran here; its result is stored     yes     no
``replayed``    done before (or earlier in this batch): the     yes     no
                stored result, the function did not run
``failed``      a terminal failure, stored now or before:       no      no
                every later delivery gets it too
``in_progress`` another consumer holds the record's key now     no      yes
``error``       the function raised (the key is released), or   no      yes
                idemsvc could not take the record now (rate
                limit, unavailable, lease lost): a redelivery
                runs it, or replays what the other consumer
                stored
``rejected``    idemsvc refuses the record as it is (another    no      no
                payload under its key, a key too long): a
                redelivery gets the same answer
=============== =============================================== ======= =========

``retry`` says: leave the message unacknowledged (an SQS
``batchItemFailures`` entry, a Kafka offset not committed) so the broker
delivers it again. A record in progress elsewhere is not waited for: a
batch never waits, and its consumer may still finish it.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from . import _steps as steps
from . import errors
from ._protocol import BeginItem, BeginOutcome, FinishItem, FinishOutcome
from ._steps import Steps, call
from ._types import Acquired, Replay, Response, _current
from .client import DEFAULT_LEASE_MS
from .decorator import Codec, JSONCodec, async_client_of, key_and_fingerprint, payload_digest, sync_client_of

R = TypeVar("R")

COMPLETED, REPLAYED, FAILED = "completed", "replayed", "failed"
IN_PROGRESS, ERROR, REJECTED = "in_progress", "error", "rejected"

# Item problems a redelivery may not meet again.
_TRANSIENT: tuple[type[BaseException], ...] = (
    errors.InProgress, errors.RateLimited, errors.QuotaExceeded, errors.Unavailable, errors.LeaseLost,
    errors.NotFound, errors.InternalError,
)
# A complete refused for its response: the attempt is failed terminally instead.
_UNSTORABLE: tuple[type[BaseException], ...] = (errors.TooLarge, errors.InvalidRequest)


@dataclass
class Outcome(Generic[R]):
    """What became of one record (see the module's table)."""

    record: R
    key: str
    status: str
    value: Any = None  # the function's result, new or replayed (also kept when it could not be stored)
    error: BaseException | None = None
    attempt: int = 0  # the attempt that produced the outcome; 0 when none began

    @property
    def ok(self) -> bool:
        """Done, here or before: acknowledge the message."""
        return self.status in (COMPLETED, REPLAYED)

    @property
    def retry(self) -> bool:
        """Leave the message unacknowledged: a redelivery may get another outcome."""
        return self.status in (IN_PROGRESS, ERROR)


@dataclass
class _Run:
    index: int
    acquired: Acquired
    held: Any = None
    finish: FinishItem | None = None
    value: Any = None
    error: BaseException | None = None


@dataclass
class _Plan(Generic[R]):
    """One chunk of records, from its keys to its outcomes, without I/O: the
    sync and asyncio helpers make its calls."""

    records: Sequence[R]
    keys: list[str]
    fingerprints: list[str | None]
    codec: Codec
    lease_ms: int
    retention_s: int | None
    terminal: tuple[type[BaseException], ...]
    outcomes: list[Outcome[R] | None] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)  # the first record of each key, begun
    runs: list[_Run] = field(default_factory=list)

    def begin_items(self) -> list[BeginItem]:
        self.outcomes = [None] * len(self.records)
        seen: set[str] = set()
        for i, k in enumerate(self.keys):
            if k not in seen:
                seen.add(k)
                self.firsts.append(i)
        return [BeginItem(self.keys[i], fingerprint=self.fingerprints[i], lease_ms=self.lease_ms,
                          retention_s=self.retention_s) for i in self.firsts]

    def set(self, i: int, status: str, value: Any = None, error: BaseException | None = None,
            attempt: int = 0) -> None:
        self.outcomes[i] = Outcome(self.records[i], self.keys[i], status, value, error, attempt)

    def begun(self, results: Sequence[BeginOutcome]) -> list[_Run]:
        """The records acquired, to run; the others' outcomes."""
        for i, r in zip(self.firsts, results):
            if isinstance(r, Acquired):
                self.runs.append(_Run(i, r))
            elif isinstance(r, Replay):
                if r.failed:
                    self.set(i, FAILED, None, errors.Failed(r.error or "", response=r.response, attempt=r.attempt,
                                                            replayed=True), r.attempt)
                    continue
                try:
                    value = self.codec.decode(r.response.body or b"")
                except Exception as e:
                    self.set(i, REJECTED, None, e, r.attempt)
                    continue
                self.set(i, REPLAYED, value, None, r.attempt)
            else:
                self.problem(i, r)
        return self.runs

    def problem(self, i: int, e: BaseException, value: Any = None, attempt: int = 0) -> None:
        status = IN_PROGRESS if isinstance(e, errors.InProgress) else ERROR if isinstance(e, _TRANSIENT) else REJECTED
        self.set(i, status, value, e, attempt)

    def unreachable(self, e: errors.IdemError) -> None:
        """The begin batch got no answer, or was refused for now (503, 429,
        after the retry budget): every record is tried again later."""
        for i in self.firsts:
            self.set(i, ERROR, None, e)

    def ran(self, run: _Run, value: Any = None, exc: BaseException | None = None) -> None:
        """The finish of a record that ran: its result, or its exception's failure."""
        a = run.acquired
        if exc is None:
            run.value = value
            try:
                body = self.codec.encode(value)
            except Exception as e:
                exc = errors.TerminalError(f"the result could not be encoded: {type(e).__name__}: {e}")
                exc.__cause__ = e
            else:
                run.finish = FinishItem(a.key, a.lease_token, Response(body=body), retention_s=self.retention_s)
                return
        if self.terminal and isinstance(exc, self.terminal) and not isinstance(exc, errors.TerminalError):
            t = errors.TerminalError(f"{type(exc).__name__}: {exc}")
            t.__cause__ = exc
            exc = t
        run.error = exc
        if isinstance(exc, errors.TerminalError):
            resp = exc.response if isinstance(exc.response, Response) else None
            run.finish = FinishItem(a.key, a.lease_token, resp, fail=True, retryable=False, error=str(exc))
        else:
            run.finish = FinishItem(a.key, a.lease_token, fail=True, error=f"{type(exc).__name__}: {exc}")

    def finish_items(self) -> list[FinishItem]:
        return [r.finish for r in self.runs if r.finish is not None]

    def finished(self, results: Sequence[FinishOutcome]) -> list[tuple[_Run, FinishItem]]:
        """The outcomes of the records that ran; the follow-ups: a terminal
        failure for each result that could not be stored, as :meth:`Client.do` does."""
        again: list[tuple[_Run, FinishItem]] = []
        for run, r in zip([r for r in self.runs if r.finish is not None], results):
            f, a = run.finish, run.acquired
            assert f is not None
            if isinstance(r, errors.ProblemError):
                if isinstance(r, _UNSTORABLE) and not (f.fail and f.retryable):
                    msg = (f"the response could not be stored: {r}" if not f.fail else f.error or "")
                    again.append((run, FinishItem(a.key, a.lease_token, fail=True, retryable=False, error=msg)))
                    run.error = errors.Failed(msg, response=f.response, attempt=a.attempt)
                    run.error.__cause__ = r
                    continue
                self.problem(run.index, r, run.value, a.attempt)
            elif not f.fail:
                self.set(run.index, COMPLETED, run.value, None, a.attempt)
            elif f.retryable:
                self.set(run.index, ERROR, None, run.error, a.attempt)
            else:
                self.failed(run)
        return again

    def failed(self, run: _Run) -> None:
        a, e = run.acquired, run.error
        if not isinstance(e, errors.Failed):
            resp = e.response if isinstance(e, errors.TerminalError) else None
            failed = errors.Failed(str(e), response=resp, attempt=a.attempt)
            failed.__cause__ = e
            e = failed
        self.set(run.index, FAILED, None, e, a.attempt)

    def refinished(self, again: Sequence[tuple[_Run, FinishItem]], results: Sequence[FinishOutcome]) -> None:
        for (run, _), r in zip(again, results):
            if isinstance(r, errors.ProblemError):
                self.problem(run.index, r, run.value, run.acquired.attempt)
            else:
                self.failed(run)

    def unfinished(self, e: errors.IdemError, runs: Iterable[_Run]) -> None:
        """A finish batch that got no answer: the leases run out, and a
        redelivery runs the records again (or replays them, had it landed)."""
        for run in runs:
            self.set(run.index, ERROR, run.value, e, run.acquired.attempt)

    def result(self) -> list[Outcome[R]]:
        """Every record's outcome; a record whose key came earlier in the
        batch shares that one's (a ``completed`` one as ``replayed``)."""
        first: dict[str, tuple[int, Outcome[R]]] = {}
        out: list[Outcome[R]] = []
        for i, o in enumerate(self.outcomes):
            if o is None:
                j, f = first[self.keys[i]]
                if self.fingerprints[i] != self.fingerprints[j]:
                    # Another payload under the same key, as idemsvc would answer it.
                    e = errors.FingerprintMismatch(422, {
                        "title": "Fingerprint mismatch", "code": "fingerprint-mismatch",
                        "detail": "the key was used earlier in this batch with another payload"}, None, "begin batch")
                    o = Outcome(self.records[i], f.key, REJECTED, None, e, 0)
                else:
                    o = Outcome(self.records[i], f.key, REPLAYED if f.status == COMPLETED else f.status, f.value,
                                f.error, f.attempt)
            else:
                first.setdefault(o.key, (i, o))
            out.append(o)
        return out


def _plans(records: Sequence[R], fn: Callable[..., Any], key: Callable[[R], Any] | None,
           payload: Callable[[R], Any] | None, prefix: str | None, codec: Codec | None, lease_ms: int,
           retention_s: int | None, terminal: tuple[type[BaseException], ...], batch_size: int) -> list[_Plan[R]]:
    if key is None and payload is None:
        raise TypeError("process_batch: give key= (a function of a record) or payload= (a function giving what to digest)")
    if batch_size < 1:
        raise ValueError("process_batch: batch_size must be at least 1")
    name_prefix = f"{fn.__module__}.{fn.__qualname__}" if prefix is None else prefix
    keys, fps = [], []
    for rec in records:
        digest = payload_digest(payload(rec)) if payload is not None else None
        k, fp = key_and_fingerprint(name_prefix, key(rec) if key is not None else None, digest, key is not None)
        keys.append(k)
        fps.append(fp)
    return [_Plan(records[s:s + batch_size], keys[s:s + batch_size], fps[s:s + batch_size], codec or JSONCodec(),
                  lease_ms, retention_s, terminal) for s in range(0, len(records), batch_size)]


def process_batch(records: Sequence[R], fn: Callable[[R], Any], *, key: Callable[[R], Any] | None = None,
                  payload: Callable[[R], Any] | None = None, client: Any = None, prefix: str | None = None,
                  codec: Codec | None = None, lease_ms: int = DEFAULT_LEASE_MS, retention_s: int | None = None,
                  terminal: tuple[type[BaseException], ...] = (), batch_size: int = 100) -> list[Outcome[R]]:
    """Runs ``fn(record)`` at most once per key across every consumer, for
    the records this call acquires, one after another, and returns every
    record's :class:`Outcome` in order. Each ``batch_size`` records (idemsvc's
    batch size, 100 by default) cost one begin batch and one finish batch
    (split further only when the results together outgrow idemsvc's
    request limit);
    while ``fn`` runs, the leases of the chunk's records are extended every
    lease/3 (one extend per lease, only for work longer than that).

    ``key`` gives a record's key (``lambda r: r["messageId"]``); ``payload``
    gives what of a record to digest (canonical JSON, SHA-256), as the
    decorator's ``payload=``: the key when there is no ``key``, else the
    fingerprint. ``prefix``, ``codec``, ``terminal`` and ``client`` are the
    decorator's options; a record's exception of a ``terminal`` type (or
    :class:`~idemsvc.errors.TerminalError`) is stored as its failure, any
    other releases its key. Records with the same key run once: the later
    ones are ``replayed``. An exception that is not an :class:`Exception`
    (KeyboardInterrupt, say) releases every lease not yet finished and is
    raised. Raised too: a batch call's error other than
    :class:`~idemsvc.errors.Unavailable` (a refused API key, say); when
    idemsvc is unavailable, the records are reported as ``error``.
    """
    c = sync_client_of(client)
    out: list[Outcome[R]] = []
    for plan in _plans(records, fn, key, payload, prefix, codec, lease_ms, retention_s, terminal, batch_size):
        out.extend(steps.drive(_chunk(plan, fn, lease_ms), c))
    return out


def _chunk(plan: _Plan[R], fn: Callable[[R], Any], lease_ms: int) -> Steps[list[Outcome[R]]]:
    """One chunk: a begin batch, fn for each record acquired (its lease
    held), a finish batch."""
    try:
        runs = plan.begun((yield call("begin_batch", plan.begin_items())))
    except errors.IdemError as e:
        if not _for_now(e):
            raise
        plan.unreachable(e)
        runs = []
    for run in runs:
        run.held = yield call("hold", run.acquired, lease_ms)
    try:
        for run in runs:
            token = _current.set(run.held.lease)
            try:
                value = yield call("invoke", fn, plan.records[run.index])
            except Exception as e:
                plan.ran(run, exc=e)
            else:
                plan.ran(run, value)
            finally:
                _current.reset(token)
    except BaseException as e:
        # Interrupted (KeyboardInterrupt, a cancelled task): what ran is
        # finished, what did not is released.
        for run in runs:
            if run.finish is None:
                plan.ran(run, exc=e if isinstance(e, Exception) else RuntimeError(f"interrupted: {type(e).__name__}"))
        yield call("shielded", _finish(plan, runs))
        raise
    yield call("shielded", _finish(plan, runs))
    return plan.result()


def _for_now(e: errors.IdemError) -> bool:
    """A batch call's error that a later delivery may not meet: no answer,
    or 503 or 429 (idemsvc's or a gateway's) until the retry budget ran out."""
    return isinstance(e, errors.Unavailable) or (isinstance(e, errors.ProblemError) and e.status in (429, 503))


def _finish_split(items: Sequence[FinishItem]) -> Steps[list[FinishOutcome]]:
    """finish_batch, split in halves while idemsvc refuses the whole request
    as too large (results that together outgrow its request limit); an item
    refused alone gets that problem as its outcome."""
    try:
        return (yield call("finish_batch", items))  # type: ignore[no-any-return]
    except errors.TooLarge as e:
        if len(items) == 1:
            return [e]
        h = len(items) // 2
        return (yield from _finish_split(items[:h])) + (yield from _finish_split(items[h:]))


def _finish(plan: _Plan[R], runs: Sequence[_Run]) -> Steps[None]:
    try:
        items = plan.finish_items()
        if items:
            again = plan.finished((yield from _finish_split(items)))
            if again:
                plan.refinished(again, (yield from _finish_split([f for _, f in again])))
    except errors.IdemError as e:
        if not _for_now(e):
            raise
        plan.unfinished(e, [r for r in runs if plan.outcomes[r.index] is None])
    except BaseException:
        for run in runs:
            yield call("release", run.held)
        raise
    for run in runs:
        yield call("release", run.held)


_aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


async def aprocess_batch(records: Sequence[R], fn: Callable[[R], Any], *, key: Callable[[R], Any] | None = None,
                         payload: Callable[[R], Any] | None = None, client: Any = None, prefix: str | None = None,
                         codec: Codec | None = None, lease_ms: int = DEFAULT_LEASE_MS, retention_s: int | None = None,
                         terminal: tuple[type[BaseException], ...] = (), batch_size: int = 100) -> list[Outcome[R]]:
    """:func:`process_batch` for asyncio: ``fn`` may be a coroutine
    function; the records it acquires run one after another. ``client`` is
    an :class:`idemsvc.AsyncClient` (a :class:`idemsvc.Client` is taken as
    an asyncio client with its settings, one per event loop). Cancelling it
    releases every lease not yet finished."""
    c = async_client_of(client, _aclients)
    out: list[Outcome[R]] = []
    for plan in _plans(records, fn, key, payload, prefix, codec, lease_ms, retention_s, terminal, batch_size):
        out.extend(await steps.adrive(_chunk(plan, fn, lease_ms), c))
    return out
