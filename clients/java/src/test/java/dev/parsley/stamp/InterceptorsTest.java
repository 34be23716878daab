package dev.parsley.stamp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.parsley.stamp.Stamp.Channel;
import dev.parsley.stamp.Stamp.Entry;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;

/**
 * The interceptors on the real broker ({@code PARSLEY_BOOTSTRAP}): a consume-produce service
 * stamped by configuration alone claims the order it consumed and its own earlier sends.
 */
class InterceptorsTest {
    private static final String BOOTSTRAP = System.getenv("PARSLEY_BOOTSTRAP");

    private static String topic(Admin admin, String prefix, int partitions) throws Exception {
        String name = prefix + "-" + UUID.randomUUID();
        admin.createTopics(List.of(new NewTopic(name, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
        return name;
    }

    private static UUID idOf(Admin admin, String topic) throws Exception {
        return TopicIds.uuid(admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS)
                .get(topic).topicId());
    }

    private static Properties base() {
        Properties p = new Properties();
        p.put("bootstrap.servers", BOOTSTRAP);
        return p;
    }

    /** Every record of {@code topic} (one partition), read with a plain consumer. */
    private static List<ConsumerRecord<String, String>> readAll(String topic, int expected) {
        Properties p = base();
        p.put("group.id", "read-" + UUID.randomUUID());
        p.put("auto.offset.reset", "earliest");
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            c.assign(List.of(new TopicPartition(topic, 0)));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (out.size() < expected && System.nanoTime() < deadline) {
                c.poll(Duration.ofMillis(200)).forEach(out::add);
            }
        }
        assertEquals(expected, out.size(), "records of " + topic);
        return out;
    }

    private static Stamp stampOf(ConsumerRecord<String, String> r) throws DecodeException {
        var h = r.headers().lastHeader(StampCodec.STAMP_HEADER);
        assertNotNull(h, "a stamp on " + r.topic() + "@" + r.offset());
        return StampCodec.decode(h.value());
    }

    @Test
    void aServiceStampedByConfigurationClaimsWhatItConsumedAndItsOwnSends() throws Exception {
        assumeTrue(BOOTSTRAP != null, "needs a broker: PARSLEY_BOOTSTRAP (cargo xtask java sets it)");
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", BOOTSTRAP))) {
            String orders = topic(admin, "java-orders", 1);
            String payments = topic(admin, "java-payments", 1);
            String audit = topic(admin, "java-audit", 1);
            try (KafkaProducer<String, String> shop = new KafkaProducer<>(base(), new StringSerializer(), new StringSerializer())) {
                shop.send(new ProducerRecord<>(orders, "o-1", "5")).get(30, TimeUnit.SECONDS);
            }
            String clockId = "test-" + UUID.randomUUID();
            Properties consumer = base();
            consumer.put("group.id", "payments-" + UUID.randomUUID());
            consumer.put("auto.offset.reset", "earliest");
            consumer.put("interceptor.classes", ParsleyConsumerInterceptor.class.getName());
            consumer.put(ParsleyProducerInterceptor.CLOCK_ID, clockId);
            Properties producer = base();
            producer.put("enable.idempotence", "true");
            producer.put("interceptor.classes", ParsleyProducerInterceptor.class.getName());
            producer.put(ParsleyProducerInterceptor.CLOCK_ID, clockId);
            ConsumerRecord<String, String> order;
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumer, new StringDeserializer(), new StringDeserializer());
                    KafkaProducer<String, String> p = new KafkaProducer<>(producer, new StringSerializer(), new StringSerializer())) {
                c.subscribe(List.of(orders));
                List<ConsumerRecord<String, String>> got = new ArrayList<>();
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (got.isEmpty() && System.nanoTime() < deadline) {
                    c.poll(Duration.ofMillis(200)).forEach(got::add);
                }
                assertEquals(1, got.size());
                order = got.get(0);
                // The service's code knows nothing of stamps.
                p.send(new ProducerRecord<>(payments, order.key(), "paid"));
                p.send(new ProducerRecord<>(audit, order.key(), "paid o-1"));
                p.flush();
            }
            Entry orderAt = new Entry(new Channel(idOf(admin, orders), 0), order.offset());
            ConsumerRecord<String, String> payment = readAll(payments, 1).get(0);
            Stamp first = stampOf(payment);
            assertEquals(0, first.sender().seq());
            assertEquals(0, first.sender().id().getMostSignificantBits(), "a short sender id");
            assertEquals(List.of(orderAt), first.clock());
            // The second send waited for the first one's acknowledgement and claims it.
            Stamp second = stampOf(readAll(audit, 1).get(0));
            assertEquals(1, second.sender().seq());
            assertEquals(0L, second.ackedThrough());
            List<Entry> want = new ArrayList<>(List.of(orderAt, new Entry(new Channel(idOf(admin, payments), 0), payment.offset())));
            want.sort((a, b) -> a.channel().compareTo(b.channel()));
            assertEquals(want, second.clock());
        }
    }
}
