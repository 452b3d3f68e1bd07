# SPDX-License-Identifier: Apache-2.0
"""The batch calls (begin_batch, finish_batch) of both clients and the
batch helper for queue consumers (process_batch, aprocess_batch), against a
real idemsvc."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import idemsvc
from harness import LosingProxy, Svc, unique_key
from idemsvc import (
    Acquired, AsyncClient, BeginItem, Client, FinishItem, Outcome, Replay, Response, aprocess_batch, current_lease,
    process_batch,
)

SRC = Path(__file__).resolve().parents[1] / "src"


def client_of(svc: Svc, **kw: Any) -> Client:
    return Client(svc.base_url, svc.api_key, **kw)


def requests_by_route(svc: Svc) -> dict[str, float]:
    """idemsvc's own count of the HTTP requests it served, by route."""
    u = urllib.parse.urlsplit(svc.base_url)
    c = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    out: dict[str, float] = {}
    for m in re.finditer(r'^idemsvc_http_requests_total\{([^}]*)\} (\S+)$', text, re.M):
        route = re.search(r'route="([^"]*)"', m.group(1))
        name = route.group(1) if route else ""
        out[name] = out.get(name, 0) + float(m.group(2))
    return out


def calls_since(svc: Svc, before: dict[str, float]) -> dict[str, float]:
    now = requests_by_route(svc)
    return {r: n - before.get(r, 0) for r, n in now.items() if n != before.get(r, 0) and "metrics" not in r}


def done_before(c: Client, key: str, value: Any) -> None:
    a = c.begin(key)
    assert isinstance(a, Acquired)
    c.complete(key, a.lease_token, Response(body=idemsvc.JSONCodec().encode(value)))


# --- the batch calls ---------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "httpx", "thread"])
def test_batch_calls_give_each_item_its_single_answer(svc: Svc, flavour: str) -> None:
    c = client_of(svc)
    new, done, busy, other_fp = (unique_key(p) for p in ("new", "done", "busy", "fp"))
    done_before(c, done, "earlier")
    held = c.begin(busy)
    assert isinstance(held, Acquired)
    fp = c.begin(other_fp, fingerprint="a")
    assert isinstance(fp, Acquired)
    fenced = unique_key("fenced")
    stale = c.begin(fenced)
    assert isinstance(stale, Acquired)
    c.fail(fenced, stale.lease_token)
    assert isinstance(c.begin(fenced), Acquired)  # attempt 2: the first token is fenced off
    items: list[BeginItem | str] = [new, BeginItem(done), BeginItem(busy), BeginItem(other_fp, fingerprint="b"),
                                    BeginItem("bad key")]

    async def both(ac: AsyncClient) -> tuple[list[Any], list[Any]]:
        async with ac:
            got = await ac.begin_batch(items)
            a = got[0]
            assert isinstance(a, Acquired)
            fin = await ac.finish_batch([FinishItem(new, a.lease_token, Response(body=b"ok")),
                                         FinishItem(fenced, stale.lease_token, fail=True),
                                         FinishItem(unique_key(), held.lease_token)])
            return got, fin

    if flavour == "sync":
        got = c.begin_batch(items)
        a = got[0]
        assert isinstance(a, Acquired)
        fin = c.finish_batch([FinishItem(new, a.lease_token, Response(body=b"ok")),
                              FinishItem(fenced, stale.lease_token, fail=True),
                              FinishItem(unique_key(), held.lease_token)])
    else:
        got, fin = asyncio.run(both(AsyncClient(svc.base_url, svc.api_key, use_httpx=flavour == "httpx")))

    assert isinstance(got[0], Acquired) and got[0].attempt == 1
    assert isinstance(got[1], Replay) and got[1].response.body == b'"earlier"'
    assert isinstance(got[2], idemsvc.InProgress) and got[2].attempt == 1 and got[2].retry_after is not None
    assert isinstance(got[3], idemsvc.FingerprintMismatch) and got[3].status == 422
    assert isinstance(got[4], idemsvc.InvalidRequest) and got[4].status == 400
    assert fin[0]["status"] == "completed"
    assert isinstance(fin[1], idemsvc.LeaseLost)
    assert isinstance(fin[2], (idemsvc.NotFound, idemsvc.LeaseLost))
    r = c.begin(new)
    assert isinstance(r, Replay) and r.response.body == b"ok"


