"""The stamp header's codec: format version 2 written, versions 2 and 1 read.

The grammar (the book's chapter *Clocks and stamps*)::

    stamp     := head:u8 [sender] [acked] clock [in_flight]
    head      := 0x20 | flags                  (version 1: the byte 1, then a flags byte)
    sender    := sender_id seq:varint          (iff flags bit 0; 8 bytes, or 16 with bit 3)
    acked     := seq - 1 - acked_through:varint (iff flags bit 2; version 1: acked_through)
    clock     := groups                        (values are offsets)
    in_flight := groups                        (iff flags bit 1; values are sequences)
    groups    := count:varint group*           (topic ids strictly ascending, as bytes)
    group     := topic_id:[u8; 16] n:varint (>= 1) entry*n
    entry     := partition_gap:varint value:varint|zigzag  (the first: partition, value)

Decoding is total: any input gives a :class:`Stamp` or raises :class:`DecodeError` with the
kind and the byte position Parsley's own decoder reports (the repository's
``spec/stamp-vectors.json`` is the reference). Counts in the header never size an
allocation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

#: The header a stamp is written under.
STAMP_HEADER = "ps"
#: The header name stamps were written under before format version 2 (still read).
LEGACY_STAMP_HEADER = "parsley.stamp"

_FLAG_SENDER = 0b0001
_FLAG_IN_FLIGHT = 0b0010
_FLAG_ACKED = 0b0100
_FLAG_LONG_SENDER = 0b1000
_KNOWN_V1 = _FLAG_SENDER | _FLAG_IN_FLIGHT | _FLAG_ACKED
_KNOWN_V2 = _KNOWN_V1 | _FLAG_LONG_SENDER
_HEAD_V2 = 0x20
_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1


def is_stamp_header(name: str) -> bool:
    """Whether a record header of this name carries a stamp."""
    return name in (STAMP_HEADER, LEGACY_STAMP_HEADER)


@dataclass(frozen=True, order=True)
class Channel:
    """A partition of a topic, the topic named by its Kafka topic id (a UUID)."""

    topic: uuid.UUID
    partition: int

    def sort_key(self) -> Tuple[bytes, int]:
        return (self.topic.bytes, self.partition)


@dataclass(frozen=True)
class Entry:
    """A clock entry: the highest offset claimed on a channel."""

    channel: Channel
    offset: int


@dataclass(frozen=True)
class InFlight:
    """A claim on every send of the stamp's sender to ``channel`` up to sequence ``seq``."""

    channel: Channel
    seq: int


@dataclass(frozen=True)
class Sender:
    """The sender's id (one per incarnation) and this send's sequence."""

    id: uuid.UUID
    seq: int


@dataclass(frozen=True)
class Stamp:
    """What a stamp header says: the sender and its sequence, acked-through, the clock (sorted
    by topic id as bytes, then partition) and the in-flight claims (sorted the same way)."""

    sender: Optional[Sender] = None
    acked_through: Optional[int] = None
    clock: List[Entry] = field(default_factory=list)
    in_flight: List[InFlight] = field(default_factory=list)


class DecodeError(ValueError):
    """Bytes that are not the canonical encoding of a valid stamp: ``kind`` (one of the names
    of the specification's ``malformed`` cases), ``at`` (the byte position) and, for
    ``unknown_version`` and ``unknown_flags``, ``value``."""

    def __init__(self, kind: str, at: int, value: Optional[int] = None):
        super().__init__(f"malformed stamp at byte {at}: {kind}" + (f" ({value})" if value is not None else ""))
        self.kind = kind
        self.at = at
        self.value = value


# --- encoding -----------------------------------------------------------------------------


def _varint(v: int, out: bytearray) -> None:
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _zigzag(v: int) -> int:
    return (v << 1) if v >= 0 else ((-v) << 1) - 1


