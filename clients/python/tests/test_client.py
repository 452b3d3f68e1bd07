# SPDX-License-Identifier: Apache-2.0
"""The synchronous client and @idempotent against a real idemsvc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import idemsvc
from harness import LIMITED_KEY, LosingProxy, Svc, unique_key
from idemsvc import Acquired, Client, Replay, Response, current_lease, idempotent

SRC = Path(__file__).resolve().parents[1] / "src"


def client_of(svc: Svc, **kw: object) -> Client:
    return Client(svc.base_url, svc.api_key, **kw)  # type: ignore[arg-type]


def test_begin_complete_replay(svc: Svc) -> None:
    c = client_of(svc)
    key = unique_key()
    a = c.begin(key, fingerprint="fp1")
    assert isinstance(a, Acquired) and a.attempt == 1 and not a.recovered
    body = bytes(range(256))  # not UTF-8: travels as base64
    c.complete(key, a.lease_token, Response(201, {"Content-Type": "application/octet-stream"}, body))
    r = c.begin(key, fingerprint="fp1")
    assert isinstance(r, Replay) and r.status == "completed" and r.attempt == 1
    assert r.response == Response(201, {"Content-Type": "application/octet-stream"}, body)
    with pytest.raises(idemsvc.FingerprintMismatch) as e:
        c.begin(key, fingerprint="fp2")
    assert e.value.status == 422 and e.value.kind == "fingerprint-mismatch"


def test_typed_errors(svc: Svc) -> None:
    c = client_of(svc)
    key = unique_key()
    first = c.begin(key)
    assert isinstance(first, Acquired)
    c.fail(key, first.lease_token)  # retryable: released
    a = c.begin(key)
    assert isinstance(a, Acquired) and a.attempt == 2
    with pytest.raises(idemsvc.InProgress) as ip:
        c.begin(key)
    assert ip.value.attempt == 2 and ip.value.retry_after is not None and ip.value.lease_expires_at
    with pytest.raises(idemsvc.LeaseLost):
        c.complete(key, first.lease_token)  # an earlier attempt's token is fenced off
    with pytest.raises(idemsvc.NotFound):
        c.status(unique_key())
    with pytest.raises(idemsvc.InvalidRequest):
        c.begin("bad key with spaces")
    with pytest.raises(idemsvc.Unauthorized):
        Client(svc.base_url, "wrong").begin(unique_key())
    c.fail(key, a.lease_token, retryable=False, error="declined", response=Response(body=b"no"))
    r = c.begin(key)
    assert isinstance(r, Replay) and r.failed and r.error == "declined" and r.response.body == b"no"
    with pytest.raises(idemsvc.Failed) as f:
        c.do(key, lambda: Response(body=b"never"))
    assert f.value.replayed and f.value.error == "declined"


def test_unreachable_within_budget() -> None:
    from harness import free_port
    c = Client(f"http://127.0.0.1:{free_port()}", "k", retry_budget=0.3)
    started = time.monotonic()
    with pytest.raises(idemsvc.Unreachable) as e:
        c.begin(unique_key())
    assert isinstance(e.value, idemsvc.Unavailable)
    assert 0.1 < time.monotonic() - started < 2


def test_fifty_threads_one_key_run_once(svc: Svc) -> None:
    c = client_of(svc)
    runs = []
    lock = threading.Lock()

    @idempotent(c, key=lambda order: order["id"])
    def charge(order: dict[str, object]) -> dict[str, object]:
        with lock:
            runs.append(1)
        time.sleep(0.3)
        return {"charged": order["amount"], "run": len(runs), "token": os.urandom(4).hex()}

    order = {"id": unique_key("order"), "amount": 100}
    start = threading.Barrier(50)

    def call() -> dict[str, object]:
        start.wait()
        return charge(order)  # type: ignore[no-any-return]

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: call(), range(50)))
    assert len(runs) == 1
    assert results[0]["run"] == 1 and results[0]["charged"] == 100
    assert all(r == results[0] for r in results)


def test_payload_digest_key_and_fingerprint(svc: Svc) -> None:
    c = client_of(svc)
    runs: list[object] = []
    ns = unique_key("ns")

    @idempotent(c, payload="event", prefix=ns)
    def handle(event: dict[str, object]) -> int:
        runs.append(event)
        return len(runs)

    assert handle({"a": 1, "b": [1, 2]}) == 1
    assert handle({"b": [1, 2], "a": 1}) == 1  # the same payload in another order
    assert handle(event={"a": 2}) == 2

    @idempotent(c, key=lambda event: event["id"], payload="event", prefix=ns)
    def keyed(event: dict[str, object]) -> str:
        return "done"

    assert keyed({"id": "x", "v": 1}) == "done"
    with pytest.raises(idemsvc.FingerprintMismatch):
        keyed({"id": "x", "v": 2})
    # An int beyond a double's exact range is told apart from its neighbour
    # that a double holds (JCS alone would write both as 9007199254740992).
    assert keyed({"id": "y", "account": 2**53 + 1}) == "done"
    with pytest.raises(idemsvc.FingerprintMismatch):
        keyed({"id": "y", "account": 2**53})
    assert keyed({"id": "y", "account": 2**53 + 1}) == "done"


def test_terminal_and_retryable_exceptions(svc: Svc) -> None:
    c = client_of(svc)
    calls: list[str] = []

    @idempotent(c, key=lambda k: k, terminal=(ValueError,))
    def op(k: str) -> str:
        calls.append(k)
        if len(calls) == 1:
            raise RuntimeError("flaky")
        raise ValueError("bad input")

    k = unique_key()
    with pytest.raises(RuntimeError):
        op(k)  # retryable: released
    with pytest.raises(idemsvc.Failed) as f:
        op(k)  # runs again, fails terminally: stored
    assert not f.value.replayed and "bad input" in f.value.error
    with pytest.raises(idemsvc.Failed) as f2:
        op(k)  # replayed, not run
    assert f2.value.replayed and len(calls) == 2


def test_heartbeat_extends_the_lease(svc: Svc) -> None:
    c = client_of(svc)
    key = unique_key()
    seen: list[int] = []

    def slow() -> Response:
        lease = current_lease()
        assert lease is not None
        time.sleep(1.6)  # five times a third of the lease: beats keep it
        assert not lease.lost.is_set()
        seen.append(lease.attempt)
        return Response(body=b"ok")

    other: list[BaseException] = []

    def duplicate() -> None:
        time.sleep(0.9)  # past the first lease's end, were it not extended
        try:
            client_of(svc).begin(key, lease_ms=1000)
        except BaseException as e:
            other.append(e)

    t = threading.Thread(target=duplicate)
    t.start()
    res = c.do(key, slow, lease_ms=1000)
    t.join()
    assert res.attempt == 1 and seen == [1]
    assert len(other) == 1 and isinstance(other[0], idemsvc.InProgress)


CRASHER = """
import os, sys, time
from idemsvc import idempotent
@idempotent(key=lambda k: k, prefix="", lease_ms=1000)  # the client of IDEMSVC_URL and IDEMSVC_API_KEY
def work(k):
    print("running", flush=True)
    time.sleep(60)