def test_batch_calls_carry_the_tenant(svc: Svc) -> None:
    c = client_of(svc, tenant="py")  # its own tenant, named: accepted on every item
    k = unique_key()
    a = c.begin_batch([k])[0]
    assert isinstance(a, Acquired)
    assert c.finish_batch([FinishItem(k, a.lease_token, Response(body=b"x"))])[0]["status"] == "completed"


# --- the batch helper ---------------------------------------------------------------


def test_batch_of_new_done_and_busy_records(svc: Svc) -> None:
    c = client_of(svc)
    ids = [unique_key("m") for _ in range(6)]
    done_before(c, ids[1], {"charged": 1, "by": "earlier"})
    elsewhere = c.begin(ids[3], lease_ms=30_000)  # another consumer holds it
    assert isinstance(elsewhere, Acquired)
    records = [{"messageId": i, "body": {"n": n}} for n, i in enumerate(ids)]
    records.append(dict(records[0]))  # a duplicate delivered in the same batch
    ran: list[str] = []

    def handle(rec: dict[str, Any]) -> dict[str, Any]:
        lease = current_lease()
        assert lease is not None and lease.key == rec["messageId"]
        ran.append(rec["messageId"])
        return {"charged": rec["body"]["n"]}

    before = requests_by_route(svc)
    out = process_batch(records, handle, key=lambda r: r["messageId"], client=c, prefix="")
    calls = calls_since(svc, before)
    assert sum(calls.values()) == 2, calls  # one begin batch, one finish batch
    assert ran == [ids[0], ids[2], ids[4], ids[5]]
    assert [o.status for o in out] == ["completed", "replayed", "completed", "in_progress", "completed",
                                       "completed", "replayed"]
    assert [o.record for o in out] == records
    assert out[1].value == {"charged": 1, "by": "earlier"} and out[1].ok and not out[1].retry
    assert out[0].value == {"charged": 0} and out[0].attempt == 1
    assert out[6].value == {"charged": 0}
    assert out[3].retry and isinstance(out[3].error, idemsvc.InProgress)
    # A redelivery: everything is replayed, nothing runs, still two calls.
    before = requests_by_route(svc)
    again = process_batch(records, handle, key=lambda r: r["messageId"], client=c, prefix="")
    assert sum(calls_since(svc, before).values()) == 1  # nothing acquired: no finish batch
    assert len(ran) == 4
    assert [o.status for o in again] == ["replayed"] * 3 + ["in_progress"] + ["replayed"] * 3
    assert [o.value for o in again if o.ok] == [o.value for o in out if o.ok]


def test_a_batch_of_100_costs_two_calls(svc: Svc) -> None:
    records = [{"topic": "orders", "partition": 0, "offset": n, "key": f"o{n}", "value": n} for n in range(100)]
    proxy = LosingProxy(svc.base_url)  # a counting transport, in front of the real idemsvc
    try:
        c = Client(proxy.url, svc.api_key)
        run = unique_key("k")
        before = requests_by_route(svc)
        out = process_batch(records, lambda r: r["value"] * 2, key=lambda r: f"{run}-{r['offset']}", client=c)
        assert sum(calls_since(svc, before).values()) == 2
        assert proxy.seen == ["/v1/begin/batch", "/v1/finish/batch"]
        assert [o.value for o in out] == [n * 2 for n in range(100)] and all(o.status == "completed" for o in out)
        # 250 records: three chunks of idemsvc's batch size, two calls each.
        more = [{"offset": n, "value": n} for n in range(250)]
        proxy.seen.clear()
        out = process_batch(more, lambda r: r["value"], key=lambda r: f"{run}-more-{r['offset']}", client=c)
        assert len(proxy.seen) == 6 and [o.value for o in out] == list(range(250))
    finally:
        proxy.close()


