package dev.parsley.stamp;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;

/**
 * Topic ids and high watermarks, read with an admin client made from an interceptor's client
 * configuration (its connection and security settings), and cached by name and id.
 */
final class TopicIds implements AutoCloseable {
    private final Admin admin;
    private final long timeoutMs;
    private final Map<String, UUID> ids = new ConcurrentHashMap<>();
    private final Map<UUID, String> names = new ConcurrentHashMap<>();

    TopicIds(Map<String, ?> clientConfig, long timeoutMs) {
        Map<String, Object> config = new HashMap<>();
        clientConfig.forEach((k, v) -> {
            if (AdminClientConfig.configNames().contains(k) && !k.equals("client.id")) {
                config.put(k, v);
            }
        });
        this.admin = Admin.create(config);
        this.timeoutMs = timeoutMs;
    }

    /** The setting {@code key} of {@code config} as text, or {@code otherwise}. */
    static String setting(Map<String, ?> config, String key, String otherwise) {
        Object v = config.get(key);
        return v == null ? otherwise : v.toString();
    }

    static UUID uuid(Uuid id) {
        return new UUID(id.getMostSignificantBits(), id.getLeastSignificantBits());
    }

    /** The id of topic {@code name}. */
    UUID id(String name) {
        return ids.computeIfAbsent(name, n -> {
            try {
                TopicDescription d = admin.describeTopics(List.of(n)).allTopicNames()
                        .get(timeoutMs, TimeUnit.MILLISECONDS).get(n);
                UUID id = uuid(d.topicId());
                names.put(id, n);
                return id;
            } catch (Exception e) {
                throw new IllegalStateException("cannot read the topic id of " + n + ": " + e, e);
            }
        });
    }

    /** The name of the topic of id {@code id}. */
    String name(UUID id) {
        return names.computeIfAbsent(id, i -> {
            Uuid kafka = new Uuid(i.getMostSignificantBits(), i.getLeastSignificantBits());
            try {
                Map<Uuid, TopicDescription> found = admin.describeTopics(TopicCollection.ofTopicIds(List.of(kafka)))
                        .allTopicIds().get(timeoutMs, TimeUnit.MILLISECONDS);
                return found.get(kafka).name();
            } catch (Exception e) {
                throw new IllegalStateException("no topic has the id " + i + ": " + e, e);
            }
        });
    }

    /** The high watermark of {@code topic}/{@code partition}. */
    long highWatermark(String topic, int partition) {
        TopicPartition tp = new TopicPartition(topic, partition);
        try {
            return admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp)
                    .get(timeoutMs, TimeUnit.MILLISECONDS).offset();
        } catch (Exception e) {
            throw new IllegalStateException("cannot read the high watermark of " + tp + ": " + e, e);
        }
    }

    @Override
    public void close() {
        admin.close();
    }
}
