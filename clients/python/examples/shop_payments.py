"""The shop's payments service in Python: reads the orders topic to the end offsets it finds at
start and pays every order but every K-th with a payment keyed by the order id, each stamped
through :class:`parsley_stamp.producer.CausalProducer` after observing its order, so that
Parsley's join takes a payment only after its order — the Python counterpart of the ``shop``
example's Rust service (``examples/shop/src/payments.rs``), run on the same topics and by the
same pipeline (``shop run``).

Values are the example's JSON: an order ``{"customer": "c-0003", "amount_cents": 1250}``
keyed by ``o-000017``, a payment ``{"order": "o-000017", "amount_cents": 1250}``. With a clock
skew of X ms a payment's timestamp is its order's minus X: a service whose clock runs behind.

Usage: ``python shop_payments.py BOOTSTRAP ORDERS PAYMENTS [--skip-every K]
[--clock-skew-ms X] [--unstamped]`` (``--unstamped``: a plain producer, the negative control).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Dict, Optional

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from parsley_stamp.producer import CausalProducer

TIMEOUT_S = 30.0
DEADLINE_S = 600.0


def unpaid(number: int, skip_every: Optional[int]) -> bool:
    """Whether order number ``number`` stays unpaid (the Rust example's rule)."""
    return bool(skip_every) and number % skip_every == 0


def run(
    bootstrap: str,
    orders: str,
    payments: str,
    skip_every: Optional[int] = None,
    clock_skew_ms: int = 0,
    stamped: bool = True,
) -> Dict[str, int]:
    """Pays the orders (module docs); returns the counts: ``orders``, ``payments``,
    ``paid_cents``. Creates ``payments`` with the orders' partition count if absent."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(orders, timeout=TIMEOUT_S).topics[orders].partitions)
    futures = admin.create_topics([NewTopic(payments, partitions, 1)])
    for future in futures.values():
        try:
            future.result(timeout=TIMEOUT_S)
        except Exception as e:  # already there
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"payments-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    waiting = {}
    for p in range(partitions):
        _, end = consumer.get_watermark_offsets(TopicPartition(orders, p), timeout=TIMEOUT_S)
        if end > 0:
            waiting[p] = end
    consumer.subscribe([orders])
    if stamped:
        producer = CausalProducer({"bootstrap.servers": bootstrap}, timeout_s=TIMEOUT_S)
    else:
        plain = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
            }
        )
    counts = {"orders": 0, "payments": 0, "paid_cents": 0}
    started = time.monotonic()
    while waiting:
        if time.monotonic() - started > DEADLINE_S:
            raise RuntimeError(f"the orders' end offsets not reached: partitions {sorted(waiting)} left")
        for order in consumer.consume(num_messages=1000, timeout=0.2):
            if order.error():
                raise RuntimeError(str(order.error()))
            counts["orders"] += 1
            if stamped:
                producer.observe(order, consumer)
            if order.offset() + 1 >= waiting.get(order.partition(), 0):
                waiting.pop(order.partition(), None)
            number = int(order.key().decode()[2:])
            if unpaid(number, skip_every):
                continue
            amount = json.loads(order.value())["amount_cents"]
            value = json.dumps({"order": order.key().decode(), "amount_cents": amount}).encode()
            _, ordered_at = order.timestamp()
            at = ordered_at - clock_skew_ms if clock_skew_ms else None
            if stamped:
                producer.send(payments, order.key(), value, timestamp_ms=at)
            else:
                extra = {} if at is None else {"timestamp": at}
                plain.produce(payments, key=order.key(), value=value, **extra)
                plain.poll(0)
            counts["payments"] += 1
            counts["paid_cents"] += amount
    if stamped:
        producer.flush()
    elif plain.flush(TIMEOUT_S):
        raise RuntimeError("payments not acknowledged")
    consumer.close()
    return counts


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("bootstrap")
    args.add_argument("orders")
    args.add_argument("payments")
    args.add_argument("--skip-every", type=int)
    args.add_argument("--clock-skew-ms", type=int, default=0)
    args.add_argument("--unstamped", action="store_true")
    a = args.parse_args()
    counts = run(a.bootstrap, a.orders, a.payments, a.skip_every, a.clock_skew_ms, not a.unstamped)
    print(f"payments: read {counts['orders']} orders, paid {counts['payments']} ({counts['paid_cents']} cents)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
