package dev.parsley.conformance;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.BranchedKStream;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KGroupedTable;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.KeyValueMapper;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindowedDeserializer;
import org.apache.kafka.streams.kstream.SessionWindowedKStream;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedDeserializer;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The catalogue of operators the conformance harness compares: for each, the Kafka Streams
 * topology that is the reference for Parsley's operator of the same name. The Rust side of the
 * harness holds the same catalogue (its {@code catalogue.rs}); both read the input topics
 * {@code left} and {@code right} and write {@code out} ({@code out-0..2} for {@code split},
 * {@code out-} and each branch's name for a named split; a {@code foreach}'s records are
 * collected and read as {@code out}),
 * with String keys and values, and apply the same functions ({@link Fns}).
 */
final class Catalogue {
    private Catalogue() {}

    /**
     * A topology, the topics it reads, how each output topic is read, and the records a
     * {@code foreach} was called with ({@code null} without one: key and value of each, read
     * as the output topic {@code out} with timestamp 0).
     */
    record Built(Topology topology, List<String> inputs, Map<String, Output> outputs,
            List<String[]> collected) {}

    /** How an output topic's keys and values are decoded and rendered as text. */
    enum KeyKind { TEXT, TIME_WINDOWED, SESSION_WINDOWED }

    /** How an output topic is read. */
    record Output(KeyKind key, boolean longValue, long windowSize) {
        TestOutputTopic<String, String> topic(TopologyTestDriver driver, String name) {
            Deserializer<String> keys = switch (key) {
                case TEXT -> new StringDeserializer();
                case TIME_WINDOWED -> windowed(new TimeWindowedDeserializer<>(
                        new StringDeserializer(), windowSize));
                case SESSION_WINDOWED -> windowed(new SessionWindowedDeserializer<>(
                        new StringDeserializer()));
            };
            Deserializer<String> values = longValue
                    ? rendered(new LongDeserializer())
                    : new StringDeserializer();
            return driver.createOutputTopic(name, keys, values);
        }
    }

    private static final Output TEXT = new Output(KeyKind.TEXT, false, 0);
    private static final Output LONG = new Output(KeyKind.TEXT, true, 0);

    /** A windowed key rendered {@code key@start/end}. */
    private static Deserializer<String> windowed(Deserializer<Windowed<String>> inner) {
        return (topic, data) -> {
            if (data == null) {
                return null;
            }
            Windowed<String> w = inner.deserialize(topic, data);
            return w.key() + "@" + w.window().start() + "/" + w.window().end();
        };
    }

    private static Deserializer<String> rendered(Deserializer<Long> inner) {
        return (topic, data) -> {
            Long v = inner.deserialize(topic, data);
            return v == null ? null : v.toString();
        };
    }

    /** The functions every operator applies, the same on both sides of the harness. */
    static final class Fns {
        private Fns() {}

        /** A value that ends in an even digit. */
        static boolean even(String v) {
            return v != null && !v.isEmpty() && "02468".indexOf(v.charAt(v.length() - 1)) >= 0;
        }

        /** A value of one character. */
        static boolean single(String v) {
            return v != null && v.length() == 1;
        }

        /** The value with a tick; {@code null} as the text {@code null}. */
        static String tick(String v) {
            return v == null ? "null" : v + "'";
        }

        /** A value as a number: its decimal digits, 0 for anything else. */
        static long num(String v) {
            if (v == null) {
                return 0;
            }
            try {
                return Long.parseLong(v);
            } catch (NumberFormatException e) {
                return 0;
            }
        }

        /** A new key from a value: one of {@code k0}, {@code k1}, {@code k2}. */
        static String bucket(String v) {
            return "k" + Math.floorMod(num(v), 3);
        }

        /** Two values joined: {@code a/b}, a missing side as {@code null}. */
        static String pair(String a, String b) {
            return a + "/" + b;
        }

        /** An aggregate and a value: {@code a+b}. */
        static String plus(String a, String b) {
            return a + "+" + b;
        }

        static String minus(String a, String b) {
            return a + "-" + b;
        }

        /**
         * The foreign key a value names: {@code a}, {@code b} or {@code c} for a number of 0, 1
         * or 2 modulo 4 (every value that is not one: 0), none ({@code null}) for 3.
         */
        static String foreignKey(String v) {
            int i = (int) Math.floorMod(num(v), 4);
            return i < 3 ? List.of("a", "b", "c").get(i) : null;
        }