def _groups(entries: List[Tuple[Channel, int]], out: bytearray) -> None:
    groups: List[Tuple[uuid.UUID, List[Tuple[int, int]]]] = []
    for channel, value in entries:
        if groups and groups[-1][0] == channel.topic:
            groups[-1][1].append((channel.partition, value))
        else:
            groups.append((channel.topic, [(channel.partition, value)]))
    _varint(len(groups), out)
    for topic, group in groups:
        out += topic.bytes
        _varint(len(group), out)
        (partition, value) = group[0]
        _varint(partition, out)
        _varint(value, out)
        for p, v in group[1:]:
            _varint(p - partition - 1, out)
            _varint(_zigzag(v - value), out)
            partition, value = p, v


def encode(stamp: Stamp) -> bytes:
    """The header value of ``stamp`` in format version 2.

    Raises :class:`ValueError` for a stamp that breaks the format's invariants (entries not
    sorted, acked-through or claims without a sender, sequences out of order)."""
    _validate(stamp, lambda kind: ValueError(f"not a valid stamp: {kind}"))
    flags = 0
    out = bytearray([0])
    if stamp.sender is not None:
        flags |= _FLAG_SENDER
        raw = stamp.sender.id.bytes
        if raw[:8] == bytes(8):
            out += raw[8:]
        else:
            flags |= _FLAG_LONG_SENDER
            out += raw
        _varint(stamp.sender.seq, out)
        if stamp.acked_through is not None:
            flags |= _FLAG_ACKED
            _varint(stamp.sender.seq - 1 - stamp.acked_through, out)
    _groups([(e.channel, e.offset) for e in stamp.clock], out)
    if stamp.in_flight:
        flags |= _FLAG_IN_FLIGHT
        _groups([(c.channel, c.seq) for c in stamp.in_flight], out)
    out[0] = _HEAD_V2 | flags
    return bytes(out)


def _validate(stamp: Stamp, fail) -> None:
    for name, items in (("clock", stamp.clock), ("in_flight", stamp.in_flight)):
        keys = [i.channel.sort_key() for i in items]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            raise fail(f"{name} not sorted")
    if any(e.offset < 0 or e.offset > _I64_MAX for e in stamp.clock):
        raise fail("offset_out_of_range")
    wrong = _invariants(stamp)
    if wrong is not None:
        raise fail(wrong)


def _invariants(stamp: Stamp) -> Optional[str]:
    """The kind of the invariant ``stamp`` breaks, or ``None``: in-flight claims and
    acked-through need a sender, and their sequences lie below the sender's own (claims above
    acked-through)."""
    if stamp.sender is None:
        if stamp.in_flight or stamp.acked_through is not None:
            return "claims_without_sender"
        return None
    seq = stamp.sender.seq
    if stamp.acked_through is not None and stamp.acked_through >= seq:
        return "inconsistent_sequences"
    for c in stamp.in_flight:
        if c.seq >= seq or (stamp.acked_through is not None and c.seq <= stamp.acked_through):
            return "inconsistent_sequences"
    return None


