"""A producer that stamps what it sends, over ``confluent-kafka``: the Python counterpart of
Parsley's Rust ``CausalProducer``, for a service that is not transactional.

What it does, as the specification's conforming stamper (the book's *Clocks and stamps*):

1. **observes what it consumed** (:meth:`CausalProducer.observe`): merges the record's stamp
   clock into its own and claims the record's coordinate; an in-flight claim of the record's
   stamp (a transactional writer's send not acknowledged when it stamped) is replaced by the
   coordinate just below the claimed channel's high watermark, read now;
2. **stamps every record it sends** with its sender id (eight random bytes per instance), a
   send sequence from 0, its clock and its acked-through sequence;
3. **makes no in-flight claims** (it is not transactional): before a send to another channel
   than the sends still waiting for their acknowledgement, it waits for them, so the stamp
   claims their coordinates;
4. **names topics by their Kafka topic id**, read with the admin client.

Idempotence is required (``enable.idempotence`` is set), and keys are placed with
``murmur2_random``, the partitioner of Kafka's Java clients and of Parsley's stages, unless the
configuration says otherwise.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Callable, Dict, List, Optional, Tuple

from confluent_kafka import Consumer, Message, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from .codec import (
    STAMP_HEADER,
    Channel,
    Entry,
    Sender,
    Stamp,
    decode,
    encode,
    is_stamp_header,
)


def _uuid_of(kafka_uuid) -> uuid.UUID:
    """A ``confluent_kafka`` topic id as a :class:`uuid.UUID`."""
    msb = kafka_uuid.get_most_significant_bits() & 0xFFFFFFFFFFFFFFFF
    lsb = kafka_uuid.get_least_significant_bits() & 0xFFFFFFFFFFFFFFFF
    return uuid.UUID(int=(msb << 64) | lsb)


class StampError(RuntimeError):
    """A send or an observation the stamper cannot make true: a topic it cannot name by id,
    a send that was not acknowledged, a record whose stamp does not decode."""


class CausalProducer:
    """A ``confluent_kafka.Producer`` whose every record carries a stamp (module docs).

    ``config`` is the producer's configuration (``bootstrap.servers`` and any other setting);
    ``timeout_s`` bounds each wait for acknowledgements and each admin call."""

    def __init__(self, config: Dict[str, str], timeout_s: float = 30.0):
        settings = {"partitioner": "murmur2_random", **config, "enable.idempotence": True}
        self._producer = Producer(settings)
        admin = {k: v for k, v in config.items() if not k.startswith(("linger", "batch", "acks"))}
        self._admin = AdminClient(admin)
        self._timeout = timeout_s
        # A short sender id: eight random bytes after eight zero bytes.
        self._sender = uuid.UUID(bytes=bytes(8) + secrets.token_bytes(8))
        self._seq = 0
        self._clock: Dict[Channel, int] = {}
        self._ids: Dict[str, uuid.UUID] = {}
        self._names: Dict[uuid.UUID, str] = {}
        # Sends not acknowledged yet: seq -> (topic, partition if chosen), and the sequences
        # acknowledged beyond acked-through.
        self._pending: Dict[int, Tuple[str, Optional[int]]] = {}
        self._acked: List[int] = []
        self._acked_through: Optional[int] = None
        self._failed: Optional[str] = None

    @property
    def sender(self) -> uuid.UUID:
        """This instance's sender id."""
        return self._sender

    def clock(self) -> List[Entry]:
        """The clock the next stamp carries, sorted."""
        return [
            Entry(c, o) for c, o in sorted(self._clock.items(), key=lambda i: i[0].sort_key())
        ]

    def topic_id(self, topic: str) -> uuid.UUID:
        """The Kafka topic id of ``topic`` (read once, with the admin client)."""
        if topic not in self._ids:
            self._describe([topic])
        return self._ids[topic]

    def _describe(self, topics: List[str]) -> None:
        futures = self._admin.describe_topics(TopicCollection(topics))
        for name, future in futures.items():
            try:
                description = future.result(timeout=self._timeout)
            except Exception as e:  # the client's KafkaException, or a timeout
                raise StampError(f"cannot read the topic id of {name!r}: {e}") from e
            tid = _uuid_of(description.topic_id)
            self._ids[name] = tid
            self._names[tid] = name

    def _name_of(self, topic_id: uuid.UUID) -> str:
        if topic_id not in self._names:
            listed = self._admin.list_topics(timeout=self._timeout).topics
            self._describe([t for t in listed if t not in self._ids])
        if topic_id not in self._names:
            raise StampError(f"no topic has the id {topic_id} (deleted?)")
        return self._names[topic_id]

    def _merge(self, channel: Channel, offset: int) -> None:
        if self._clock.get(channel, -1) < offset:
            self._clock[channel] = offset

    def observe(self, message: Message, consumer: Optional[Consumer] = None) -> None:
        """Claims a record this service consumed: its coordinate and its stamp's clock.

        ``consumer`` reads the high watermark of a channel the record's stamp claims in flight
        (a transactional writer's send); without it such a claim raises :class:`StampError`.
        Raises :class:`StampError` for a stamp that does not decode."""
        channel = Channel(self.topic_id(message.topic()), message.partition())
        for name, value in message.headers() or []:
            if not is_stamp_header(name):
                continue
            try:
                stamp = decode(value or b"")
            except ValueError as e:
                raise StampError(
                    f"{message.topic()}/{message.partition()}@{message.offset()}: "
                    f"header {name!r}: {e}"
                ) from e
            for entry in stamp.clock:
                self._merge(entry.channel, entry.offset)
            for claim in stamp.in_flight:
                if consumer is None:
                    raise StampError(
                        "the record claims a send in flight: observe it with its consumer, "
                        "which reads that channel's high watermark"
                    )
                name_of = self._name_of(claim.channel.topic)
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(name_of, claim.channel.partition), timeout=self._timeout
                )
                if high > 0:
                    self._merge(claim.channel, high - 1)
            break
        self._merge(channel, message.offset())

    def _on_delivery(self, seq: int) -> Callable:
        def report(err, msg):
            topic, _ = self._pending.pop(seq, (msg.topic(), None))
            if err is not None:
                self._failed = f"send {seq} to {topic!r} failed: {err}"
                return
            self._merge(Channel(self._ids[msg.topic()], msg.partition()), msg.offset())
            self._acked.append(seq)
            self._acked.sort()
            nxt = 0 if self._acked_through is None else self._acked_through + 1
            while self._acked and self._acked[0] <= nxt:
                if self._acked[0] == nxt:
                    self._acked_through = nxt
                    nxt += 1
                self._acked.pop(0)

        return report

    def flush(self) -> None:
        """Waits until every send is acknowledged. Raises :class:`StampError` for one that
        failed or did not come back in time."""
        left = self._producer.flush(self._timeout)
        if self._failed is not None:
            raise StampError(self._failed)
        if left or self._pending:
            raise StampError(f"{len(self._pending)} sends not acknowledged in {self._timeout} s")

    def send(
        self,
        topic: str,
        key: Optional[bytes],
        value: Optional[bytes],
        partition: Optional[int] = None,
        headers: Optional[List[Tuple[str, bytes]]] = None,
        timestamp_ms: Optional[int] = None,
    ) -> int:
        """Stamps and sends a record; returns its send sequence. A send to another channel
        than the sends still waiting for their acknowledgement waits for them first (module
        docs). ``headers`` come after the stamp; none may be named as it is."""
        if self._failed is not None:
            raise StampError(self._failed)
        target = self.topic_id(topic)
        # Records to one channel are appended in send order (idempotence): only sends to other
        # channels, or to a partition not chosen yet, must be acknowledged first.
        if self._pending and (
            partition is None or any(c != (topic, partition) for c in self._pending.values())
        ):
            self.flush()
        seq = self._seq
        self._seq += 1
        clock = self.clock()
        if partition is not None:
            # The record's own coordinate supersedes its channel's entry.
            clock = [e for e in clock if e.channel != Channel(target, partition)]
        stamp = Stamp(
            sender=Sender(self._sender, seq),
            acked_through=self._acked_through,
            clock=clock,
        )
        extra = list(headers or [])
        if any(is_stamp_header(name) for name, _ in extra):
            raise StampError("a header of the record is named as the stamp's")
        kwargs = {"key": key, "value": value, "headers": [(STAMP_HEADER, encode(stamp))] + extra}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        self._pending[seq] = (topic, partition)
        self._producer.produce(topic, on_delivery=self._on_delivery(seq), **kwargs)
        self._producer.poll(0)
        return seq
