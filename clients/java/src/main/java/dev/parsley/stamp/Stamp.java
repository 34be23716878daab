package dev.parsley.stamp;

import java.util.List;
import java.util.UUID;

/**
 * What a stamp header says: the sender and this send's sequence, acked-through, the clock and
 * the in-flight claims (both sorted by topic id as unsigned bytes, then partition).
 *
 * @param sender the sender, or {@code null}
 * @param ackedThrough every send of the sender up to this sequence was acknowledged before this
 *     one, or {@code null}
 * @param clock the highest offset claimed per channel
 * @param inFlight claims on every send of this stamp's sender to a channel up to a sequence
 */
public record Stamp(Sender sender, Long ackedThrough, List<Entry> clock, List<InFlight> inFlight) {

    /** A stamp; the lists are copied. */
    public Stamp {
        clock = List.copyOf(clock);
        inFlight = List.copyOf(inFlight);
    }

    /**
     * A partition of a topic, the topic named by its Kafka topic id.
     *
     * @param topic the topic id
     * @param partition the partition
     */
    public record Channel(UUID topic, int partition) implements Comparable<Channel> {
        @Override
        public int compareTo(Channel o) {
            int c = Long.compareUnsigned(topic.getMostSignificantBits(), o.topic.getMostSignificantBits());
            if (c == 0) {
                c = Long.compareUnsigned(topic.getLeastSignificantBits(), o.topic.getLeastSignificantBits());
            }
            return c != 0 ? c : Integer.compare(partition, o.partition);
        }
    }

    /**
     * A clock entry.
     *
     * @param channel the channel
     * @param offset the highest offset claimed on it
     */
    public record Entry(Channel channel, long offset) {}

    /**
     * An in-flight claim.
     *
     * @param channel the channel
     * @param seq every send of the stamp's sender to the channel up to this sequence
     */
    public record InFlight(Channel channel, long seq) {}

    /**
     * The sender of a stamped record.
     *
     * @param id the sender's id, one per incarnation
     * @param seq this send's sequence (unsigned 64 bits)
     */
    public record Sender(UUID id, long seq) {}
}
