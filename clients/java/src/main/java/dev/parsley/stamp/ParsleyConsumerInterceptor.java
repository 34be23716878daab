package dev.parsley.stamp;

import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.InFlight;
import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerInterceptor;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;

/**
 * Observes every record a consumer returns into the clock its producer's
 * {@link ParsleyProducerInterceptor} stamps with (the same {@code parsley.clock.id}): the
 * record's coordinate and its stamp's clock; an in-flight claim becomes the coordinate below
 * the claimed channel's high watermark, read now. A stamp that does not decode fails the poll
 * with an {@link IllegalStateException} naming the record.
 *
 * @param <K> the key type
 * @param <V> the value type
 */
public final class ParsleyConsumerInterceptor<K, V> implements ConsumerInterceptor<K, V> {
    private CausalClock clock;
    private TopicIds topics;

    @Override
    public void configure(Map<String, ?> configs) {
        clock = CausalClock.named(TopicIds.setting(configs, ParsleyProducerInterceptor.CLOCK_ID, "default"));
        long timeoutMs = Long.parseLong(TopicIds.setting(configs, ParsleyProducerInterceptor.TIMEOUT_MS, "30000"));
        topics = new TopicIds(configs, timeoutMs);
    }

    @Override
    public ConsumerRecords<K, V> onConsume(ConsumerRecords<K, V> records) {
        for (ConsumerRecord<K, V> r : records) {
            Stamp stamp = null;
            for (Header h : r.headers()) {
                if (StampCodec.isStampHeader(h.key())) {
                    try {
                        stamp = StampCodec.decode(h.value() == null ? new byte[0] : h.value());
                    } catch (DecodeException e) {
                        throw new IllegalStateException(
                                r.topic() + "/" + r.partition() + "@" + r.offset() + ": header " + h.key() + ": " + e.getMessage(), e);
                    }
                    break;
                }
            }
            clock.observe(new Channel(topics.id(r.topic()), r.partition()), r.offset(), stamp);
            if (stamp != null) {
                for (InFlight claim : stamp.inFlight()) {
                    String name = topics.name(claim.channel().topic());
                    long high = topics.highWatermark(name, claim.channel().partition());
                    if (high > 0) {
                        clock.claim(claim.channel(), high - 1);
                    }
                }
            }
        }
        return records;
    }

    @Override
    public void onCommit(Map<TopicPartition, OffsetAndMetadata> offsets) {}

    @Override
    public void close() {
        topics.close();
    }
}
