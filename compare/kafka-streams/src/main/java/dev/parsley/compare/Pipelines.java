package dev.parsley.compare;

import java.util.Arrays;
import java.util.Locale;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/** The two pipelines, written as Kafka Streams users write them. */
final class Pipelines {
    private Pipelines() {}

    /**
     * Word count: each line lowercased and split on whitespace, regrouped by word, counted;
     * every update of a count goes to {@code output} (String key, Long value).
     */
    static Topology wordCount(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> lines =
                builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
        lines.flatMapValues(line -> Arrays.stream(line.toLowerCase(Locale.ROOT).split("\\s+"))
                        .filter(word -> !word.isEmpty())
                        .toList())
                .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("word-counts")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    /**
     * Shop revenue: each payment joined with its order (an inner stream–table join against the
     * orders table), re-keyed by the order's customer and summed per customer; every update of
     * a customer's total goes to {@code output} (String key, Long value: cents).
     */
    static Topology shop(String ordersTopic, String paymentsTopic, String output) {
        Serde<Model.Order> orderSerde = Json.serde(Model.Order.class);
        Serde<Model.Payment> paymentSerde = Json.serde(Model.Payment.class);
        Serde<Model.Settlement> settlementSerde = Json.serde(Model.Settlement.class);
        StreamsBuilder builder = new StreamsBuilder();
        KTable<String, Model.Order> orders = builder.table(ordersTopic,
                Consumed.with(Serdes.String(), orderSerde),
                Materialized.<String, Model.Order, KeyValueStore<Bytes, byte[]>>as("orders"));
        KStream<String, Model.Payment> payments =
                builder.stream(paymentsTopic, Consumed.with(Serdes.String(), paymentSerde));
        payments.join(orders,
                        (payment, order) -> new Model.Settlement(
                                payment.order(), order.customer(), payment.amount_cents()),
                        Joined.with(Serdes.String(), paymentSerde, orderSerde))
                .selectKey((orderId, settlement) -> settlement.customer())
                .groupByKey(Grouped.with("settlements-by-customer", Serdes.String(), settlementSerde))
                .aggregate(() -> 0L,
                        (customer, settlement, total) -> total + settlement.amount_cents(),
                        Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("revenue")
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Serdes.Long()))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }
}
