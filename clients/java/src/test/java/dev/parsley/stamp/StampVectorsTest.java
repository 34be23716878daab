package dev.parsley.stamp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.Entry;
import dev.parsley.stamp.Stamp.InFlight;
import dev.parsley.stamp.Stamp.Sender;
import java.io.File;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import java.util.UUID;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The codec against the repository's test vectors: every {@code encode} case byte for byte and
 * back, every {@code decode} case, every {@code malformed} case rejected with its kind,
 * position and value, and mutated headers that decode to a canonical stamp or to an error.
 */
class StampVectorsTest {
    private static JsonNode vectors;

    @BeforeAll
    static void read() throws Exception {
        vectors = new ObjectMapper().readTree(new File(System.getProperty("stamp.vectors")));
    }

    static Stamp stampOf(JsonNode j) {
        JsonNode s = j.get("sender");
        Sender sender = s.isNull()
                ? null
                : new Sender(UUID.fromString(s.get("id").asText()), Long.parseUnsignedLong(s.get("seq").asText()));
        Long acked = j.get("acked_through").isNull() ? null : Long.parseUnsignedLong(j.get("acked_through").asText());
        List<Entry> clock = new ArrayList<>();
        for (JsonNode e : j.get("clock")) {
            clock.add(new Entry(channel(e), Long.parseLong(e.get("offset").asText())));
        }
        List<InFlight> inFlight = new ArrayList<>();
        for (JsonNode c : j.get("in_flight")) {
            inFlight.add(new InFlight(channel(c), Long.parseUnsignedLong(c.get("seq").asText())));
        }
        return new Stamp(sender, acked, clock, inFlight);
    }

    static Channel channel(JsonNode e) {
        return new Channel(UUID.fromString(e.get("topic").asText()), e.get("partition").asInt());
    }

    static byte[] hex(JsonNode c) {
        return HexFormat.of().parseHex(c.get("bytes").asText());
    }

    @Test
    void theHeaderNames() {
        assertEquals(vectors.get("header").asText(), StampCodec.STAMP_HEADER);
        assertEquals(vectors.get("legacy_headers").get(0).asText(), StampCodec.LEGACY_STAMP_HEADER);
    }

    @Test
    void encodeCasesAreWrittenByteForByteAndReadBack() throws Exception {
        assertEquals(21, vectors.get("encode").size());
        for (JsonNode c : vectors.get("encode")) {
            Stamp stamp = stampOf(c.get("stamp"));
            assertArrayEquals(hex(c), StampCodec.encode(stamp), c.get("name").asText());
            assertEquals(stamp, StampCodec.decode(hex(c)), c.get("name").asText());
        }
    }

    @Test
    void decodeCasesAreRead() throws Exception {
        for (JsonNode c : vectors.get("decode")) {
            assertEquals(stampOf(c.get("stamp")), StampCodec.decode(hex(c)), c.get("name").asText());
        }
    }

    @Test
    void malformedCasesAreRejectedWithTheirKindAndPosition() {
        assertEquals(43, vectors.get("malformed").size());
        for (JsonNode c : vectors.get("malformed")) {
            String name = c.get("name").asText();
            DecodeException e = assertThrows(DecodeException.class, () -> StampCodec.decode(hex(c)), name);
            JsonNode want = c.get("error");
            assertEquals(want.get("kind").asText(), e.kind(), name);
            assertEquals(want.get("at").asInt(), e.at(), name);
            assertEquals(want.has("value") ? Integer.valueOf(want.get("value").asInt()) : null, e.value(), name);
        }
    }

    @Test
    void mutatedHeadersDecodeToACanonicalStampOrToADecodeError() {
        Random rng = new Random(7);
        List<byte[]> seeds = new ArrayList<>();
        vectors.get("encode").forEach(c -> seeds.add(hex(c)));
        for (int i = 0; i < 20_000; i++) {
            List<Byte> data = new ArrayList<>();
            for (byte b : seeds.get(rng.nextInt(seeds.size()))) {
                data.add(b);
            }
            int edits = 1 + rng.nextInt(4);
            for (int k = 0; k < edits; k++) {
                if (!data.isEmpty() && rng.nextDouble() < 0.7) {
                    data.set(rng.nextInt(data.size()), (byte) rng.nextInt(256));
                } else {
                    data.add(rng.nextInt(data.size() + 1), (byte) rng.nextInt(256));
                }
            }
            byte[] bytes = new byte[data.size()];
            for (int k = 0; k < bytes.length; k++) {
                bytes[k] = data.get(k);
            }
            Stamp stamp;
            try {
                stamp = StampCodec.decode(bytes);
            } catch (DecodeException e) {
                continue;
            }
            if ((bytes[0] & 0xF0) == 0x20) {
                assertArrayEquals(bytes, StampCodec.encode(stamp));
            }
        }
    }
}
