package dev.parsley.stamp;

import dev.parsley.stamp.Stamp.Channel;
import java.util.Map;
import java.util.UUID;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * Stamps every record a producer sends, with the clock its consumer's
 * {@link ParsleyConsumerInterceptor} observed: configure both with the same
 * {@code parsley.clock.id} (default {@code default}) in {@code interceptor.classes}, and an
 * existing consume-produce service is stamped by configuration alone. The producer must be
 * idempotent and not transactional; a send waits for the acknowledgements of earlier sends to
 * another channel, or of any when the record names no partition ({@link CausalClock#stamp}),
 * for at most {@code parsley.timeout.ms} (default 30000).
 *
 * @param <K> the key type
 * @param <V> the value type
 */
public final class ParsleyProducerInterceptor<K, V> implements ProducerInterceptor<K, V> {
    /** The configuration key naming the clock shared with a consumer interceptor. */
    public static final String CLOCK_ID = "parsley.clock.id";
    /** The configuration key bounding a wait for acknowledgements, ms. */
    public static final String TIMEOUT_MS = "parsley.timeout.ms";

    private CausalClock clock;
    private TopicIds topics;
    private long timeoutMs;

    @Override
    public void configure(Map<String, ?> configs) {
        clock = CausalClock.named(TopicIds.setting(configs, CLOCK_ID, "default"));
        timeoutMs = Long.parseLong(TopicIds.setting(configs, TIMEOUT_MS, "30000"));
        topics = new TopicIds(configs, timeoutMs);
    }

    @Override
    public ProducerRecord<K, V> onSend(ProducerRecord<K, V> record) {
        UUID topic = topics.id(record.topic());
        Stamp stamp = clock.stamp(topic, record.partition(), timeoutMs);
        record.headers().remove(StampCodec.STAMP_HEADER);
        record.headers().add(StampCodec.STAMP_HEADER, StampCodec.encode(stamp));
        return record;
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {
        if (exception != null) {
            clock.acknowledged(null, -1, exception.toString());
            return;
        }
        Channel channel = new Channel(topics.id(metadata.topic()), metadata.partition());
        clock.acknowledged(channel, metadata.offset(), null);
    }

    @Override
    public void close() {
        topics.close();
    }
}
