package dev.parsley.stamp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.HashMap;
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
 * The shop end to end with a Java payments service stamped by the interceptors, on the broker,
 * feeding the {@code shop} example's Parsley pipeline ({@code shop run}: each payment joined
 * with its order, summed per customer). The history is replayed: orders and payments are
 * written first, the payments timestamped a minute before their orders (a service whose clock
 * runs behind), then the pipeline reads both. Stamped, the revenue per customer is exact; the
 * negative control, the same service without the interceptors, gets its payments taken by
 * their timestamps, before their orders, and dropped by the inner join.
 *
 * <p>Needs {@code PARSLEY_BOOTSTRAP} and {@code SHOP_BIN} (the {@code shop} binary), as
 * {@code cargo xtask java} sets them.
 */
class ShopEndToEndTest {
    private static final String BOOTSTRAP = System.getenv("PARSLEY_BOOTSTRAP");
    private static final String SHOP = System.getenv("SHOP_BIN");
    private static final int ORDERS = 300;
    private static final int PARTITIONS = 4;
    private static final int SKIP_EVERY = 7;
    private static final long SKEW_MS = 60_000;
    private static final ObjectMapper JSON = new ObjectMapper();

    private static void shop(String... args) throws Exception {
        List<String> command = new java.util.ArrayList<>(List.of(SHOP));
        command.addAll(List.of(args));
        Process p = new ProcessBuilder(command)
                .redirectOutput(ProcessBuilder.Redirect.DISCARD)
                .redirectError(ProcessBuilder.Redirect.DISCARD)
                .start();
        assertTrue(p.waitFor(300, TimeUnit.SECONDS), "shop " + args[0] + " did not end");
        assertEquals(0, p.exitValue(), "shop " + String.join(" ", args));
    }

    private static boolean unpaid(String orderId) {
        return Integer.parseInt(orderId.substring(2)) % SKIP_EVERY == 0;
    }