# --- decoding -----------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def remaining(self) -> int:
        return len(self.data) - self.at

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise DecodeError("truncated", self.at)
        b = self.data[self.at]
        self.at += 1
        return b

    def take(self, n: int) -> bytes:
        if self.remaining() < n:
            raise DecodeError("truncated", self.at)
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def varint(self) -> int:
        start = self.at
        v = 0
        for i in range(10):
            if start + i >= len(self.data):
                raise DecodeError("truncated", len(self.data))
            b = self.data[start + i]
            v |= (b & 0x7F) << (7 * i)
            if b < 0x80:
                if b == 0 and i > 0:
                    raise DecodeError("non_canonical_varint", start)
                if i == 9 and b > 1:
                    raise DecodeError("varint_overflow", start)
                self.at = start + i + 1
                return v
        raise DecodeError("varint_overflow", start)

    def groups(self, sequences: bool) -> List[Tuple[Channel, int]]:
        out_of_range = "sequence_out_of_range" if sequences else "offset_out_of_range"
        topics = self.varint()
        # Each group takes at least 19 bytes: a count is never trusted for allocation.
        if topics > self.remaining() // 19:
            raise DecodeError("truncated", self.at)
        entries: List[Tuple[Channel, int]] = []
        prev: Optional[bytes] = None
        for _ in range(topics):
            topic_at = self.at
            raw = self.take(16)
            if prev is not None and prev >= raw:
                raise DecodeError("unsorted_topics", topic_at)
            prev = raw
            topic = uuid.UUID(bytes=raw)
            n_at = self.at
            n = self.varint()
            if n == 0:
                raise DecodeError("empty_topic_group", n_at)
            if n > self.remaining() // 2:
                raise DecodeError("truncated", self.at)
            p_at = self.at
            partition = self.varint()
            if partition > _I32_MAX:
                raise DecodeError("partition_out_of_range", p_at)
            v_at = self.at
            value = self.varint()
            if value > _I64_MAX:
                raise DecodeError(out_of_range, v_at)
            entries.append((Channel(topic, partition), value))
            for _ in range(1, n):
                p_at = self.at
                gap = self.varint()
                v_at = self.at
                zig = self.varint()
                partition = partition + 1 + min(gap, 2**32 - 1)
                if partition > _I32_MAX:
                    raise DecodeError("partition_out_of_range", p_at)
                delta = (zig >> 1) ^ -(zig & 1)
                value = value + delta
                if value < 0 or value > _I64_MAX:
                    raise DecodeError(out_of_range, v_at)
                entries.append((Channel(topic, partition), value))
        return entries


def decode(data: bytes) -> Stamp:
    """The stamp a header value of format version 2 or 1 holds.

    Raises :class:`DecodeError` for anything else (never another exception)."""
    r = _Reader(bytes(data))
    head = r.byte()
    v2 = head & 0xF0 == _HEAD_V2
    if head == 1:
        flags = r.byte()
        if flags & ~_KNOWN_V1:
            raise DecodeError("unknown_flags", 1, flags)
    elif v2:
        flags = head & 0x0F
        if flags & ~_KNOWN_V2 or (flags & _FLAG_LONG_SENDER and not flags & _FLAG_SENDER):
            raise DecodeError("unknown_flags", 0, flags)
    else:
        raise DecodeError("unknown_version", 0, head if head < 0x10 else head >> 4)
    sender_at = r.at
    sender = None
    if flags & _FLAG_SENDER:
        if v2 and not flags & _FLAG_LONG_SENDER:
            raw = bytes(8) + r.take(8)
        else:
            raw = r.take(16)
            if v2 and raw[:8] == bytes(8):
                raise DecodeError("non_canonical_sender_id", sender_at)
        sender = Sender(uuid.UUID(bytes=raw), r.varint())
    acked_at = r.at
    acked_through = None
    if flags & _FLAG_ACKED:
        v = r.varint()
        if not v2:
            acked_through = v
        elif sender is None:
            raise DecodeError("claims_without_sender", acked_at)
        elif v >= sender.seq:
            raise DecodeError("inconsistent_sequences", acked_at)
        else:
            acked_through = sender.seq - 1 - v
    clock = [Entry(c, o) for c, o in r.groups(False)]
    in_flight_at = r.at
    in_flight: List[InFlight] = []
    if flags & _FLAG_IN_FLIGHT:
        claims = r.groups(True)
        if not claims:
            raise DecodeError("empty_topic_group", in_flight_at)
        in_flight = [InFlight(c, s) for c, s in claims]
    if r.remaining():
        raise DecodeError("trailing_bytes", r.at)
    stamp = Stamp(sender, acked_through, clock, in_flight)

    wrong = _invariants(stamp)
    if wrong is not None:
        at = acked_at if wrong == "claims_without_sender" or not flags & _FLAG_IN_FLIGHT else in_flight_at
        raise DecodeError(wrong, at)
    return stamp
