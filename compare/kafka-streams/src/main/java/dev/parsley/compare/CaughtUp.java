package dev.parsley.compare;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Whether a consumer group has consumed every record of some topics.
 *
 * <p>A partition is consumed when the group's committed offset is at or past its end offset as
 * a {@code read_committed} consumer sees it (the last stable offset), or when a
 * {@code read_committed} consumer positioned at the committed offset reaches that end without
 * returning a record: what lies between is transaction markers and aborted records, which no
 * consumer is given (a topic written in transactions ends with a commit marker, and whether a
 * group's commit lands before or after it depends on when its consumer fetched the marker).
 */
final class CaughtUp implements AutoCloseable {
    private static final Duration PROBE_DEADLINE = Duration.ofSeconds(30);

    private final Admin admin;
    private final String group;
    private final KafkaConsumer<byte[], byte[]> probe;

    /** Where a check found the group. */
    record Report(boolean done, String detail) {}

    CaughtUp(Admin admin, String bootstrap, String group) {
        this.admin = admin;
        this.group = group;
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        this.probe = new KafkaConsumer<>(p);
    }

    Report check(List<String> topics) throws Exception {
        // Committed offsets first, then end offsets (see Runner).
        Map<TopicPartition, OffsetAndMetadata> committed =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Map<String, TopicDescription> described;
        try {
            described = admin.describeTopics(topics).allTopicNames().get();
        } catch (java.util.concurrent.ExecutionException e) {
            if (e.getCause() instanceof UnknownTopicOrPartitionException) {
                return new Report(false, "internal topics not created yet");
            }
            throw e;
        }
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        for (TopicDescription d : described.values()) {
            d.partitions().forEach(p -> request.put(new TopicPartition(d.name(), p.partition()), OffsetSpec.latest()));
        }
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> ends = admin
                .listOffsets(request, new ListOffsetsOptions(IsolationLevel.READ_COMMITTED))
                .all().get();
        Map<TopicPartition, Long> behind = new HashMap<>();
        Map<TopicPartition, Long> endOf = new HashMap<>();
        long records = 0;
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : ends.entrySet()) {
            long end = e.getValue().offset();
            OffsetAndMetadata c = committed.get(e.getKey());
            long at = c == null ? 0 : c.offset();
            records += end;
            if (end > 0 && at < end) {
                behind.put(e.getKey(), at);
                endOf.put(e.getKey(), end);
            }
        }
        if (behind.isEmpty()) {
            return new Report(true, ends.size() + " partitions committed at their ends (" + records + " offsets)");
        }
        List<TopicPartition> withRecords = recordsBetween(behind, endOf);
        if (withRecords.isEmpty()) {
            return new Report(true, ends.size() + " partitions committed at their ends ("
                    + behind.size() + " short of them by transaction markers or aborted records only)");
        }
        long lag = withRecords.stream().mapToLong(tp -> endOf.get(tp) - behind.get(tp)).sum();
        return new Report(false, withRecords.size() + " partitions with records left (" + lag + " offsets)");
    }

    /**
     * The partitions of {@code from} where a {@code read_committed} consumer finds a record at
     * or after {@code from} and before {@code end}.
     */
    private List<TopicPartition> recordsBetween(Map<TopicPartition, Long> from, Map<TopicPartition, Long> end) {
        probe.assign(from.keySet());
        from.forEach(probe::seek);
        List<TopicPartition> found = new ArrayList<>();
        List<TopicPartition> open = new ArrayList<>(from.keySet());
        long deadline = System.nanoTime() + PROBE_DEADLINE.toNanos();
        while (!open.isEmpty()) {
            if (System.nanoTime() > deadline) {
                // No evidence either way: count them as not consumed.
                found.addAll(open);
                break;
            }
            for (ConsumerRecord<byte[], byte[]> r : probe.poll(Duration.ofMillis(100))) {
                TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                if (open.contains(tp) && r.offset() < end.get(tp)) {
                    open.remove(tp);
                    found.add(tp);
                }
            }
            open.removeIf(tp -> probe.position(tp) >= end.get(tp));
        }
        probe.assign(List.of());
        return found;
    }

    @Override
    public void close() {
        probe.close();
    }
}