    /** Every committed record of {@code topic}, read up to its end offsets now. */
    private static List<ConsumerRecord<String, String>> readAll(String topic) {
        Properties p = new Properties();
        p.put("bootstrap.servers", BOOTSTRAP);
        p.put("group.id", "read-" + UUID.randomUUID());
        p.put("isolation.level", "read_committed");
        List<ConsumerRecord<String, String>> out = new java.util.ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            List<TopicPartition> parts = new java.util.ArrayList<>();
            for (int i = 0; i < PARTITIONS; i++) {
                parts.add(new TopicPartition(topic, i));
            }
            c.assign(parts);
            c.seekToBeginning(parts);
            Map<TopicPartition, Long> ends = c.endOffsets(parts);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (parts.stream().anyMatch(tp -> c.position(tp) < ends.get(tp))) {
                assertTrue(System.nanoTime() < deadline, "reading " + topic);
                c.poll(Duration.ofMillis(200)).forEach(out::add);
            }
        }
        return out;
    }

    /** The payments service: pays every order of {@code orders} but every seventh. */
    private static long pay(String orders, String payments, boolean stamped) throws Exception {
        String clockId = "shop-" + UUID.randomUUID();
        Properties consumer = new Properties();
        consumer.put("bootstrap.servers", BOOTSTRAP);
        consumer.put("group.id", "payments-" + UUID.randomUUID());
        consumer.put("auto.offset.reset", "earliest");
        consumer.put("isolation.level", "read_committed");
        Properties producer = new Properties();
        producer.put("bootstrap.servers", BOOTSTRAP);
        producer.put("enable.idempotence", "true");
        producer.put("linger.ms", "0");
        if (stamped) {
            consumer.put("interceptor.classes", ParsleyConsumerInterceptor.class.getName());
            consumer.put(ParsleyProducerInterceptor.CLOCK_ID, clockId);
            producer.put("interceptor.classes", ParsleyProducerInterceptor.class.getName());
            producer.put(ParsleyProducerInterceptor.CLOCK_ID, clockId);
        }
        long paid = 0;
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumer, new StringDeserializer(), new StringDeserializer());
                KafkaProducer<String, String> p = new KafkaProducer<>(producer, new StringSerializer(), new StringSerializer())) {
            c.subscribe(List.of(orders));
            int read = 0;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
            while (read < ORDERS) {
                assertTrue(System.nanoTime() < deadline, "reading the orders");
                for (ConsumerRecord<String, String> order : c.poll(Duration.ofMillis(200))) {
                    read++;
                    if (unpaid(order.key())) {
                        continue;
                    }
                    long cents = JSON.readTree(order.value()).get("amount_cents").asLong();
                    String payment = JSON.writeValueAsString(Map.of("order", order.key(), "amount_cents", cents));
                    p.send(new ProducerRecord<>(payments, null, order.timestamp() - SKEW_MS, order.key(), payment));
                    paid += cents;
                }
            }
            p.flush();
        }
        return paid;
    }

    /**
     * The payments service as a Kafka Streams application: each order but every seventh mapped
     * to its payment, timestamped a minute before it, with the interceptors configured on its
     * consumer and producer ({@code consumer.} and {@code producer.} prefixes) when
     * {@code stamped}. Runs until the payments topic holds every payment.
     */
    private static long payWithKafkaStreams(String orders, String payments, boolean stamped) throws Exception {
        Properties p = new Properties();
        p.put(org.apache.kafka.streams.StreamsConfig.APPLICATION_ID_CONFIG, "payments-" + UUID.randomUUID());
        p.put(org.apache.kafka.streams.StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
        p.put(org.apache.kafka.streams.StreamsConfig.STATE_DIR_CONFIG,
                java.nio.file.Files.createTempDirectory("ks-payments").toString());
        p.put(org.apache.kafka.streams.StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        if (stamped) {
            String clockId = "ks-" + UUID.randomUUID();
            p.put(org.apache.kafka.streams.StreamsConfig.mainConsumerPrefix("interceptor.classes"),
                    ParsleyConsumerInterceptor.class.getName());
            p.put(org.apache.kafka.streams.StreamsConfig.mainConsumerPrefix(ParsleyProducerInterceptor.CLOCK_ID), clockId);
            p.put(org.apache.kafka.streams.StreamsConfig.producerPrefix("interceptor.classes"),
                    ParsleyProducerInterceptor.class.getName());
            p.put(org.apache.kafka.streams.StreamsConfig.producerPrefix(ParsleyProducerInterceptor.CLOCK_ID), clockId);
        }
        var builder = new org.apache.kafka.streams.StreamsBuilder();
        var serde = org.apache.kafka.common.serialization.Serdes.String();
        builder.stream(orders, org.apache.kafka.streams.kstream.Consumed.with(serde, serde))
                .filter((id, order) -> !unpaid(id))
                .processValues(() -> new org.apache.kafka.streams.processor.api.FixedKeyProcessor<String, String, String>() {
                    private org.apache.kafka.streams.processor.api.FixedKeyProcessorContext<String, String> context;

                    @Override
                    public void init(org.apache.kafka.streams.processor.api.FixedKeyProcessorContext<String, String> context) {
                        this.context = context;
                    }

                    @Override
                    public void process(org.apache.kafka.streams.processor.api.FixedKeyRecord<String, String> order) {
                        try {
                            long cents = JSON.readTree(order.value()).get("amount_cents").asLong();
                            String payment = JSON.writeValueAsString(Map.of("order", order.key(), "amount_cents", cents));
                            context.forward(order.withValue(payment).withTimestamp(order.timestamp() - SKEW_MS));
                        } catch (Exception e) {
                            throw new IllegalStateException(e);
                        }
                    }
                })
                .to(payments, org.apache.kafka.streams.kstream.Produced.with(serde, serde));
        long expected = 0;
        for (ConsumerRecord<String, String> o : readAll(orders)) {
            if (!unpaid(o.key())) {
                expected++;
            }
        }
        try (var streams = new org.apache.kafka.streams.KafkaStreams(builder.build(), p)) {
            streams.start();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
            while (readAll(payments).size() < expected) {
                assertTrue(System.nanoTime() < deadline, "the Kafka Streams payments service");
            }
        }
        long paid = 0;
        for (ConsumerRecord<String, String> r : readAll(payments)) {
            paid += JSON.readTree(r.value()).get("amount_cents").asLong();
        }
        return paid;
    }

    /** The revenue per customer the pipeline wrote last, against the orders' paid amounts. */
    private static long[] scenario(boolean stamped) throws Exception {
        return scenario(stamped, false);
    }

    private static long[] scenario(boolean stamped, boolean kafkaStreams) throws Exception {
        String run = UUID.randomUUID().toString().substring(0, 12);
        String orders = "java-shop-orders-" + run;
        String payments = "java-shop-payments-" + run;
        String revenue = "java-shop-revenue-" + run;
        shop("produce-orders", "--bootstrap", BOOTSTRAP, "--topic", orders, "--partitions", String.valueOf(PARTITIONS),
                "--orders", String.valueOf(ORDERS), "--customers", "20");
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", BOOTSTRAP))) {
            admin.createTopics(List.of(new NewTopic(payments, PARTITIONS, (short) 1))).all().get(30, TimeUnit.SECONDS);
        }
        long paid = kafkaStreams ? payWithKafkaStreams(orders, payments, stamped) : pay(orders, payments, stamped);
        shop("run", "--bootstrap", BOOTSTRAP, "--application-id", "java-shop-" + run, "--orders", orders,
                "--payments", payments, "--output", revenue, "--until-caught-up", "--timeout-secs", "300");
        Map<String, Long> expected = new HashMap<>();
        for (ConsumerRecord<String, String> o : readAll(orders)) {
            if (!unpaid(o.key())) {
                JsonNode order = JSON.readTree(o.value());
                expected.merge(order.get("customer").asText(), order.get("amount_cents").asLong(), Long::sum);
            }
        }
        Map<String, Long> got = new HashMap<>();
        for (ConsumerRecord<String, String> r : readAll(revenue)) {
            got.put(r.key(), Long.parseLong(r.value()));
        }
        long joined = got.values().stream().mapToLong(Long::longValue).sum();
        if (stamped) {
            assertEquals(expected, got);
        }
        return new long[] {joined, paid};
    }

    @Test
    void stampedPaymentsAreEachJoinedWithTheirOrderAndUnstampedOnesAreNot() throws Exception {
        assumeTrue(BOOTSTRAP != null && SHOP != null, "needs PARSLEY_BOOTSTRAP and SHOP_BIN (cargo xtask java)");
        long[] stamped = scenario(true);
        assertEquals(stamped[1], stamped[0]);
        long[] unstamped = scenario(false);
        System.err.printf("negative control (no interceptors, clock %d ms behind): %d of %d cents joined%n",
                SKEW_MS, unstamped[0], unstamped[1]);
        assertTrue(unstamped[0] < unstamped[1], "payments taken before their orders");
    }

    @Test
    void aKafkaStreamsApplicationStampedByTheInterceptorsIsReadInCausalOrder() throws Exception {
        assumeTrue(BOOTSTRAP != null && SHOP != null, "needs PARSLEY_BOOTSTRAP and SHOP_BIN (cargo xtask java)");
        long[] stamped = scenario(true, true);
        assertEquals(stamped[1], stamped[0]);
        long[] unstamped = scenario(false, true);
        System.err.printf("negative control (Kafka Streams without interceptors, clock %d ms behind): %d of %d cents joined%n",
                SKEW_MS, unstamped[0], unstamped[1]);
        assertTrue(unstamped[0] < unstamped[1], "payments taken before their orders");
    }
}
