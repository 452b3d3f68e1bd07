# SPDX-License-Identifier: Apache-2.0
"""The asyncio client and @idempotent on coroutine functions."""

from __future__ import annotations

import asyncio

import pytest

import idemsvc
from harness import LosingProxy, Svc, free_port, unique_key
from idemsvc import Acquired, AsyncClient, Replay, Response, current_lease, idempotent


@pytest.mark.parametrize("use_httpx", [True, False], ids=["httpx", "thread"])
def test_async_client_calls(svc: Svc, use_httpx: bool) -> None:
    async def main() -> None:
        async with AsyncClient(svc.base_url, svc.api_key, use_httpx=use_httpx) as c:
            key = unique_key()
            a = await c.begin(key, fingerprint="f")
            assert isinstance(a, Acquired) and a.attempt == 1
            with pytest.raises(idemsvc.InProgress):
                await c.begin(key)
            await c.complete(key, a.lease_token, Response(200, {"Content-Type": "text/plain"}, b"hi"))
            r = await c.begin(key)
            assert isinstance(r, Replay) and r.response.body == b"hi"
            assert (await c.status(key))["state"] == "completed"
            await c.delete(key)
            with pytest.raises(idemsvc.NotFound):
                await c.status(key)

    asyncio.run(main())


def test_async_fifty_tasks_one_key_run_once(svc: Svc) -> None:
    runs: list[int] = []

    async def main() -> None:
        c = AsyncClient(svc.base_url, svc.api_key)

        @idempotent(c, key=lambda order_id: order_id)
        async def ship(order_id: str) -> dict[str, object]:
            runs.append(1)
            lease = current_lease()
            assert lease is not None and lease.attempt == 1
            await asyncio.sleep(0.3)
            return {"shipped": order_id}

        k = unique_key("ship")
        results = await asyncio.gather(*(ship(k) for _ in range(50)))
        assert all(r == {"shipped": k} for r in results)
        await c.aclose()

    asyncio.run(main())
    assert runs == [1]


def test_async_decorator_with_a_sync_client_and_a_lost_begin_answer(svc: Svc) -> None:
    proxy = LosingProxy(svc.base_url)
    runs: list[int] = []
    try:
        c = idemsvc.Client(proxy.url, svc.api_key)

        @idempotent(c, payload="msg")
        async def handle(msg: dict[str, object]) -> str:
            runs.append(1)
            return "ok"

        async def main() -> None:
            proxy.lose_next("/v1/begin")
            proxy.lose_next("/v1/complete")
            m = {"id": unique_key(), "n": 1}
            assert await handle(m) == "ok"
            assert await handle(dict(reversed(list(m.items())))) == "ok"

        asyncio.run(main())
        assert runs == [1]
        # Another event loop gets an asyncio client of its own.
        assert asyncio.run(handle({"id": unique_key()})) == "ok" and runs == [1, 1]
    finally:
        proxy.close()


def test_async_unreachable_and_retryable_exception(svc: Svc) -> None:
    async def main() -> None:
        down = AsyncClient(f"http://127.0.0.1:{free_port()}", "k", retry_budget=0.2)
        with pytest.raises(idemsvc.Unreachable):
            await down.begin(unique_key())
        c = AsyncClient(svc.base_url, svc.api_key)
        key = unique_key()

        async def boom() -> Response:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            await c.do(key, boom)
        a = await c.begin(key)  # released: the next begin acquires
        assert isinstance(a, Acquired) and a.attempt == 2

    asyncio.run(main())


def test_async_heartbeat_extends_the_lease(svc: Svc) -> None:
    async def main() -> None:
        c = AsyncClient(svc.base_url, svc.api_key)
        key = unique_key()

        async def slow() -> Response:
            lease = current_lease()
            assert lease is not None
            await asyncio.sleep(0.9)  # past the first lease's end, were it not extended
            with pytest.raises(idemsvc.InProgress):
                await c.begin(key, lease_ms=600)
            await asyncio.sleep(0.4)
            assert not lease.lost.is_set()
            return Response(body=b"ok")

        res = await c.do(key, slow, lease_ms=600)
        assert res.attempt == 1 and (await c.status(key))["state"] == "completed"
        await c.aclose()

    asyncio.run(main())