        /** Each character of the value, in order. */
        static List<String> chars(String v) {
            List<String> out = new ArrayList<>();
            if (v != null) {
                for (char c : v.toCharArray()) {
                    out.add(String.valueOf(c));
                }
            }
            return out;
        }
    }

    /** The Kafka Streams topology of the operator {@code op} with its parameters. */
    static Built build(JsonNode op) {
        String name = op.get("name").asText();
        StreamsBuilder b = new StreamsBuilder();
        List<String> inputs = new ArrayList<>(List.of("left"));
        Map<String, Output> outputs = new LinkedHashMap<>();
        outputs.put("out", TEXT);
        Produced<String, String> text = Produced.with(Serdes.String(), Serdes.String());
        List<String[]> collected = null;
        switch (name) {
            case "filter" -> {
                KStream<String, String> s = b.stream("left");
                (op.get("not").asBoolean()
                        ? s.filterNot((k, v) -> Fns.even(v))
                        : s.filter((k, v) -> Fns.even(v))).to("out");
            }
            case "map-values" -> b.<String, String>stream("left").mapValues(Fns::tick).to("out");
            case "map-values-with-key" -> b.<String, String>stream("left")
                    .mapValues((k, v) -> Fns.pair(k, v)).to("out");
            case "map" -> b.<String, String>stream("left")
                    .map((k, v) -> KeyValue.pair(v, k)).to("out");
            case "select-key" -> b.<String, String>stream("left")
                    .selectKey((k, v) -> v).to("out");
            case "flat-map" -> b.<String, String>stream("left")
                    .flatMap((k, v) -> Arrays.asList(KeyValue.pair(k, v), KeyValue.pair(v, k)))
                    .to("out");
            case "flat-map-values" -> b.<String, String>stream("left")
                    .flatMapValues(Fns::chars).to("out");
            case "flat-map-values-with-key" -> b.<String, String>stream("left")
                    .flatMapValues((k, v) -> Fns.chars(v).stream()
                            .map(c -> Fns.pair(k, c)).toList())
                    .to("out");
            case "peek" -> b.<String, String>stream("left").peek((k, v) -> { }).to("out");
            case "foreach" -> {
                outputs.clear();
                List<String[]> seen = new ArrayList<>();
                b.<String, String>stream("left").foreach((k, v) -> seen.add(new String[] {k, v}));
                collected = seen;
            }
            case "merge" -> {
                inputs.add("right");
                b.<String, String>stream("left").merge(b.stream("right")).to("out");
            }
            case "repartition" -> b.<String, String>stream("left").repartition().to("out");
            case "split" -> {
                outputs.clear();
                JsonNode named = op.get("named");
                if (named != null && named.asBoolean()) {
                    namedSplit(b.stream("left"), op.get("default").asBoolean(), outputs);
                    break;
                }
                BranchedKStream<String, String> split = b.<String, String>stream("left").split()
                        .branch((k, v) -> Fns.even(v), Branched.withConsumer(s -> s.to("out-0")))
                        .branch((k, v) -> Fns.single(v), Branched.withConsumer(s -> s.to("out-1")));
                outputs.put("out-0", TEXT);
                outputs.put("out-1", TEXT);
                if (op.get("default").asBoolean()) {
                    split.defaultBranch(Branched.withConsumer(s -> s.to("out-2")));
                    outputs.put("out-2", TEXT);
                } else {
                    split.noDefaultBranch();
                }
            }
            case "count", "reduce", "aggregate" -> {
                KGroupedStream<String, String> grouped = grouped(b.stream("left"), op);
                if (name.equals("count")) {
                    grouped.count().toStream().to("out", Produced.with(Serdes.String(), Serdes.Long()));
                    outputs.put("out", LONG);
                } else if (name.equals("reduce")) {
                    grouped.reduce(Fns::plus).toStream().to("out", text);
                } else {
                    grouped.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v)).toStream().to("out", text);
                }
            }
            case "process" -> {
                b.addStateStore(Stores.keyValueStoreBuilder(
                        Stores.inMemoryKeyValueStore("counts"), Serdes.String(), Serdes.Long()));
                b.<String, String>stream("left").process(Counter::new, "counts").to("out");
            }
            case "join" -> {
                inputs.add("right");
                KTable<String, String> table = b.table("right");
                KStream<String, String> s = b.stream("left");
                if (op.get("rekey").asBoolean()) {
                    s = s.selectKey((k, v) -> Fns.bucket(v));
                }
                (op.get("left").asBoolean()
                        ? s.leftJoin(table, Fns::pair)
                        : s.join(table, Fns::pair)).to("out");
            }
            case "versioned-join" -> {
                inputs.add("right");
                KTable<String, String> table = b.table("right",
                        Materialized.<String, String>as(Stores.persistentVersionedKeyValueStore(
                                        "versioned", Duration.ofMillis(op.get("retention").asLong())))
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Serdes.String()));
                KStream<String, String> s = b.stream("left");
                Joined<String, String, String> joined =
                        Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
                if (op.hasNonNull("grace")) {
                    joined = joined.withGracePeriod(Duration.ofMillis(op.get("grace").asLong()));
                }
                (op.get("left").asBoolean()
                        ? s.leftJoin(table, Fns::pair, joined)
                        : s.join(table, Fns::pair, joined)).to("out");
            }
            case "windowed" -> {
                TimeWindows windows = TimeWindows.ofSizeAndGrace(
                        Duration.ofMillis(op.get("size").asLong()),
                        Duration.ofMillis(op.get("grace").asLong()))
                        .advanceBy(Duration.ofMillis(op.get("advance").asLong()));
                TimeWindowedKStream<String, String> w =
                        b.<String, String>stream("left").groupByKey().windowedBy(windows);
                if (!op.get("updates").asBoolean()) {
                    w = w.emitStrategy(EmitStrategy.onWindowClose());
                }
                long size = op.get("size").asLong();
                Serde<Windowed<String>> keys = WindowedSerdes.timeWindowedSerdeFrom(String.class, size);
                String how = op.get("how").asText();
                switch (how) {
                    case "count" -> w.count().toStream().to("out", Produced.with(keys, Serdes.Long()));
                    case "reduce" -> w.reduce(Fns::plus).toStream()
                            .to("out", Produced.with(keys, Serdes.String()));
                    default -> w.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v)).toStream()
                            .to("out", Produced.with(keys, Serdes.String()));
                }
                outputs.put("out", new Output(KeyKind.TIME_WINDOWED, how.equals("count"), size));
            }
            case "sliding" -> {
                long difference = op.get("difference").asLong();
                SlidingWindows windows = SlidingWindows.ofTimeDifferenceAndGrace(
                        Duration.ofMillis(difference), Duration.ofMillis(op.get("grace").asLong()));
                TimeWindowedKStream<String, String> w =
                        b.<String, String>stream("left").groupByKey().windowedBy(windows);
                if (!op.get("updates").asBoolean()) {
                    w = w.emitStrategy(EmitStrategy.onWindowClose());
                }
                // A sliding window [start, start + difference]: its end is start + difference.
                Serde<Windowed<String>> keys = WindowedSerdes.timeWindowedSerdeFrom(String.class, difference);
                String how = op.get("how").asText();
                // The store's retention, when the harness gives one (default: 2 * difference + grace).
                Duration retention = op.hasNonNull("retention")
                        ? Duration.ofMillis(op.get("retention").asLong()) : null;
                switch (how) {
                    case "count" -> (retention == null ? w.count()
                            : w.count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>with(
                                    Serdes.String(), Serdes.Long()).withRetention(retention)))
                            .toStream().to("out", Produced.with(keys, Serdes.Long()));
                    case "reduce" -> (retention == null ? w.reduce(Fns::plus)
                            : w.reduce(Fns::plus, Materialized.<String, String, WindowStore<Bytes, byte[]>>with(
                                    Serdes.String(), Serdes.String()).withRetention(retention)))
                            .toStream().to("out", Produced.with(keys, Serdes.String()));
                    default -> (retention == null ? w.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v))
                            : w.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v),
                                    Materialized.<String, String, WindowStore<Bytes, byte[]>>with(
                                            Serdes.String(), Serdes.String()).withRetention(retention)))
                            .toStream().to("out", Produced.with(keys, Serdes.String()));
                }
                outputs.put("out", new Output(KeyKind.TIME_WINDOWED, how.equals("count"), difference));
            }
            case "session" -> {
                SessionWindows windows = SessionWindows.ofInactivityGapAndGrace(
                        Duration.ofMillis(op.get("gap").asLong()),
                        Duration.ofMillis(op.get("grace").asLong()));
                SessionWindowedKStream<String, String> w =
                        b.<String, String>stream("left").groupByKey().windowedBy(windows);
                if (!op.get("updates").asBoolean()) {
                    w = w.emitStrategy(EmitStrategy.onWindowClose());
                }
                Serde<Windowed<String>> keys = WindowedSerdes.sessionWindowedSerdeFrom(String.class);
                String how = op.get("how").asText();
                switch (how) {
                    case "count" -> w.count().toStream().to("out", Produced.with(keys, Serdes.Long()));
                    case "reduce" -> w.reduce(Fns::plus).toStream()
                            .to("out", Produced.with(keys, Serdes.String()));
                    default -> w.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v),
                                    (k, x, y) -> x + "|" + y).toStream()
                            .to("out", Produced.with(keys, Serdes.String()));
                }
                outputs.put("out", new Output(KeyKind.SESSION_WINDOWED, how.equals("count"), 0));
            }
            case "join-windowed" -> {
                inputs.add("right");
                JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(
                        Duration.ofMillis(op.get("difference").asLong()),
                        Duration.ofMillis(op.get("grace").asLong()));
                KStream<String, String> l = b.stream("left");
                KStream<String, String> r = b.stream("right");
                (switch (op.get("kind").asText()) {
                    case "inner" -> l.join(r, Fns::pair, windows);
                    case "left" -> l.leftJoin(r, Fns::pair, windows);
                    default -> l.outerJoin(r, Fns::pair, windows);
                }).to("out");
            }
            case "table" -> {
                KStream<String, String> s = source(b, "left", op).toStream();
                if (!op.get("change").asBoolean()) {
                    s = s.filter((k, v) -> v != null);
                }
                s.to("out");
            }
            case "cogroup" -> {
                inputs.add("right");
                KGroupedStream<String, String> right = b.<String, String>stream("right").groupByKey();
                b.<String, String>stream("left").groupByKey()
                        .<String>cogroup((k, v, a) -> Fns.plus(a, v))
                        .cogroup(right, (k, v, a) -> Fns.plus(a, Fns.tick(v)))
                        .aggregate(() -> "0").toStream().to("out", text);
            }
            case "table-group-by" -> {
                KGroupedTable<String, String> g = b.<String, String>table("left")
                        .groupBy((k, v) -> KeyValue.pair(Fns.bucket(v), v),
                                Grouped.with(Serdes.String(), Serdes.String()));
                switch (op.get("how").asText()) {
                    case "count" -> {
                        g.count().toStream().to("out", Produced.with(Serdes.String(), Serdes.Long()));
                        outputs.put("out", LONG);
                    }
                    case "reduce" -> g.reduce(Fns::plus, Fns::minus).toStream().to("out", text);
                    default -> g.aggregate(() -> "0", (k, v, a) -> Fns.plus(a, v),
                            (k, v, a) -> Fns.minus(a, v)).toStream().to("out", text);
                }
            }
            case "to-table" -> b.<String, String>stream("left").toTable().toStream().to("out");
            case "table-filter" -> {
                KTable<String, String> t = b.table("left");
                (op.get("not").asBoolean()
                        ? t.filterNot((k, v) -> Fns.even(v))
                        : t.filter((k, v) -> Fns.even(v))).toStream().to("out");
            }
            case "table-map-values" -> b.<String, String>table("left").mapValues(Fns::tick)
                    .toStream().to("out");
            case "table-map-values-with-key" -> b.<String, String>table("left")
                    .mapValues((k, v) -> Fns.pair(k, v)).toStream().to("out");
            case "table-join" -> {
                inputs.add("right");
                KTable<String, String> l = b.table("left");
                KTable<String, String> r = b.table("right");
                (switch (op.get("kind").asText()) {
                    case "inner" -> l.join(r, Fns::pair);
                    case "left" -> l.leftJoin(r, Fns::pair);
                    default -> l.outerJoin(r, Fns::pair);
                }).toStream().to("out");
            }
            case "fk-join" -> {
                inputs.add("right");
                KTable<String, String> l = b.table("left");
                KTable<String, String> r = b.table("right");
                Function<String, String> foreignKey = Fns::foreignKey;
                (op.get("left").asBoolean()
                        ? l.leftJoin(r, foreignKey, Fns::pair)
                        : l.join(r, foreignKey, Fns::pair)).toStream().to("out");
            }
            case "global-join" -> {
                inputs.add("right");
                GlobalKTable<String, String> g = b.globalTable("right");
                KStream<String, String> s = b.stream("left");
                KeyValueMapper<String, String, String> foreignKey = (k, v) -> Fns.foreignKey(v);
                (op.get("left").asBoolean()
                        ? s.leftJoin(g, foreignKey, Fns::pair)
                        : s.join(g, foreignKey, Fns::pair)).to("out");
            }
            case "suppress" -> b.<String, String>table("left")
                    .suppress(Suppressed.untilTimeLimit(Duration.ofMillis(op.get("limit_ms").asLong()),
                            Suppressed.BufferConfig.unbounded()))
                    .toStream().to("out");
            default -> throw new IllegalArgumentException("no operator " + name + " in the catalogue");
        }
        return new Built(b.build(), inputs, outputs, collected);
    }

    /**
     * The named split: {@code split(Named.as("s-"))}, even values as {@code Branched.as("even")},
     * values of one character through {@code withFunction(mapValues(tick))}, the rest (when
     * {@code withDefault}) to a consumer named {@code rest} writing {@code out-rest}; each branch
     * of the map it returns written to {@code out-{its name}}.
     */
    private static void namedSplit(KStream<String, String> s, boolean withDefault,
            Map<String, Output> outputs) {
        BranchedKStream<String, String> split = s.split(Named.as("s-"))
                .branch((k, v) -> Fns.even(v), Branched.as("even"))
                .branch((k, v) -> Fns.single(v),
                        Branched.withFunction(branch -> branch.mapValues(Fns::tick)));
        Map<String, KStream<String, String>> branches;
        if (withDefault) {
            branches = split.defaultBranch(
                    Branched.withConsumer(branch -> branch.to("out-rest"), "rest"));
            outputs.put("out-rest", TEXT);
        } else {
            branches = split.noDefaultBranch();
        }
        for (Map.Entry<String, KStream<String, String>> e : branches.entrySet()) {
            e.getValue().to("out-" + e.getKey());
            outputs.put("out-" + e.getKey(), TEXT);
        }
    }

    /**
     * The table of {@code topic}: materialized in a store when {@code op.materialized} is true
     * (as {@code Materialized.as}, or a join, makes it), else as {@code builder.table(topic)}
     * leaves it until an operator needs its values.
     */
    private static KTable<String, String> source(StreamsBuilder b, String topic, JsonNode op) {
        JsonNode m = op.get("materialized");
        if (m != null && m.asBoolean()) {
            return b.table(topic, Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(topic + "-store"));
        }
        return b.table(topic);
    }

    /** The stream grouped as {@code op.group} says: by its key, by a new key, or with groupBy. */
    private static KGroupedStream<String, String> grouped(KStream<String, String> s, JsonNode op) {
        JsonNode named = op.get("named");
        Grouped<String, String> grouped = named != null && named.asBoolean()
                ? Grouped.as("agg")
                : Grouped.with(null, null);
        return switch (op.get("group").asText()) {
            case "by-key" -> s.groupByKey(grouped);
            case "select-key" -> s.selectKey((k, v) -> Fns.bucket(v)).groupByKey(grouped);
            default -> s.groupBy((k, v) -> Fns.bucket(v), grouped);
        };
    }

    /** A processor that counts the records of each key and forwards the count as text. */
    static final class Counter implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, Long> counts;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.counts = context.getStateStore("counts");
        }

        @Override
        public void process(Record<String, String> record) {
            if (record.key() == null || record.value() == null) {
                return;
            }
            Long n = counts.get(record.key());
            long next = n == null ? 1 : n + 1;
            counts.put(record.key(), next);
            context.forward(record.withValue(record.value() + "#" + next));
        }
    }
}
