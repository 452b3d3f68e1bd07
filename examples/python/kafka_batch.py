# SPDX-License-Identifier: Apache-2.0
"""A Kafka consumer that applies each record once, whatever is consumed
again after a crash or a rebalance, with two calls to idemsvc per poll: one
begin batch and one finish batch. Records are keyed by topic, partition and
offset; the offset committed per partition stops before the first record
to try again, so that it is consumed again.

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/kafka_batch.py

The asyncio variant, aprocess_batch, takes a coroutine function the same way
(an aiokafka consumer's getmany() batch, say).
"""

import asyncio
import os
import uuid
from typing import Any, Sequence

from idemsvc import AsyncClient, Outcome, aprocess_batch

shipped: list[str] = []
fail_once = {"order-5"}


async def ship(record: dict[str, Any]) -> str:
    await asyncio.sleep(0)  # the real work: a database write, an HTTP call
    if record["value"] in fail_once:
        fail_once.discard(record["value"])
        raise TimeoutError("warehouse API timed out")
    shipped.append(record["value"])
    return f"shipped {record['value']} ({record['key']})"


def commits(outcomes: Sequence[Outcome[dict[str, Any]]]) -> dict[tuple[str, int], int]:
    """Per partition, the offset to commit: the first record to try again, or past the last."""
    out: dict[tuple[str, int], int] = {}
    blocked: set[tuple[str, int]] = set()
    for o in outcomes:
        tp = (o.record["topic"], o.record["partition"])
        if tp in blocked:
            continue
        if o.retry:
            out[tp] = o.record["offset"]
            blocked.add(tp)
        else:
            out[tp] = o.record["offset"] + 1
    return out


async def main() -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    log = [{"topic": topic, "partition": p, "offset": off, "key": f"customer-{off % 3}", "value": f"order-{p}{off}"}
           for p in (0, 1) for off in range(5)]
    log[5]["value"] = "order-5"
    committed = {(topic, 0): 0, (topic, 1): 0}
    consumed = 0
    async with AsyncClient(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"),
                           os.environ.get("IDEMSVC_API_KEY")) as client:
        for poll in range(1, 4):
            batch = [r for r in log if r["offset"] >= committed[(r["topic"], r["partition"])]]
            if poll == 3:
                batch = log  # a rebalance: another member consumes the partitions from the start
            consumed += len(batch)
            outcomes = await aprocess_batch(
                batch, ship, client=client,
                key=lambda r: f"{r['topic']}/{r['partition']}/{r['offset']}")
            print(f"poll {poll}: {len(batch)} records,",
                  ", ".join(f"{o.status}={sum(x.status == o.status for x in outcomes)}"
                            for o in {o.status: o for o in outcomes}.values()))
            committed.update(commits(outcomes))
            print("  commit", {f"{t}/{p}": off for (t, p), off in committed.items()})
    print(f"shipped {len(shipped)} orders once each for 10 records consumed {consumed} times")


if __name__ == "__main__":
    asyncio.run(main())