work(os.environ["IDEM_KEY"])
"""


def test_crash_mid_function_runs_again_with_attempt_2(svc: Svc) -> None:
    key = unique_key("crash")
    env = {**os.environ, "PYTHONPATH": str(SRC), "IDEMSVC_URL": svc.base_url, "IDEMSVC_API_KEY": svc.api_key,
           "IDEM_KEY": key}
    p = subprocess.Popen([sys.executable, "-c", CRASHER], env=env, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"running"
    finally:
        os.kill(p.pid, 9)  # mid-function: no complete, no fail, no heartbeat
        p.wait()
    c = client_of(svc)
    attempts: list[tuple[int, bool]] = []

    @idempotent(c, key=lambda k: k, prefix="", lease_ms=1000)
    def work(k: str) -> str:
        lease = current_lease()
        assert lease is not None
        attempts.append((lease.attempt, lease.recovered))
        return "done"

    assert work(key) == "done"  # waits out the dead caller's lease
    assert attempts == [(2, True)]
    assert c.status(key)["state"] == "completed"


def test_lost_answers_to_begin_and_complete_are_retried_safely(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    try:
        c = Client(proxy.url, svc.api_key)
        key = unique_key("lost")
        proxy.lose_next("/v1/begin")
        a = c.begin(key, owner="owner-1")  # acquired at idemsvc, answer lost, retried: the same lease
        assert isinstance(a, Acquired) and a.attempt == 1
        assert proxy.seen.count("/v1/begin") == 2
        st = client_of(svc).status(key)
        assert st["state"] == "in_progress" and st["attempt"] == 1 and st["owner"] == "owner-1"

        proxy.lose_next("/v1/complete")
        out = c.complete(key, a.lease_token, Response(body=b"paid"))  # stored, answer lost, retried
        assert out["status"] == "completed" and out["attempt"] == 1
        assert proxy.seen.count("/v1/complete") == 2
        r = client_of(svc).begin(key)
        assert isinstance(r, Replay) and r.response.body == b"paid" and r.attempt == 1

        # Through the decorator: both answers lost, the body runs once.
        runs: list[int] = []

        @idempotent(c, key=lambda k: k)
        def pay(k: str) -> str:
            runs.append(1)
            return "paid"

        k2 = unique_key("lost")
        proxy.lose_next("/v1/begin")
        proxy.lose_next("/v1/complete")
        assert pay(k2) == "paid" and pay(k2) == "paid" and runs == [1]
    finally:
        proxy.close()


def test_connections_are_reused(svc: Svc) -> None:
    c = client_of(svc)
    for _ in range(20):
        c.do(unique_key(), lambda: Response(body=b"x"))
    assert len(c._pool._idle) == 1


def test_429_is_retried_after_retry_after_within_the_budget(svc: Svc) -> None:
    c = Client(svc.base_url, LIMITED_KEY, retry_budget=5)
    c.begin(unique_key())  # the burst of one
    started = time.monotonic()
    a = c.begin(unique_key())  # 429 with Retry-After: 1, waited for, then acquired
    assert isinstance(a, Acquired)
    assert time.monotonic() - started >= 0.9
    impatient = Client(svc.base_url, LIMITED_KEY, retry_budget=0.5)
    started = time.monotonic()
    with pytest.raises(idemsvc.RateLimited) as e:
        impatient.begin(unique_key())  # a Retry-After beyond the budget is not waited for
    assert e.value.status == 429 and e.value.retry_after and time.monotonic() - started < 0.5


def test_503_from_a_gateway_is_retried_honouring_retry_after(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    try:
        c = Client(proxy.url, svc.api_key, retry_budget=5)
        key = unique_key()
        proxy.refuse_next("/v1/begin", 2, 503, "1")
        started = time.monotonic()
        a = c.begin(key)
        assert isinstance(a, Acquired) and a.attempt == 1
        assert time.monotonic() - started >= 1.8 and proxy.seen.count("/v1/begin") == 3
        proxy.refuse_next("/v1/complete", 1, 503)  # no Retry-After: backoff
        assert c.complete(key, a.lease_token)["status"] == "completed"
        proxy.refuse_next("/v1/begin", 100, 503, "1")
        with pytest.raises(idemsvc.StoreUnavailable) as e:
            Client(proxy.url, svc.api_key, retry_budget=0.5).begin(unique_key())
        assert isinstance(e.value, idemsvc.Unavailable) and e.value.status == 503
        proxy.refuse_next("/v1/begin", 1, 502)  # not retried: an answer that is not 503 or 429
        with pytest.raises(idemsvc.UndocumentedAnswer):
            c.begin(unique_key())
    finally:
        proxy.close()


def test_a_lease_lost_while_running_is_told_to_the_function(svc: Svc) -> None:
    c = client_of(svc)
    key = unique_key()
    seen: list[BaseException | None] = []

    def long_op() -> Response:
        lease = current_lease()
        assert lease is not None
        client_of(svc).delete(key)  # an operator forgets the record: the next extend finds none
        assert lease.lost.wait(5)
        seen.append(lease.lost_reason)
        return Response(body=b"late")

    with pytest.raises(idemsvc.NotFound):
        c.do(key, long_op, lease_ms=600)  # its outcome cannot be stored: the record is gone
    assert len(seen) == 1 and isinstance(seen[0], idemsvc.NotFound)


def test_codec_and_dataclass_payloads(svc: Svc) -> None:
    from dataclasses import dataclass

    c = client_of(svc)

    class Raw:
        """Bytes stored as they are."""

        def encode(self, value: bytes) -> bytes:
            return value

        def decode(self, data: bytes) -> bytes:
            return data

    @dataclass
    class Order:
        id: str
        amount: int

    runs: list[Order] = []

    @idempotent(c, payload="order", codec=Raw())
    def receipt(order: Order) -> bytes:
        runs.append(order)
        return b"\x00\xffreceipt " + order.id.encode()

    o = Order(unique_key("o"), 5)
    first = receipt(o)
    assert first == b"\x00\xffreceipt " + o.id.encode()  # not UTF-8: stored as base64, back byte for byte
    assert receipt(Order(o.id, 5)) == first and len(runs) == 1
    assert receipt(Order(o.id, 6)) == first and len(runs) == 2  # another payload: another key, run again
