package dev.parsley.stamp;

import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.Entry;
import dev.parsley.stamp.Stamp.InFlight;
import dev.parsley.stamp.Stamp.Sender;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;

/**
 * The stamp header's codec: format version 2 written, versions 2 and 1 read.
 *
 * <pre>
 * stamp     := head:u8 [sender] [acked] clock [in_flight]
 * head      := 0x20 | flags                   (version 1: the byte 1, then a flags byte)
 * sender    := sender_id seq:varint           (iff flags bit 0; 8 bytes, or 16 with bit 3)
 * acked     := seq - 1 - acked_through:varint (iff flags bit 2; version 1: acked_through)
 * clock     := groups                         (values are offsets)
 * in_flight := groups                         (iff flags bit 1; values are sequences)
 * groups    := count:varint group*            (topic ids strictly ascending, as bytes)
 * group     := topic_id:[u8; 16] n:varint (>= 1) entry*n
 * entry     := partition_gap:varint value:varint|zigzag (the first: partition, value)
 * </pre>
 *
 * <p>Decoding is total: any input gives a stamp or a {@link DecodeException} with the kind and
 * byte position Parsley's own decoder reports (the repository's {@code spec/stamp-vectors.json}
 * is the reference); counts in the header never size an allocation. Sequences are unsigned 64
 * bits held in {@code long}s.
 */
public final class StampCodec {
    /** The record header a stamp is written under. */
    public static final String STAMP_HEADER = "ps";
    /** The header name stamps were written under before format version 2 (still read). */
    public static final String LEGACY_STAMP_HEADER = "parsley.stamp";

    private static final int FLAG_SENDER = 0b0001;
    private static final int FLAG_IN_FLIGHT = 0b0010;
    private static final int FLAG_ACKED = 0b0100;
    private static final int FLAG_LONG_SENDER = 0b1000;
    private static final int KNOWN_V1 = FLAG_SENDER | FLAG_IN_FLIGHT | FLAG_ACKED;
    private static final int KNOWN_V2 = KNOWN_V1 | FLAG_LONG_SENDER;
    private static final int HEAD_V2 = 0x20;

    private StampCodec() {}

    /** Whether a record header of this name carries a stamp. */
    public static boolean isStampHeader(String name) {
        return STAMP_HEADER.equals(name) || LEGACY_STAMP_HEADER.equals(name);
    }

    // --- encoding ---------------------------------------------------------------------------

    /**
     * The header value of {@code stamp} in format version 2.
     *
     * @throws IllegalArgumentException for a stamp that breaks the format's invariants
     */
    public static byte[] encode(Stamp stamp) {
        validate(stamp);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(0);
        int flags = 0;
        if (stamp.sender() != null) {
            flags |= FLAG_SENDER;
            byte[] raw = bytes(stamp.sender().id());
            if (stamp.sender().id().getMostSignificantBits() == 0) {
                out.write(raw, 8, 8);
            } else {
                flags |= FLAG_LONG_SENDER;
                out.write(raw, 0, 16);
            }
            varint(stamp.sender().seq(), out);
            if (stamp.ackedThrough() != null) {
                flags |= FLAG_ACKED;
                varint(stamp.sender().seq() - 1 - stamp.ackedThrough(), out);
            }
        }
        List<long[]> clock = new ArrayList<>();
        List<Channel> clockChannels = new ArrayList<>();
        for (Entry e : stamp.clock()) {
            clockChannels.add(e.channel());
            clock.add(new long[] {e.offset()});
        }
        groups(clockChannels, clock, out);
        if (!stamp.inFlight().isEmpty()) {
            flags |= FLAG_IN_FLIGHT;
            List<Channel> channels = new ArrayList<>();
            List<long[]> seqs = new ArrayList<>();
            for (InFlight c : stamp.inFlight()) {
                channels.add(c.channel());
                seqs.add(new long[] {c.seq()});
            }
            groups(channels, seqs, out);
        }
        byte[] bytes = out.toByteArray();
        bytes[0] = (byte) (HEAD_V2 | flags);
        return bytes;
    }

    private static void validate(Stamp stamp) {
        for (int i = 1; i < stamp.clock().size(); i++) {
            if (stamp.clock().get(i - 1).channel().compareTo(stamp.clock().get(i).channel()) >= 0) {
                throw new IllegalArgumentException("the clock is not sorted");
            }
        }
        for (int i = 1; i < stamp.inFlight().size(); i++) {
            if (stamp.inFlight().get(i - 1).channel().compareTo(stamp.inFlight().get(i).channel()) >= 0) {
                throw new IllegalArgumentException("the in-flight claims are not sorted");
            }
        }
        for (Entry e : stamp.clock()) {
            if (e.offset() < 0) {
                throw new IllegalArgumentException("a negative offset");
            }
        }
        String wrong = invariants(stamp);
        if (wrong != null) {
            throw new IllegalArgumentException("not a valid stamp: " + wrong);
        }
    }

