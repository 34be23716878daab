package dev.parsley.compare;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;

/**
 * The Kafka Streams side of {@code cargo xtask compare}: runs one pipeline until it has consumed
 * everything its source topics hold, then closes and exits 0.
 *
 * <pre>
 * java -jar parsley-ks-compare.jar wordcount --bootstrap B --application-id A --input T --output OUT
 * java -jar parsley-ks-compare.jar shop --bootstrap B --application-id A --orders T --payments T --output OUT
 * </pre>
 *
 * Optional for both: {@code --state-dir DIR} (default: {@code state/} beside the jar, in the
 * repository's {@code target/}), {@code --deadline-secs N} (a safety net, default 600).
 *
 * <p>The modes {@code bench-pass} and {@code bench-count} are the Kafka Streams side of
 * {@code cargo xtask bench e2e} ({@link Bench}).
 *
 * Exit codes: 0 done, 1 the pipeline failed or did not catch up in time, 2 bad arguments.
 */
public final class Main {
    private Main() {}

    public static void main(String[] args) {
        try {
            System.exit(run(args));
        } catch (UsageException e) {
            System.err.println("kafka-streams: " + e.getMessage());
            System.err.println(USAGE);
            System.exit(2);
        } catch (Exception e) {
            System.err.println("kafka-streams: error: " + e);
            e.printStackTrace(System.err);
            System.exit(1);
        }
    }

    private static final String USAGE = String.join("\n",
            "usage: parsley-ks-compare wordcount --bootstrap B --application-id A --input T --output OUT",
            "       parsley-ks-compare shop --bootstrap B --application-id A --orders T --payments T --output OUT",
            "options for both: --state-dir DIR, --deadline-secs N",
            "       parsley-ks-compare bench-pass|bench-count --bootstrap B --application-id A --input T --output OUT",
            "options: --commit-interval-ms N, --state-dir DIR, --deadline-secs N");

    static int run(String[] args) throws Exception {
        if (args.length == 0) {
            throw new UsageException("no mode given");
        }
        String mode = args[0];
        Map<String, String> opts = options(args);
        if (mode.startsWith("bench-")) {
            return Bench.run(mode, opts);
        }
        String bootstrap = required(opts, "bootstrap");
        String applicationId = required(opts, "application-id");
        String output = required(opts, "output");
        Topology topology;
        Set<String> inputs;
        switch (mode) {
            case "wordcount" -> {
                String input = required(opts, "input");
                topology = Pipelines.wordCount(input, output);
                inputs = Set.of(input);
            }
            case "shop" -> {
                String orders = required(opts, "orders");
                String payments = required(opts, "payments");
                topology = Pipelines.shop(orders, payments, output);
                inputs = Set.of(orders, payments);
            }
            default -> throw new UsageException("unknown mode " + mode);
        }
        for (String unused : opts.keySet()) {
            if (!Set.of("bootstrap", "application-id", "output", "input", "orders", "payments",
                    "state-dir", "deadline-secs").contains(unused)) {
                throw new UsageException("unknown option --" + unused);
            }
        }
        Path stateDir = opts.containsKey("state-dir")
                ? Paths.get(opts.get("state-dir"))
                : jarDirectory().resolve("state");
        long deadlineSecs = Long.parseLong(opts.getOrDefault("deadline-secs", "600"));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toAbsolutePath().toString());
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // The default from Kafka 5.0 on; set now, Kafka Streams warns without it.
        props.put("processing.exception.handler.global.enabled", true);

        System.out.println("kafka-streams: " + mode + " as application " + applicationId
                + " on " + bootstrap + ", state in " + stateDir);
        return Runner.runToCompletion(topology, props, inputs, deadlineSecs);
    }

    /** {@code --name value} pairs after the mode. */
    static Map<String, String> options(String[] args) throws UsageException {
        Map<String, String> opts = new LinkedHashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new UsageException("expected --name value, found " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        return opts;
    }

    static String required(Map<String, String> opts, String name) throws UsageException {
        String v = opts.get(name);
        if (v == null || v.isBlank()) {
            throw new UsageException("--" + name + " is required");
        }
        return v;
    }

    /** The directory of the jar (or class directory) this class was loaded from. */
    static Path jarDirectory() throws Exception {
        Path p = Paths.get(Main.class.getProtectionDomain().getCodeSource().getLocation().toURI());
        return p.toFile().isFile() ? p.getParent() : p;
    }

    static final class UsageException extends Exception {
        private static final long serialVersionUID = 1L;

        UsageException(String message) {
            super(message);
        }
    }
}
