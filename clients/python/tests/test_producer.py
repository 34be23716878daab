"""The stamping producer on the real broker (the address in ``PARSLEY_BOOTSTRAP``, as the
project's test command sets it): what it observes and what it sends is in the stamps it
writes, read back and decoded."""

import os
import time
import unittest
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from parsley_stamp import codec
from parsley_stamp.codec import Channel, Entry, InFlight, Sender, Stamp
from parsley_stamp.producer import CausalProducer, StampError

BOOTSTRAP = os.environ.get("PARSLEY_BOOTSTRAP")
TIMEOUT_S = 30.0


def create_topic(prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=TIMEOUT_S)
    return name


def read_all(topic: str, partitions: int):
    """Every committed record of ``topic`` up to its end offsets now, in partition then offset
    order: read until the consumer's position reaches each end (it passes transaction
    markers, which are not returned)."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)[1]
        for p in range(partitions)
    }
    left = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in sorted(left)])
    records = []
    deadline = time.monotonic() + TIMEOUT_S
    while left:
        if time.monotonic() > deadline:
            raise AssertionError(f"partitions {sorted(left)} of {topic} not read in {TIMEOUT_S} s")
        m = consumer.poll(0.2)
        if m is not None:
            if m.error():
                raise AssertionError(str(m.error()))
            records.append(m)
        for tp in consumer.position([TopicPartition(topic, p) for p in sorted(left)]):
            if tp.offset >= ends[tp.partition]:
                left.discard(tp.partition)
    consumer.close()
    return sorted(records, key=lambda m: (m.partition(), m.offset())), consumer


def stamp_of(message) -> Stamp:
    [value] = [v for k, v in message.headers() if k == codec.STAMP_HEADER]
    return codec.decode(value)


@unittest.skipUnless(BOOTSTRAP, "needs a broker: PARSLEY_BOOTSTRAP (cargo xtask test sets it)")
class OnTheBroker(unittest.TestCase):
    def test_a_payment_claims_the_order_its_service_consumed_and_its_own_earlier_sends(self):
        orders = create_topic("py-orders", 2)
        payments = create_topic("py-payments", 2)
        shop = CausalProducer({"bootstrap.servers": BOOTSTRAP}, timeout_s=TIMEOUT_S)
        shop.send(orders, b"o-1", b"5")
        shop.flush()
        [order], _ = read_all(orders, 2)
        first = stamp_of(order)
        self.assertEqual(first, Stamp(sender=Sender(shop.sender, 0)))
        self.assertEqual(shop.sender.bytes[:8], bytes(8), "a short sender id")

        # The payments service consumed the order: its payment claims it.
        consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": uuid.uuid4().hex})
        service = CausalProducer({"bootstrap.servers": BOOTSTRAP}, timeout_s=TIMEOUT_S)
        service.observe(order, consumer)
        orders_id = service.topic_id(orders)
        order_at = Entry(Channel(orders_id, order.partition()), order.offset())
        service.send(payments, b"o-1", b"5")
        # A second send to another topic waits for the first one's acknowledgement and
        # claims its coordinate, with acked-through.
        service.send(orders, b"o-2", b"7")
        service.flush()
        [payment], _ = read_all(payments, 2)
        self.assertEqual(stamp_of(payment), Stamp(sender=Sender(service.sender, 0), clock=[order_at]))
        records, _ = read_all(orders, 2)
        [second] = [m for m in records if m.key() == b"o-2"]
        paid_at = Entry(
            Channel(service.topic_id(payments), payment.partition()), payment.offset()
        )
        got = stamp_of(second)
        self.assertEqual(got.sender, Sender(service.sender, 1))
        self.assertEqual(got.acked_through, 0)
        self.assertEqual(
            sorted(got.clock, key=lambda e: e.channel.sort_key()),
            sorted([order_at, paid_at], key=lambda e: e.channel.sort_key()),
        )
        consumer.close()

    def test_an_in_flight_claim_is_replaced_by_the_coordinate_below_the_high_watermark(self):
        source = create_topic("py-claimed", 1)
        relay = create_topic("py-relay", 1)
        plain = Producer({"bootstrap.servers": BOOTSTRAP})
        for i in range(3):
            plain.produce(source, key=b"k", value=str(i).encode())
        service = CausalProducer({"bootstrap.servers": BOOTSTRAP}, timeout_s=TIMEOUT_S)
        source_id = service.topic_id(source)
        # A transactional writer's record claiming its send to `source` in flight.
        claim = Stamp(
            sender=Sender(uuid.UUID(int=7), 5),
            in_flight=[InFlight(Channel(source_id, 0), 4)],
        )
        plain.produce(relay, key=b"k", value=b"x", headers=[("ps", codec.encode(claim))])
        plain.flush(TIMEOUT_S)
        [record], consumer = read_all(relay, 1)
        with self.assertRaises(StampError):
            service.observe(record)
        reader = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": uuid.uuid4().hex})
        service.observe(record, reader)
        self.assertIn(Entry(Channel(source_id, 0), 2), service.clock())
        reader.close()

    def test_a_record_whose_stamp_does_not_decode_is_named(self):
        topic = create_topic("py-bad", 1)
        plain = Producer({"bootstrap.servers": BOOTSTRAP})
        plain.produce(topic, key=b"k", value=b"v", headers=[("ps", b"\x30")])
        plain.flush(TIMEOUT_S)
        [record], _ = read_all(topic, 1)
        service = CausalProducer({"bootstrap.servers": BOOTSTRAP}, timeout_s=TIMEOUT_S)
        with self.assertRaises(StampError) as caught:
            service.observe(record)
        self.assertIn(f"{topic}/0@0", str(caught.exception))
        self.assertIn("unknown_version", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
