package dev.parsley.stamp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.Entry;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.Test;

/**
 * {@link CausalClock} as a service that chooses what its sends claim uses it, without the
 * interceptors: what it observes and what is acknowledged is in the stamps, a send to another
 * channel waits for the pending one, and a failed send refuses the next stamp.
 */
class CausalClockTest {
    private static final UUID ORDERS = UUID.fromString("0b2d4f6e-8a1c-4e3b-9d5f-7a6c8e0b1d2f");
    private static final UUID PAYMENTS = UUID.fromString("5c8e1a3f-2b7d-4c9e-8f1a-3d5b7e9c0a2e");

    @Test
    void aStampClaimsWhatWasObservedAndTheSendsAcknowledged() throws Exception {
        CausalClock clock = new CausalClock();
        assertEquals(0, clock.sender().getMostSignificantBits(), "a short sender id");
        Channel orders = new Channel(ORDERS, 1);
        Channel payments = new Channel(PAYMENTS, 0);
        // An order consumed at offset 7, stamped by its writer with a claim on offset 3 of another
        // channel: both are claimed; a claim chosen by hand too.
        Stamp writer = new Stamp(null, null, List.of(new Entry(new Channel(PAYMENTS, 2), 3)), List.of());
        clock.observe(orders, 7, writer);
        clock.claim(new Channel(ORDERS, 0), 11);

        Stamp first = clock.stamp(PAYMENTS, 0, 1_000);
        assertEquals(0, first.sender().seq());
        assertNull(first.ackedThrough());
        assertEquals(
                List.of(new Entry(new Channel(ORDERS, 0), 11), new Entry(orders, 7), new Entry(new Channel(PAYMENTS, 2), 3)),
                first.clock());
        // The header it makes is a valid stamp.
        assertEquals(first, StampCodec.decode(StampCodec.encode(first)));

        // A second send to the same channel does not wait; one to another channel waits for both.
        Stamp second = clock.stamp(PAYMENTS, 0, 1_000);
        assertEquals(1, second.sender().seq());
        assertThrows(IllegalStateException.class, () -> clock.stamp(ORDERS, 1, 50), "not acknowledged yet");
        clock.acknowledged(payments, 40, null);
        clock.acknowledged(payments, 41, null);
        Stamp third = clock.stamp(ORDERS, 1, 1_000);
        assertEquals(2, third.sender().seq());
        assertEquals(1L, third.ackedThrough());
        assertTrue(third.clock().contains(new Entry(payments, 41)), third.clock().toString());
        // The record's own channel is left out: its coordinate supersedes the entry.
        assertTrue(third.clock().stream().noneMatch(e -> e.channel().equals(orders)), third.clock().toString());
    }

    @Test
    void aFailedSendRefusesTheNextStamp() {
        CausalClock clock = new CausalClock();
        clock.stamp(PAYMENTS, 0, 1_000);
        clock.acknowledged(null, -1, "NOT_ENOUGH_REPLICAS");
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> clock.stamp(PAYMENTS, 0, 1_000));
        assertTrue(e.getMessage().contains("NOT_ENOUGH_REPLICAS"), e.getMessage());
    }
}
