package dev.parsley.compare;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyDescription;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/**
 * Runs a topology until the evidence says it has consumed everything, then closes it.
 *
 * <p>The evidence ({@link CaughtUp}): the application's consumer group has committed, on every
 * partition of every source topic — the inputs and the repartition topics — an offset past
 * which a {@code read_committed} consumer finds no record. With exactly-once processing the
 * offsets commit in the transaction that writes the outputs, so the outputs are complete then.
 * The committed offsets are read before the end offsets: once the inputs are committed at their
 * ends, every repartition record is committed, and end offsets read afterwards are final.
 */
final class Runner {
    private Runner() {}

    /** Between two checks of the evidence: a polling interval, not a decision. */
    private static final Duration CHECK_EVERY = Duration.ofMillis(200);

    static int runToCompletion(Topology topology, Properties props, Set<String> inputs, long deadlineSecs)
            throws Exception {
        String applicationId = props.getProperty(StreamsConfig.APPLICATION_ID_CONFIG);
        TopologyDescription description = topology.describe();
        System.out.println(description);
        List<String> sources = sourceTopics(description, applicationId, inputs);
        System.out.println("kafka-streams: source topics " + sources);

        AtomicReference<Throwable> failure = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        long started = System.nanoTime();
        streams.start();
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                props.getProperty(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG));
        long lastReport = started;
        int result;
        try (Admin admin = Admin.create(adminProps);
                CaughtUp caughtUp = new CaughtUp(admin,
                        props.getProperty(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG), applicationId)) {
            while (true) {
                KafkaStreams.State state = streams.state();
                if (failure.get() != null || state == KafkaStreams.State.ERROR
                        || state == KafkaStreams.State.PENDING_ERROR
                        || state == KafkaStreams.State.NOT_RUNNING) {
                    System.err.println("kafka-streams: the application stopped (" + state + "): "
                            + failure.get());
                    result = 1;
                    break;
                }
                CaughtUp.Report report = caughtUp.check(sources);
                double secs = (System.nanoTime() - started) / 1e9;
                if (report.done()) {
                    System.out.printf("kafka-streams: caught up after %.1f s: %s%n", secs, report.detail());
                    result = 0;
                    break;
                }
                if (secs > deadlineSecs) {
                    System.err.printf("kafka-streams: not caught up within %d s: %s%n", deadlineSecs,
                            report.detail());
                    result = 1;
                    break;
                }
                if (System.nanoTime() - lastReport > 5_000_000_000L) {
                    lastReport = System.nanoTime();
                    System.out.printf("kafka-streams: %.0f s, %s, waiting: %s%n", secs, state, report.detail());
                }
                Thread.sleep(CHECK_EVERY.toMillis());
            }
        } finally {
            streams.close(Duration.ofSeconds(60));
        }
        // The application id is unique per run: its local state is of no further use.
        streams.cleanUp();
        System.out.printf("kafka-streams: closed after %.1f s%n", (System.nanoTime() - started) / 1e9);
        return result;
    }

    /**
     * The topics the topology's sources read: the user's inputs by name, and its internal
     * (repartition) topics with the application id in front, as Kafka Streams names them.
     */
    static List<String> sourceTopics(TopologyDescription description, String applicationId, Set<String> inputs) {
        Set<String> topics = new TreeSet<>();
        for (TopologyDescription.Subtopology sub : description.subtopologies()) {
            for (TopologyDescription.Node node : sub.nodes()) {
                if (node instanceof TopologyDescription.Source source) {
                    Set<String> named = source.topicSet();
                    if (named == null) {
                        throw new IllegalStateException("source " + source.name() + " reads a pattern");
                    }
                    for (String t : named) {
                        if (inputs.contains(t) || t.startsWith(applicationId + "-")) {
                            topics.add(t);
                        } else if (t.endsWith("-repartition")) {
                            topics.add(applicationId + "-" + t);
                        } else {
                            throw new IllegalStateException("source topic " + t + " is neither an input nor internal");
                        }
                    }
                }
            }
        }
        if (!topics.containsAll(inputs)) {
            throw new IllegalStateException("the topology reads " + topics + ", not every input of " + inputs);
        }
        return new ArrayList<>(topics);
    }
}