def test_per_record_problems_do_not_fail_the_others(svc: Svc) -> None:
    c = client_of(svc)
    ids = [unique_key("p") for _ in range(5)]
    c.begin(ids[2], fingerprint="sha256:" + "0" * 64)  # a payload other than this batch's under its key

    class Declined(Exception):
        pass

    def handle(rec: dict[str, Any]) -> str:
        if rec["body"] == "boom":
            raise ValueError("boom")
        if rec["body"] == "declined":
            raise Declined("card declined")
        return rec["body"].upper()

    records = [{"id": ids[0], "body": "a"}, {"id": ids[1], "body": "boom"}, {"id": ids[2], "body": "c"},
               {"id": "x" * 300, "body": "too long a key"}, {"id": ids[3], "body": "declined"},
               {"id": ids[4], "body": "e"}]
    out = process_batch(records, handle, key=lambda r: r["id"], payload=lambda r: r["body"], client=c, prefix="",
                        terminal=(Declined,))
    assert [o.status for o in out] == ["completed", "error", "rejected", "rejected", "failed", "completed"]
    assert isinstance(out[1].error, ValueError) and out[1].retry
    assert isinstance(out[2].error, idemsvc.FingerprintMismatch) and not out[2].retry
    assert isinstance(out[3].error, idemsvc.InvalidRequest)
    assert isinstance(out[4].error, idemsvc.Failed) and "card declined" in out[4].error.error
    assert [out[0].value, out[5].value] == ["A", "E"]
    # The exception released its key; the terminal failure is stored and replayed.
    ok = {"id": ids[1], "body": "boom"}
    again = process_batch([ok, records[4]], lambda r: "fixed", key=lambda r: r["id"], payload=lambda r: r["body"],
                          client=c, prefix="")
    assert [o.status for o in again] == ["completed", "failed"]
    assert again[0].attempt == 2 and again[0].value == "fixed"
    assert isinstance(again[1].error, idemsvc.Failed) and again[1].error.replayed


def test_a_result_too_large_to_store_fails_terminally(svc: Svc) -> None:
    c = client_of(svc)
    k, small = unique_key("big"), unique_key("small")
    out = process_batch([k, small], lambda r: "x" * (1536 << 10) if r == k else "ok", key=lambda r: r, client=c,
                        prefix="")
    assert out[0].status == "failed" and isinstance(out[0].error, idemsvc.Failed)
    assert out[1].status == "completed"
    assert c.status(k)["state"] == "failed"  # no duplicate runs it again