    /** The invariant {@code stamp} breaks, or {@code null}. */
    private static String invariants(Stamp stamp) {
        if (stamp.sender() == null) {
            return stamp.inFlight().isEmpty() && stamp.ackedThrough() == null ? null : "claims_without_sender";
        }
        long seq = stamp.sender().seq();
        Long acked = stamp.ackedThrough();
        if (acked != null && Long.compareUnsigned(acked, seq) >= 0) {
            return "inconsistent_sequences";
        }
        for (InFlight c : stamp.inFlight()) {
            if (Long.compareUnsigned(c.seq(), seq) >= 0
                    || (acked != null && Long.compareUnsigned(c.seq(), acked) <= 0)) {
                return "inconsistent_sequences";
            }
        }
        return null;
    }

    private static void groups(List<Channel> channels, List<long[]> values, ByteArrayOutputStream out) {
        int topics = 0;
        for (int i = 0; i < channels.size(); i++) {
            if (i == 0 || !channels.get(i).topic().equals(channels.get(i - 1).topic())) {
                topics++;
            }
        }
        varint(topics, out);
        int i = 0;
        while (i < channels.size()) {
            UUID topic = channels.get(i).topic();
            int end = i;
            while (end < channels.size() && channels.get(end).topic().equals(topic)) {
                end++;
            }
            out.write(bytes(topic), 0, 16);
            varint(end - i, out);
            int partition = channels.get(i).partition();
            long value = values.get(i)[0];
            varint(partition, out);
            varint(value, out);
            for (int j = i + 1; j < end; j++) {
                int p = channels.get(j).partition();
                long v = values.get(j)[0];
                varint((long) p - partition - 1, out);
                long delta = v - value;
                varint((delta << 1) ^ (delta >> 63), out);
                partition = p;
                value = v;
            }
            i = end;
        }
    }

    private static void varint(long v, ByteArrayOutputStream out) {
        while ((v & ~0x7FL) != 0) {
            out.write((int) ((v & 0x7F) | 0x80));
            v >>>= 7;
        }
        out.write((int) v);
    }

    private static byte[] bytes(UUID id) {
        return ByteBuffer.allocate(16)
                .putLong(id.getMostSignificantBits())
                .putLong(id.getLeastSignificantBits())
                .array();
    }

    // --- decoding ---------------------------------------------------------------------------

    /**
     * The stamp a header value of format version 2 or 1 holds.
     *
     * @throws DecodeException for anything else (never another exception)
     */
    public static Stamp decode(byte[] data) throws DecodeException {
        Reader r = new Reader(data);
        int head = r.u8();
        boolean v2 = (head & 0xF0) == HEAD_V2;
        int flags;
        if (head == 1) {
            flags = r.u8();
            if ((flags & ~KNOWN_V1) != 0) {
                throw new DecodeException("unknown_flags", 1, flags);
            }
        } else if (v2) {
            flags = head & 0x0F;
            if ((flags & ~KNOWN_V2) != 0
                    || ((flags & FLAG_LONG_SENDER) != 0 && (flags & FLAG_SENDER) == 0)) {
                throw new DecodeException("unknown_flags", 0, flags);
            }
        } else {
            throw new DecodeException("unknown_version", 0, head < 0x10 ? head : head >> 4);
        }
        int senderAt = r.at;
        Sender sender = null;
        if ((flags & FLAG_SENDER) != 0) {
            byte[] raw = new byte[16];
            if (v2 && (flags & FLAG_LONG_SENDER) == 0) {
                System.arraycopy(r.take(8), 0, raw, 8, 8);
            } else {
                raw = r.take(16);
                if (v2 && Arrays.equals(raw, 0, 8, new byte[8], 0, 8)) {
                    throw new DecodeException("non_canonical_sender_id", senderAt);
                }
            }
            ByteBuffer b = ByteBuffer.wrap(raw);
            UUID id = new UUID(b.getLong(), b.getLong());
            sender = new Sender(id, r.varint());
        }
        int ackedAt = r.at;
        Long ackedThrough = null;
        if ((flags & FLAG_ACKED) != 0) {
            long v = r.varint();
            if (!v2) {
                ackedThrough = v;
            } else if (sender == null) {
                throw new DecodeException("claims_without_sender", ackedAt);
            } else if (Long.compareUnsigned(v, sender.seq()) >= 0) {
                throw new DecodeException("inconsistent_sequences", ackedAt);
            } else {
                ackedThrough = sender.seq() - 1 - v;
            }
        }
        List<Entry> clock = new ArrayList<>();
        r.groups(false, (channel, value) -> clock.add(new Entry(channel, value)));
        int inFlightAt = r.at;
        List<InFlight> inFlight = new ArrayList<>();
        if ((flags & FLAG_IN_FLIGHT) != 0) {
            r.groups(true, (channel, value) -> inFlight.add(new InFlight(channel, value)));
            if (inFlight.isEmpty()) {
                throw new DecodeException("empty_topic_group", inFlightAt);
            }
        }
        if (r.remaining() != 0) {
            throw new DecodeException("trailing_bytes", r.at);
        }
        Stamp stamp = new Stamp(sender, ackedThrough, clock, inFlight);
        String wrong = invariants(stamp);
        if (wrong != null) {
            boolean atAcked = wrong.equals("claims_without_sender") || (flags & FLAG_IN_FLIGHT) == 0;
            throw new DecodeException(wrong, atAcked ? ackedAt : inFlightAt);
        }
        return stamp;
    }

