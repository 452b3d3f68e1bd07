# SPDX-License-Identifier: Apache-2.0
"""An SQS consumer (a Lambda handler with partial batch responses) that
applies each message once, whatever SQS redelivers, with two calls to
idemsvc per batch: one begin batch and one finish batch.

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/sqs_batch.py

The handler returns ``batchItemFailures``: the messages to deliver again,
which are those in progress at another consumer and those whose work raised.
Everything else (done now, done before, failed for good) is acknowledged.
"""

import json
import os
import uuid
from typing import Any

from idemsvc import Acquired, Client, Response, process_batch

client = Client(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"), os.environ.get("IDEMSVC_API_KEY"))
charged: list[int] = []
flaky_once: set[int] = set()


def charge(record: dict[str, Any]) -> dict[str, Any]:
    order = json.loads(record["body"])
    if order.get("flaky") and order["order"] not in flaky_once:
        flaky_once.add(order["order"])
        raise ConnectionError("the payment provider timed out")  # releases the key: SQS delivers it again
    charged.append(order["order"])
    return {"charged": order["amount"], "order": order["order"]}


def lambda_handler(event: dict[str, Any], context: object = None) -> dict[str, Any]:
    outcomes = process_batch(event["Records"], charge, key=lambda r: r["messageId"], client=client)
    for o in outcomes:
        print(f"  {o.record['messageId'][-6:]} {o.status:<11} {o.value if o.ok else o.error}")
    return {"batchItemFailures": [{"itemIdentifier": o.record["messageId"]} for o in outcomes if o.retry]}


def main() -> None:
    run = uuid.uuid4().hex[:8]
    records = [{"messageId": f"{run}-{n:04d}", "receiptHandle": f"rh-{n}",
                "body": json.dumps({"order": n, "amount": 10 * n, "flaky": n == 3})} for n in range(10)]
    # Another consumer holds message 7 right now (a redelivery after a visibility timeout, say).
    other = client.begin(f"{charge.__module__}.{charge.__qualname__}:{records[7]['messageId']}")
    assert isinstance(other, Acquired)
    deliveries = 0
    pending = records
    for round_ in range(1, 6):
        print(f"delivery {round_}: {len(pending)} messages")
        deliveries += len(pending)
        failures = lambda_handler({"Records": pending})["batchItemFailures"]
        print("  batchItemFailures:", [f["itemIdentifier"][-6:] for f in failures])
        if round_ == 1:  # the other consumer finishes message 7
            client.complete(other.key, other.lease_token, Response(body=b'{"charged":70,"order":7}'))
        again = {f["itemIdentifier"] for f in failures}
        pending = [r for r in records if r["messageId"] in again]
        if not pending:
            break
    print("delivery again: all 10 messages")
    lambda_handler({"Records": records})  # and the whole batch once more, as at-least-once delivery may
    deliveries += len(records)
    print(f"charged {len(charged)} orders here and 1 at the other consumer, each once, "
          f"for 10 messages delivered {deliveries} times")


if __name__ == "__main__":
    main()