def test_results_over_the_request_limit_go_in_smaller_finishes(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    try:
        c = Client(proxy.url, svc.api_key)
        keys = [unique_key("big") for _ in range(3)]  # 3 x 0.9 MiB: over idemsvc's 2 MiB request limit
        out = process_batch(keys, lambda r: r * 1 + "x" * (900 << 10), key=lambda r: r, client=c, prefix="")
        assert [o.status for o in out] == ["completed"] * 3
        assert proxy.seen.count("/v1/finish/batch") > 1
    finally:
        proxy.close()


def test_an_interruption_finishes_what_ran_and_releases_the_rest(svc: Svc) -> None:
    c = client_of(svc)
    keys = [unique_key("int") for _ in range(3)]

    def handle(r: str) -> str:
        if r == keys[1]:
            raise KeyboardInterrupt
        return r

    with pytest.raises(KeyboardInterrupt):
        process_batch(keys, handle, key=lambda r: r, client=c, prefix="")
    assert c.status(keys[0])["state"] == "completed"
    for k in keys[1:]:  # released at once, not held until their leases run out
        a = c.begin(k)
        assert isinstance(a, Acquired) and a.attempt == 2


def test_one_key_with_two_payloads_in_a_batch(svc: Svc) -> None:
    c = client_of(svc)
    k = unique_key("twice")
    out = process_batch([{"id": k, "n": 1}, {"id": k, "n": 1}, {"id": k, "n": 2}], lambda r: r["n"],
                        key=lambda r: r["id"], payload=lambda r: r["n"], client=c, prefix="")
    assert [o.status for o in out] == ["completed", "replayed", "rejected"]
    assert isinstance(out[2].error, idemsvc.FingerprintMismatch) and out[1].value == 1


def test_payload_digest_as_key(svc: Svc) -> None:
    c = client_of(svc)
    body = {"order": unique_key(), "amount": 5}
    same = {"amount": 5, "order": body["order"]}  # the same payload, another member order
    out = process_batch([body, same], lambda r: r["amount"], payload=lambda r: r, client=c)
    assert [o.status for o in out] == ["completed", "replayed"] and out[0].key == out[1].key
    assert out[0].key.endswith(idemsvc.payload_digest(body))


CRASHER = """
import os, sys
from idemsvc import Client, process_batch
c = Client(os.environ["IDEMSVC_URL"], os.environ["IDEMSVC_API_KEY"])
def handle(r):
    if r == os.environ["CRASH_AT"]:
        print("crashing", flush=True)
        os._exit(3)  # mid-batch: no finish batch, no heartbeat
    return r
process_batch(os.environ["KEYS"].split(","), handle, key=lambda r: r, client=c, prefix="", lease_ms=1000)
"""


def test_crash_mid_batch_then_a_retry_after_the_lease_runs_attempt_2(svc: Svc) -> None:
    keys = [unique_key("crash") for _ in range(4)]
    env = {**os.environ, "PYTHONPATH": str(SRC), "IDEMSVC_URL": svc.base_url, "IDEMSVC_API_KEY": svc.api_key,
           "KEYS": ",".join(keys), "CRASH_AT": keys[2]}
    out = subprocess.run([sys.executable, "-c", CRASHER], env=env, capture_output=True, timeout=60)
    assert out.returncode == 3 and out.stdout.strip() == b"crashing", out.stderr
    c = client_of(svc)
    st = c.status(keys[0])
    assert st["state"] == "in_progress" and st["attempt"] == 1  # ran, but its finish never went
    seen: list[tuple[int, bool]] = []

    def handle(r: str) -> str:
        lease = current_lease()
        assert lease is not None
        seen.append((lease.attempt, lease.recovered))
        return r

    # At once: every record is still held by the dead consumer.
    first = process_batch(keys, handle, key=lambda r: r, client=c, prefix="")
    assert [o.status for o in first] == ["in_progress"] * 4 and all(o.retry for o in first)
    # The redelivery after the lease: each record runs again, as attempt 2.
    out2: list[Outcome[str]] = []
    for _ in range(100):
        out2 = process_batch(keys, handle, key=lambda r: r, client=c, prefix="")
        if all(o.status == "completed" for o in out2):
            break
        time.sleep(0.1)
    assert [o.status for o in out2] == ["completed"] * 4
    assert [o.attempt for o in out2] == [2] * 4 and seen == [(2, True)] * 4


def test_lost_answers_to_both_batch_calls_are_retried_safely(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    try:
        c = Client(proxy.url, svc.api_key)
        keys = [unique_key("lost") for _ in range(3)]
        ran: list[str] = []

        def handle(r: str) -> str:
            ran.append(r)
            return r + "!"

        proxy.lose_next("/v1/begin/batch")  # acquired at idemsvc, the answer lost: retried with the same owners
        proxy.lose_next("/v1/finish/batch")  # completed at idemsvc, the answer lost: retried with the same tokens
        out = process_batch(keys, handle, key=lambda r: r, client=c, prefix="")
        assert proxy.seen == ["/v1/begin/batch"] * 2 + ["/v1/finish/batch"] * 2
        assert [o.status for o in out] == ["completed"] * 3 and [o.attempt for o in out] == [1] * 3
        assert ran == keys
        again = process_batch(keys, handle, key=lambda r: r, client=client_of(svc), prefix="")
        assert [o.status for o in again] == ["replayed"] * 3 and [o.value for o in again] == [k + "!" for k in keys]
        assert ran == keys
    finally:
        proxy.close()


def test_unavailable_idemsvc_reports_every_record_for_a_retry() -> None:
    c = Client("http://127.0.0.1:9", retry_budget=0.2)
    ran: list[str] = []
    out = process_batch(["a", "b"], ran.append, key=lambda r: r, client=c)
    assert ran == [] and [o.status for o in out] == ["error", "error"] and all(o.retry for o in out)
    assert isinstance(out[0].error, idemsvc.Unreachable)


def test_a_busy_idemsvc_reports_the_records_for_a_retry_and_releases_what_ran(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    try:
        c = Client(proxy.url, svc.api_key, retry_budget=0.3)
        keys = [unique_key("busy") for _ in range(2)]
        proxy.refuse_next("/v1/begin/batch", 100, 429, "5")  # a gateway's 429, its Retry-After past the budget
        out = process_batch(keys, lambda r: r, key=lambda r: r, client=c, prefix="")
        assert [o.status for o in out] == ["error", "error"] and all(o.retry for o in out)
        assert isinstance(out[0].error, idemsvc.ProblemError) and out[0].error.status == 429
        proxy.refuse_next("/v1/begin/batch", 0, 429)
        proxy.refuse_next("/v1/finish/batch", 100, 503, "5")
        out = process_batch(keys, lambda r: r + "!", key=lambda r: r, client=c, prefix="")
        assert [o.status for o in out] == ["error", "error"] and [o.value for o in out] == [k + "!" for k in keys]
        assert all(client_of(svc).status(k)["state"] == "in_progress" for k in keys)  # until the lease runs out
    finally:
        proxy.close()


def test_a_long_batch_keeps_its_leases(svc: Svc) -> None:
    c = client_of(svc)
    keys = [unique_key("long") for _ in range(3)]

    def slow(r: str) -> str:
        time.sleep(0.5)  # the three together outlast the 1 s lease: the heartbeat extends it
        lease = current_lease()
        assert lease is not None and not lease.lost.is_set()
        return r

    out = process_batch(keys, slow, key=lambda r: r, client=c, prefix="", lease_ms=1000)
    assert [o.status for o in out] == ["completed"] * 3 and [o.attempt for o in out] == [1] * 3


@pytest.mark.parametrize("use_httpx", [True, False], ids=["httpx", "thread"])
def test_async_batch_helper(svc: Svc, use_httpx: bool) -> None:
    c = client_of(svc)
    ids = [unique_key("a") for _ in range(4)]
    done_before(c, ids[1], "before")
    assert isinstance(c.begin(ids[2]), Acquired)
    ran: list[str] = []

    async def handle(r: str) -> str:
        await asyncio.sleep(0)
        lease = current_lease()
        assert lease is not None and lease.key == r
        ran.append(r)
        return r.upper()

    async def main() -> list[Outcome[str]]:
        async with AsyncClient(svc.base_url, svc.api_key, use_httpx=use_httpx) as ac:
            return await aprocess_batch(ids, handle, key=lambda r: r, client=ac, prefix="")

    before = requests_by_route(svc)
    out = asyncio.run(main())
    assert sum(calls_since(svc, before).values()) == 2
    assert [o.status for o in out] == ["completed", "replayed", "in_progress", "completed"]
    assert [out[0].value, out[1].value, out[3].value] == [ids[0].upper(), "before", ids[3].upper()]
    assert ran == [ids[0], ids[3]]
    # A plain function and a synchronous client work too.
    out2 = asyncio.run(aprocess_batch([unique_key()], lambda r: 1, key=lambda r: r, client=c))
    assert out2[0].status == "completed" and out2[0].value == 1
