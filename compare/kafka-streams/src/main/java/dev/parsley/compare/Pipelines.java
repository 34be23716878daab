package dev.parsley.compare;

import java.util.Arrays;
import java.util.Locale;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TableJoined;
import org.apache.kafka.streams.state.KeyValueStore;

/** The pipelines, written as Kafka Streams users write them. */
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

    /**
     * Deliveries: each order with its customer's name and city (a foreign-key join of the
     * orders table with the customers table), and the region of that city (a join with the
     * global table of regions); every update goes to {@code output} (String key: the order id,
     * JSON value). Not run by the comparison: its Parsley version counts its lines against it.
     */
    static Topology deliveries(String ordersTopic, String customersTopic, String regionsTopic,
            String output) {
        Serde<Model.Order> orderSerde = Json.serde(Model.Order.class);
        Serde<Model.Customer> customerSerde = Json.serde(Model.Customer.class);
        Serde<Model.Delivery> deliverySerde = Json.serde(Model.Delivery.class);
        StreamsBuilder builder = new StreamsBuilder();
        KTable<String, Model.Customer> customers =
                builder.table(customersTopic, Consumed.with(Serdes.String(), customerSerde));
        GlobalKTable<String, String> regions =
                builder.globalTable(regionsTopic, Consumed.with(Serdes.String(), Serdes.String()));
        builder.table(ordersTopic, Consumed.with(Serdes.String(), orderSerde))
                .join(customers, Model.Order::customer, Model.Delivery::of,
                        TableJoined.as("order-customer"),
                        Materialized.with(Serdes.String(), deliverySerde))
                .toStream()
                .join(regions, (orderId, delivery) -> delivery.city(), Model.Delivery::inRegion)
                .to(output, Produced.with(Serdes.String(), deliverySerde));
        return builder.build();
    }
}
