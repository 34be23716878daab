package dev.parsley.conformance;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.test.TestRecord;

/**
 * The Kafka Streams side of {@code cargo xtask conformance}: one scenario per line of standard
 * input, one result per line of standard output, until standard input ends.
 *
 * <p>A scenario is {@code {"op": {"name": ..., params}, "inputs": [{"topic", "key", "value",
 * "ts"}, ...]}}: an operator of the {@link Catalogue} with its parameters, and the records to
 * pipe, in order ({@code null} key or value: absent; {@code ts}: ms since the epoch). Each
 * scenario runs in a new {@link TopologyTestDriver} with Kafka Streams' defaults (the record
 * cache on), except that final window results and left and outer join results are not
 * throttled by wall-clock time (see {@link #run}), and that stores are in memory (the
 * built-in in-memory stores: the same semantics as RocksDB's, ten times faster to open) but
 * for a session aggregation that emits on window close: the in-memory session store cannot
 * serve its time-ordered range scan, and such an aggregation then emits nothing at all.
 *
 * <p>A result is {@code {"outputs": {topic: [{"key", "value", "ts"}, ...]}, "error": null}}:
 * every record of every output topic of the operator, in order, keys and values rendered as
 * text ({@link Catalogue.Output}); or {@code "error": "..."} when the topology failed.
 *
 * Exit codes: 0 at the end of input, 1 on a line that is not a scenario.
 */
public final class Main {
    private Main() {}

    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        Path stateDir = Files.createTempDirectory("parsley-ks-conformance");
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode scenario;
                try {
                    scenario = JSON.readTree(line);
                } catch (Exception e) {
                    System.err.println("kafka-streams: not a scenario: " + e.getMessage());
                    System.exit(1);
                    return;
                }
                out.println(JSON.writeValueAsString(run(scenario, stateDir)));
                out.flush();
            }
        } finally {
            deleteTree(stateDir);
        }
    }

    /** Runs one scenario: its result object. */
    static ObjectNode run(JsonNode scenario, Path stateDir) {
        ObjectNode result = JSON.createObjectNode();
        Catalogue.Built built;
        try {
            built = Catalogue.build(scenario.get("op"));
        } catch (RuntimeException e) {
            result.putNull("outputs");
            result.put("error", "no topology: " + e);
            return result;
        }
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "conformance");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        JsonNode op = scenario.get("op");
        boolean sessionOnClose = op.get("name").asText().equals("session")
                && !op.get("updates").asBoolean();
        if (!sessionOnClose) {
            props.put(StreamsConfig.DSL_STORE_SUPPLIERS_CLASS_CONFIG,
                    org.apache.kafka.streams.state.BuiltInDslStoreSuppliers.InMemoryDslStoreSuppliers.class);
        }
        // Final results of windows (EmitStrategy.onWindowClose) are emitted at most once per
        // interval of wall-clock time, 1 s by default; the test driver's wall clock stands
        // still, so every check is let through, as on a clock that has moved past the interval.
        props.put(StreamsConfig.InternalConfig.EMIT_INTERVAL_MS_KSTREAMS_WINDOWED_AGGREGATION, 0L);
        // The same throttle holds back the left and outer results of stream-stream joins.
        props.put(StreamsConfig.InternalConfig.EMIT_INTERVAL_MS_KSTREAMS_OUTER_JOIN_SPURIOUS_RESULTS_FIX, 0L);
        Map<String, TestOutputTopic<String, String>> outputs = new LinkedHashMap<>();
        ObjectNode rendered = JSON.createObjectNode();
        try (TopologyTestDriver driver = new TopologyTestDriver(built.topology(), props)) {
            Map<String, TestInputTopic<String, String>> inputs = new LinkedHashMap<>();
            for (String topic : built.inputs()) {
                inputs.put(topic, driver.createInputTopic(topic, new StringSerializer(),
                        new StringSerializer()));
            }
            for (Map.Entry<String, Catalogue.Output> o : built.outputs().entrySet()) {
                outputs.put(o.getKey(), o.getValue().topic(driver, o.getKey()));
            }
            String error = null;
            try {
                for (JsonNode r : scenario.get("inputs")) {
                    TestInputTopic<String, String> topic = inputs.get(r.get("topic").asText());
                    if (topic == null) {
                        throw new IllegalArgumentException(
                                "the operator reads no topic " + r.get("topic"));
                    }
                    topic.pipeInput(new TestRecord<>(text(r.get("key")), text(r.get("value")),
                            null, r.get("ts").asLong()));
                }
            } catch (RuntimeException e) {
                error = rootCause(e);
            }
            for (Map.Entry<String, TestOutputTopic<String, String>> o : outputs.entrySet()) {
                ArrayNode records = rendered.putArray(o.getKey());
                List<TestRecord<String, String>> read = o.getValue().readRecordsToList();
                for (TestRecord<String, String> r : read) {
                    ObjectNode record = records.addObject();
                    record.put("key", r.key());
                    record.put("value", r.value());
                    record.put("ts", r.timestamp());
                }
            }
            if (built.collected() != null) {
                ArrayNode records = rendered.putArray("out");
                for (String[] r : built.collected()) {
                    ObjectNode record = records.addObject();
                    record.put("key", r[0]);
                    record.put("value", r[1]);
                    record.put("ts", 0L);
                }
            }
            result.set("outputs", rendered);
            if (error == null) {
                result.putNull("error");
            } else {
                result.put("error", error);
            }
        } catch (RuntimeException e) {
            result.putNull("outputs");
            result.put("error", rootCause(e));
        }
        return result;
    }

    private static String text(JsonNode node) {
        return node == null || node.isNull() ? null : node.asText();
    }

    private static String rootCause(Throwable e) {
        Throwable cause = e;
        while (cause.getCause() != null && cause.getCause() != cause) {
            cause = cause.getCause();
        }
        return cause.getClass().getSimpleName() + ": " + cause.getMessage();
    }

    private static void deleteTree(Path root) {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (Exception ignored) {
            // A temporary directory: the operating system removes what is left.
        }
    }
}
