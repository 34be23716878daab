package dev.parsley.compare;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The Kafka Streams side of {@code cargo xtask bench e2e}: a pass-through and a count per key,
 * run until standard input ends.
 *
 * <pre>
 * java -jar parsley-ks-compare.jar bench-pass --bootstrap B --application-id A --input T --output OUT
 * java -jar parsley-ks-compare.jar bench-count --bootstrap B --application-id A --input T --output OUT
 * </pre>
 *
 * Optional: {@code --commit-interval-ms N} (default 100), {@code --state-dir DIR} (default:
 * {@code bench-state/} beside the jar), {@code --deadline-secs N} (a safety net, default 900).
 *
 * <p>Settings: {@code processing.guarantee=exactly_once_v2}, the given commit interval, one
 * stream thread, and {@code statestore.cache.max.bytes=0}: the count writes each key's new
 * count after every record, as Parsley's count does. Everything else is Kafka Streams' default.
 *
 * <p>The benchmark closes standard input once the application's committed offsets cover its
 * input; the program then closes the application, deletes its local state and prints one line,
 * {@code e2e-result peak_rss_kib=N cpu_ms=N}: its peak resident set ({@code VmHWM}) and CPU time,
 * read from {@code /proc/self} as the benchmark's Rust workers read theirs.
 *
 * <p>Exit codes: 0 done, 1 the application failed or outlived the deadline.
 */
final class Bench {
    private Bench() {}

    /** The name of the count's store (its changelog: {@code {application}-counts-changelog}). */
    static final String STORE = "counts";

    /** Between two looks at the application's state while waiting for the end of the input. */
    private static final long CHECK_EVERY_MS = 100;

    static int run(String mode, Map<String, String> opts) throws Exception {
        for (String name : opts.keySet()) {
            if (!Set.of("bootstrap", "application-id", "input", "output", "commit-interval-ms",
                    "state-dir", "deadline-secs").contains(name)) {
                throw new Main.UsageException("unknown option --" + name);
            }
        }
        String input = Main.required(opts, "input");
        String output = Main.required(opts, "output");
        Topology topology = switch (mode) {
            case "bench-pass" -> passThrough(input, output);
            case "bench-count" -> count(input, output);
            default -> throw new Main.UsageException("unknown mode " + mode);
        };
        Path stateDir = opts.containsKey("state-dir")
                ? Paths.get(opts.get("state-dir"))
                : Main.jarDirectory().resolve("bench-state");
        long deadlineSecs = Long.parseLong(opts.getOrDefault("deadline-secs", "900"));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, Main.required(opts, "application-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, Main.required(opts, "bootstrap"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG,
                Long.parseLong(opts.getOrDefault("commit-interval-ms", "100")));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toAbsolutePath().toString());
        // The default from Kafka 5.0 on; set now, Kafka Streams warns without it.
        props.put("processing.exception.handler.global.enabled", true);

        AtomicReference<Throwable> failure = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        CountDownLatch inputClosed = new CountDownLatch(1);
        Thread reader = new Thread(() -> {
            try {
                while (System.in.read() != -1) {
                    // Anything written is ignored: the end of the input is the signal.
                }
            } catch (IOException e) {
                // A broken pipe ends the input as well.
            }
            inputClosed.countDown();
        }, "stdin");
        reader.setDaemon(true);
        long started = System.nanoTime();
        streams.start();
        reader.start();
        int result = 0;
        try {
            while (!inputClosed.await(CHECK_EVERY_MS, TimeUnit.MILLISECONDS)) {
                KafkaStreams.State state = streams.state();
                if (failure.get() != null || state == KafkaStreams.State.ERROR
                        || state == KafkaStreams.State.PENDING_ERROR
                        || state == KafkaStreams.State.NOT_RUNNING) {
                    System.err.println("kafka-streams: the application stopped (" + state + "): "
                            + failure.get());
                    result = 1;
                    break;
                }
                if (System.nanoTime() - started > deadlineSecs * 1_000_000_000L) {
                    System.err.println("kafka-streams: standard input still open after "
                            + deadlineSecs + " s");
                    result = 1;
                    break;
                }
            }
        } finally {
            streams.close(Duration.ofSeconds(60));
        }
        // The application id is unique per run: its local state is of no further use.
        streams.cleanUp();
        if (result == 0) {
            System.out.println("e2e-result peak_rss_kib=" + peakRssKib() + " cpu_ms=" + cpuMs());
        }
        return result;
    }

    /** {@code stream(input).to(output)}, keys and values as byte arrays. */
    static Topology passThrough(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        return builder.build();
    }

    /**
     * The count per key: String keys, values (byte arrays) not looked at; every update of a
     * count goes to {@code output} (String key, Long value).
     */
    static Topology count(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    /** {@code VmHWM} of this process, KiB. */
    static long peakRssKib() throws IOException {
        for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
            if (line.startsWith("VmHWM:")) {
                return Long.parseLong(line.substring("VmHWM:".length()).replace("kB", "").trim());
            }
        }
        throw new IOException("no VmHWM in /proc/self/status");
    }

    /**
     * User plus system CPU time of this process (all threads), ms: fields 14 and 15 of
     * {@code /proc/self/stat}, in clock ticks of {@code USER_HZ} (100 on Linux).
     */
    static long cpuMs() throws IOException {
        String stat = Files.readString(Paths.get("/proc/self/stat"));
        String[] fields = stat.substring(stat.lastIndexOf(')') + 1).trim().split("\\s+");
        // After the command name: state is field 3, so utime (14) and stime (15) are 11 and 12.
        return (Long.parseLong(fields[11]) + Long.parseLong(fields[12])) * 10;
    }
}
