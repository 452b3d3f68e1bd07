# SPDX-License-Identifier: Apache-2.0
"""A queue consumer that applies each message once, whatever the broker
redelivers: SQS-shaped records keyed by their messageId, Kafka-shaped ones
by topic, partition and offset, and a payload keyed by its own digest.

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/consumer.py
"""

import json
import os
import uuid

from idemsvc import Client, idempotent

client = Client(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"), os.environ.get("IDEMSVC_API_KEY"))
applied: list[str] = []


@idempotent(client, key=lambda record: record["messageId"])
def on_sqs(record: dict) -> dict:  # type: ignore[type-arg]
    order = json.loads(record["body"])
    applied.append(record["messageId"])
    return {"charged": order["amount"], "order": order["order"]}


@idempotent(client, key=lambda msg: f'{msg["topic"]}/{msg["partition"]}/{msg["offset"]}')
def on_kafka(msg: dict) -> str:  # type: ignore[type-arg]
    applied.append(msg["value"])
    return "shipped " + msg["value"]


@idempotent(client, payload="event")  # the key is a digest of the event, as Powertools' data_keyword_argument
def on_event(event: dict) -> int:  # type: ignore[type-arg]
    applied.append(event["id"])
    return len(applied)


def main() -> None:
    run = uuid.uuid4().hex[:8]
    sqs = {"messageId": f"m-{run}", "receiptHandle": "r1", "body": json.dumps({"order": 42, "amount": 100})}
    kafka = {"topic": f"orders-{run}", "partition": 3, "offset": 1017, "value": "order-42"}
    event = {"id": f"e-{run}", "type": "refund", "amount": 5}
    for delivery in range(3):  # the broker delivers each message three times
        print("sqs  ", delivery, on_sqs(sqs))
        print("kafka", delivery, on_kafka(kafka))
        print("event", delivery, on_event(dict(reversed(list(event.items())))))
    print("applied", len(applied), "times for 3 messages delivered 9 times")


if __name__ == "__main__":
    main()
