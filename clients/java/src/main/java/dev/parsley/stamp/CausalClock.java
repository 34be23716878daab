package dev.parsley.stamp;

import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.Entry;
import dev.parsley.stamp.Stamp.Sender;
import java.security.SecureRandom;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A node clock for a service that is not transactional, as the specification's conforming
 * stamper keeps it: what the service observed (each consumed record's coordinate and its
 * stamp's clock), its own acknowledged sends, and its send sequence and acked-through. It makes
 * no in-flight claims: {@link #stamp} first waits for the acknowledgements of the sends still
 * pending unless the new record goes to their channel, so every claim is a coordinate.
 *
 * <p>Shared by the interceptors of one consume-produce pair through {@link #named}: the consumer
 * side observes, the producer side stamps and learns acknowledgements. Thread-safe.
 */
public final class CausalClock {
    private static final Map<String, CausalClock> SHARED = new ConcurrentHashMap<>();

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition acked = lock.newCondition();
    private final UUID sender;
    private final TreeMap<Channel, Long> clock = new TreeMap<>();
    private long nextSeq;
    private Long ackedThrough;
    /** Sends not acknowledged yet, in send order: all to one channel (or one whose partition
     *  the producer chooses). */
    private final Deque<Pending> pending = new ArrayDeque<>();
    private final List<Long> ackedAhead = new ArrayList<>();
    private String failed;

    private record Pending(long seq, UUID topic, Integer partition) {}

    /** A clock with a fresh short sender id. */
    public CausalClock() {
        SecureRandom random = new SecureRandom();
        this.sender = new UUID(0, random.nextLong());
    }

    /** The clock shared under {@code name} in this JVM (created on first use). */
    public static CausalClock named(String name) {
        return SHARED.computeIfAbsent(name, n -> new CausalClock());
    }

    /** This clock's sender id. */
    public UUID sender() {
        return sender;
    }

    /** The clock's entries now, sorted. */
    public List<Entry> entries() {
        lock.lock();
        try {
            List<Entry> out = new ArrayList<>();
            clock.forEach((c, o) -> out.add(new Entry(c, o)));
            return out;
        } finally {
            lock.unlock();
        }
    }

    /** Claims {@code offset} on {@code channel} (and every offset below it). */
    public void claim(Channel channel, long offset) {
        lock.lock();
        try {
            clock.merge(channel, offset, Math::max);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Observes a consumed record at {@code channel}/{@code offset} with stamp {@code stamp}
     * ({@code null}: unstamped): its coordinate and its stamp's clock. In-flight claims are the
     * caller's to replace ({@link #claim}, with the coordinate below the claimed channel's high
     * watermark).
     */
    public void observe(Channel channel, long offset, Stamp stamp) {
        lock.lock();
        try {
            if (stamp != null) {
                for (Entry e : stamp.clock()) {
                    clock.merge(e.channel(), e.offset(), Math::max);
                }
            }
            clock.merge(channel, offset, Math::max);
        } finally {
            lock.unlock();
        }
    }

    /**
     * The stamp of the next send, to {@code topic} and {@code partition} ({@code null}: chosen
     * by the producer after this call), registered as pending. Waits first for the
     * acknowledgements of pending sends to another channel, or of any when the partition is
     * not chosen yet.
     *
     * @throws IllegalStateException when an earlier send failed, or its acknowledgement does
     *     not come within {@code timeoutMs}
     */
    public Stamp stamp(UUID topic, Integer partition, long timeoutMs) {
        lock.lock();
        try {
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
            while (failed == null && !pending.isEmpty()
                    && (partition == null || pending.stream().anyMatch(
                            p -> !p.topic.equals(topic) || !partition.equals(p.partition)))) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new IllegalStateException(pending.size() + " sends not acknowledged in " + timeoutMs + " ms");
                }
                acked.awaitNanos(left);
            }
            if (failed != null) {
                throw new IllegalStateException(failed);
            }
            long seq = nextSeq++;
            List<Entry> entries = new ArrayList<>();
            clock.forEach((c, o) -> {
                if (partition == null || !c.equals(new Channel(topic, partition))) {
                    entries.add(new Entry(c, o));
                }
            });
            pending.addLast(new Pending(seq, topic, partition));
            return new Stamp(new Sender(sender, seq), ackedThrough, entries, List.of());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while waiting for acknowledgements", e);
        } finally {
            lock.unlock();
        }
    }

    /**
     * The oldest pending send was acknowledged at {@code channel}/{@code offset}, or failed
     * ({@code error} not {@code null}: every later stamp is refused).
     */
    public void acknowledged(Channel channel, long offset, String error) {
        lock.lock();
        try {
            Pending p = pending.pollFirst();
            if (p == null) {
                return;
            }
            if (error != null) {
                failed = "send " + p.seq + " failed: " + error;
            } else {
                clock.merge(channel, offset, Math::max);
                ackedAhead.add(p.seq);
                ackedAhead.sort(Long::compare);
                long next = ackedThrough == null ? 0 : ackedThrough + 1;
                while (!ackedAhead.isEmpty() && ackedAhead.get(0) <= next) {
                    if (ackedAhead.get(0) == next) {
                        ackedThrough = next;
                        next++;
                    }
                    ackedAhead.remove(0);
                }
            }
            acked.signalAll();
        } finally {
            lock.unlock();
        }
    }
}