    private interface Sink {
        void accept(Channel channel, long value);
    }

    private static final class Reader {
        private final byte[] data;
        private int at;

        Reader(byte[] data) {
            this.data = data;
        }

        int remaining() {
            return data.length - at;
        }

        int u8() throws DecodeException {
            if (at >= data.length) {
                throw new DecodeException("truncated", at);
            }
            return data[at++] & 0xFF;
        }

        byte[] take(int n) throws DecodeException {
            if (remaining() < n) {
                throw new DecodeException("truncated", at);
            }
            byte[] out = Arrays.copyOfRange(data, at, at + n);
            at += n;
            return out;
        }

        long varint() throws DecodeException {
            int start = at;
            long v = 0;
            for (int i = 0; i < 10; i++) {
                if (start + i >= data.length) {
                    throw new DecodeException("truncated", data.length);
                }
                int b = data[start + i] & 0xFF;
                v |= (long) (b & 0x7F) << (7 * i);
                if (b < 0x80) {
                    if (b == 0 && i > 0) {
                        throw new DecodeException("non_canonical_varint", start);
                    }
                    if (i == 9 && b > 1) {
                        throw new DecodeException("varint_overflow", start);
                    }
                    at = start + i + 1;
                    return v;
                }
            }
            throw new DecodeException("varint_overflow", start);
        }

        void groups(boolean sequences, Sink sink) throws DecodeException {
            String outOfRange = sequences ? "sequence_out_of_range" : "offset_out_of_range";
            long topics = varint();
            // Each group takes at least 19 bytes: a count is never trusted for allocation.
            if (Long.compareUnsigned(topics, remaining() / 19) > 0) {
                throw new DecodeException("truncated", at);
            }
            byte[] prev = null;
            for (long t = 0; t < topics; t++) {
                int topicAt = at;
                byte[] raw = take(16);
                if (prev != null && Arrays.compareUnsigned(prev, raw) >= 0) {
                    throw new DecodeException("unsorted_topics", topicAt);
                }
                prev = raw;
                ByteBuffer b = ByteBuffer.wrap(raw);
                UUID topic = new UUID(b.getLong(), b.getLong());
                int nAt = at;
                long n = varint();
                if (n == 0) {
                    throw new DecodeException("empty_topic_group", nAt);
                }
                if (Long.compareUnsigned(n, remaining() / 2) > 0) {
                    throw new DecodeException("truncated", at);
                }
                int pAt = at;
                long partition = varint();
                if (Long.compareUnsigned(partition, Integer.MAX_VALUE) > 0) {
                    throw new DecodeException("partition_out_of_range", pAt);
                }
                int vAt = at;
                long value = varint();
                if (value < 0) {
                    throw new DecodeException(outOfRange, vAt);
                }
                sink.accept(new Channel(topic, (int) partition), value);
                for (long i = 1; i < n; i++) {
                    pAt = at;
                    long gap = varint();
                    vAt = at;
                    long zig = varint();
                    if (Long.compareUnsigned(gap, 0xFFFF_FFFFL) > 0) {
                        gap = 0xFFFF_FFFFL;
                    }
                    partition = partition + 1 + gap;
                    if (partition > Integer.MAX_VALUE) {
                        throw new DecodeException("partition_out_of_range", pAt);
                    }
                    long delta = (zig >>> 1) ^ -(zig & 1);
                    long next = value + delta;
                    // Overflow (a positive delta past the range) or a negative value.
                    if ((delta > 0 && next < value) || next < 0) {
                        throw new DecodeException(outOfRange, vAt);
                    }
                    value = next;
                    sink.accept(new Channel(topic, (int) partition), value);
                }
            }
        }
    }
}
