//! Revenue per customer in Parsley's DSL: each payment joined with its order (an inner
//! stream–table join against the orders table, keyed by order id), re-keyed by the order's
//! customer and summed per customer; every update of a customer's total goes to the output
//! (UTF-8 key: the customer id; value: cents as a JSON number).
//!
//! The same pipeline in Kafka Streams, as `cargo xtask compare` runs it
//! (`compare/kafka-streams/src/main/java/dev/parsley/compare/Pipelines.java`):
//!
//! ```java
//! static Topology shop(String ordersTopic, String paymentsTopic, String output) {
//!     Serde<Model.Order> orderSerde = Json.serde(Model.Order.class);
//!     Serde<Model.Payment> paymentSerde = Json.serde(Model.Payment.class);
//!     Serde<Model.Settlement> settlementSerde = Json.serde(Model.Settlement.class);
//!     StreamsBuilder builder = new StreamsBuilder();
//!     KTable<String, Model.Order> orders = builder.table(ordersTopic,
//!             Consumed.with(Serdes.String(), orderSerde),
//!             Materialized.<String, Model.Order, KeyValueStore<Bytes, byte[]>>as("orders"));
//!     KStream<String, Model.Payment> payments =
//!             builder.stream(paymentsTopic, Consumed.with(Serdes.String(), paymentSerde));
//!     payments.join(orders,
//!                     (payment, order) -> new Model.Settlement(
//!                             payment.order(), order.customer(), payment.amount_cents()),
//!                     Joined.with(Serdes.String(), paymentSerde, orderSerde))
//!             .selectKey((orderId, settlement) -> settlement.customer())
//!             .groupByKey(Grouped.with("settlements-by-customer", Serdes.String(), settlementSerde))
//!             .aggregate(() -> 0L,
//!                     (customer, settlement, total) -> total + settlement.amount_cents(),
//!                     Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("revenue")
//!                             .withKeySerde(Serdes.String())
//!                             .withValueSerde(Serdes.Long()))
//!             .toStream()
//!             .to(output, Produced.with(Serdes.String(), Serdes.Long()));
//!     return builder.build();
//! }
//! ```
//!
//! Lines of the pipeline definition: **Parsley 19, Kafka Streams 23** (0.83×). Counted on each
//! side: the non-blank, non-comment lines of the body of the function that builds the topology
//! (its signature and closing brace left out), as the project's formatters leave them
//! (`rustfmt` here; `Pipelines.java` as it is). The test `line_counts_are_the_documented_ones`
//! recounts both and checks that the Java above is the one in `Pipelines.java`.
//!
//! The differences: Parsley's `Auto` codec reads and writes a `String` as UTF-8 and other
//! values as JSON, so no serde is named (the totals go out as JSON numbers, Kafka Streams' as
//! 8-byte `Long`s); the table, the join's copy of it and the sums are kept in the stages'
//! state, so no store is materialized by name; `named("revenue")` names the repartition topic,
//! `{application}-revenue-repartition`, and the sums' state.
//!
//! The join is where the two can differ in what they compute. Kafka Streams takes the records
//! of the two topics in timestamp order, so a payment timestamped before its order (a payments
//! service whose clock runs behind) meets no order and is dropped. Parsley's causal gate
//! delivers a payment only after the order version its stamp claims, whatever the timestamps
//! say (the payments service stamps each payment with a claim on its order).
//!
//! [`hourly_revenue`] is the same join and re-keying with the sums in one-hour windows of
//! event time, every update emitted: the pipeline `cargo xtask replay` runs live and replays.

use std::time::Duration;

use parsley::prelude::*;

use crate::model::{Order, Payment, Settlement};

/// Revenue per customer from `orders` (order id → [`Order`]) and `payments` (order id →
/// [`Payment`]) to `output` (customer id → cents), as the application `application_id` (the
/// prefix of its consumer groups, transactional ids and internal topics).
///
/// # Errors
/// An invalid topology (an empty or repeated topic name).
pub fn topology(
    application_id: &str,
    orders: &str,
    payments: &str,
    output: &str,
) -> Result<Topology, parsley::stage::Error> {
    let builder = StreamsBuilder::new(application_id);
    let orders = builder.table::<String, Order>(orders);
    builder
        .stream::<String, Payment>(payments)
        .join(&orders, |payment, order| Settlement {
            order: payment.order,
            customer: order.customer.clone(),
            amount_cents: payment.amount_cents,
        })
        .select_key(|_order_id, settlement| settlement.customer.clone())
        .group_by_key()
        .named("revenue")
        .aggregate(
            || 0i64,
            |_customer, settlement, total| total + settlement.amount_cents,
        )
        .to_stream()
        .to(output);
    builder.build()
}

/// The lag of [`hourly_revenue`]'s built-in clock, ms: a live record is held this long after
/// its event time before its window takes it, so records that reach the window stage up to
/// this much later than records with later timestamps still go in event-time order. The shop's
/// producers stamp records with the time of sending, and a payment reaches the window stage
/// through the join stage within a few commit intervals (100 ms each), far below it.
pub const HOURLY_CLOCK_LAG_MS: i64 = 2_000;

/// The size of [`hourly_revenue`]'s windows: one hour.
pub const HOUR: Duration = Duration::from_secs(3_600);

/// Revenue per customer and hour: each payment joined with its order as in [`topology`],
/// re-keyed by the order's customer, and summed per customer in tumbling one-hour windows of
/// event time (the payment's record timestamp, ms since the epoch). Every payment gives an
/// update of its window's sum (`emit_updates`, as Kafka Streams' default): a window's last
/// update is its final sum, and its state is dropped once the stage's watermark passes its end. Output key: [`Windowed`] of the customer id
/// (JSON `{"key":"c-0003","start":…,"end":…}`, ms since the epoch); value: cents as a JSON
/// number.
///
/// The window stage orders by event time with the built-in clock
/// (`EventTimeOrder::new().clock(`[`HOURLY_CLOCK_LAG_MS`]`)`), so windows move on live
/// traffic: a live payment is taken [`HOURLY_CLOCK_LAG_MS`] after its event time. Topics the
/// pipeline creates itself: `{application_id}-hourly-revenue-repartition` and the clock's
/// `{application_id}-hourly-revenue-clock`.
///
/// # Errors
/// An invalid topology (an empty or repeated topic name).
pub fn hourly_revenue(
    application_id: &str,
    orders: &str,
    payments: &str,
    output: &str,
) -> Result<Topology, parsley::stage::Error> {
    let builder = StreamsBuilder::new(application_id);
    builder.event_time(EventTimeOrder::new().clock(HOURLY_CLOCK_LAG_MS));
    let orders = builder.table::<String, Order>(orders);
    builder
        .stream::<String, Payment>(payments)
        .join(&orders, |payment, order| Settlement {
            order: payment.order,
            customer: order.customer.clone(),
            amount_cents: payment.amount_cents,
        })
        .select_key(|_order_id, settlement| settlement.customer.clone())
        .group_by_key()
        .named("hourly-revenue")
        .windowed_by(TimeWindows::of_size(HOUR))
        .emit_updates()
        .aggregate(
            || 0i64,
            |_customer, settlement, total| total + settlement.amount_cents,
        )
        .to_stream()
        .to(output);
    builder.build()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The lines of the function in `source` whose signature starts with `signature` (after
    /// indentation), up to its closing brace: the line `end`.
    fn function<'a>(source: &'a str, signature: &str, end: &str) -> Vec<&'a str> {
        let mut lines: Vec<&str> = source
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(signature))
            .collect();
        let closing = lines.iter().position(|l| *l == end).expect(signature);
        lines.truncate(closing + 1);
        lines
    }

    /// How the line counts in the module docs are counted: the non-blank, non-comment lines of
    /// a function's body (after the line that ends its signature with `{`, before its closing
    /// brace).
    fn counted(function: &[&str]) -> usize {
        let opened = function.iter().position(|l| l.ends_with('{')).unwrap();
        function[opened + 1..function.len() - 1]
            .iter()
            .map(|l| l.trim())
            .filter(|t| {
                !t.is_empty() && !t.starts_with("//") && !t.starts_with("/*") && !t.starts_with('*')
            })
            .count()
    }

    /// Checks the module docs of `rust` (a source file of this crate): the Java they quote is
    /// the method of `Pipelines.java` whose signature starts with `java_signature`, dedented,
    /// and they state the line counts of that method and of the function whose signature
    /// starts with `rust_signature`. Returns the counts (Parsley, Kafka Streams).
    pub(crate) fn documented_line_counts(
        rust: &str,
        rust_signature: &str,
        java_signature: &str,
    ) -> (usize, usize) {
        let java = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../compare/kafka-streams/src/main/java/dev/parsley/compare/Pipelines.java"
        ))
        .unwrap();
        let parsley = function(rust, rust_signature, "}");
        let kafka_streams = function(&java, java_signature, "    }");
        // The Java in the module docs is the method in Pipelines.java, dedented.
        let documented: Vec<&str> = rust
            .lines()
            .skip_while(|l| *l != "//! ```java")
            .skip(1)
            .take_while(|l| *l != "//! ```")
            .map(|l| l.strip_prefix("//! ").unwrap_or(""))
            .collect();
        let in_file: Vec<&str> = kafka_streams
            .iter()
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect();
        assert_eq!(documented, in_file);
        let (p, k) = (counted(&parsley), counted(&kafka_streams));
        let stated = format!(
            "**Parsley {p}, Kafka Streams {k}** ({:.2}×)",
            p as f64 / k as f64
        );
        assert!(rust.contains(&stated), "the docs should say {stated}");
        (p, k)
    }

    #[test]
    fn line_counts_are_the_documented_ones() {
        let rust = include_str!("pipeline.rs");
        let (p, k) = documented_line_counts(rust, "pub fn topology(", "static Topology shop(");
        assert!(p * 10 <= k * 13, "{p} lines against {k}: above 1.3×");
    }

    #[test]
    fn the_pipeline_joins_then_repartitions_by_customer_into_a_named_topic() {
        let t = topology("shop", "orders", "payments", "revenue").unwrap();
        assert_eq!(t.stages().len(), 2, "{}", t.describe());
        assert_eq!(t.internal_topics()[0].name, "shop-revenue-repartition");
    }

    #[test]
    fn the_hourly_pipeline_windows_the_second_stage_on_the_built_in_clock() {
        let t = hourly_revenue("shop", "orders", "payments", "hourly").unwrap();
        assert_eq!(t.stages().len(), 2, "{}", t.describe());
        let window = t.stage("hourly-revenue").unwrap();
        let clock = window.event_time().unwrap().clock.unwrap();
        assert_eq!(clock.lag_ms, HOURLY_CLOCK_LAG_MS);
        assert_eq!(window.clock_topic(), Some("shop-hourly-revenue-clock"));
        let internal: Vec<&str> = t
            .internal_topics()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert!(
            internal.contains(&"shop-hourly-revenue-repartition"),
            "{internal:?}"
        );
    }

    /// Payments in two hours: every payment updates its customer's hour, the update carrying
    /// the payment's time.
    #[test]
    fn hourly_revenue_in_memory_updates_each_hour_and_closes_it_on_the_clock() {
        use parsley::TopologyTestDriver;

        const H: i64 = 3_600_000;
        let t0 = 480_000 * H;
        let t = hourly_revenue("shop", "orders", "payments", "hourly").unwrap();
        let driver = TopologyTestDriver::builder(t)
            .partitions("orders", 4)
            .partitions("payments", 4)
            .start_time_ms(t0)
            .build()
            .unwrap();
        let shop = driver.causal_producer("shop");
        let payments = driver.causal_producer("payments");
        let mut orders = BTreeMap::new();
        for (id, customer, cents) in [
            ("o-1", "c-1", 500),
            ("o-2", "c-1", 250),
            ("o-3", "c-2", 100),
        ] {
            let o = Order {
                customer: customer.into(),
                amount_cents: cents,
            };
            let sent = shop.send("orders", id.as_bytes(), &json(&o)).unwrap();
            orders.insert(id, (sent.coordinate, cents));
        }
        // Each payment claims its order, and is timestamped with the driver's time.
        let pay = |id: &str| {
            let (order, cents) = orders[id];
            payments.observe(order, None);
            let p = Payment {
                order: id.into(),
                amount_cents: cents,
            };
            payments.send("payments", id.as_bytes(), &json(&p)).unwrap();
        };
        let minutes = |m: i64| driver.advance_time(m * 60_000).unwrap();
        minutes(10);
        pay("o-1");
        minutes(40);
        pay("o-2");
        minutes(20);
        pay("o-3");
        minutes(1);
        let mut hourly = driver.output_topic("hourly", Json, Json).unwrap();
        let got: Vec<(Windowed<String>, i64)> = hourly.read_key_values();
        let w = |c: &str, hour: i64| Windowed {
            key: c.to_string(),
            start: t0 + hour * H,
            end: t0 + (hour + 1) * H,
        };
        assert_eq!(
            got,
            [(w("c-1", 0), 500), (w("c-1", 0), 750), (w("c-2", 1), 100)]
        );
        // The clock passed the first hour: its window closed and its state is gone.
        assert_eq!(driver.metrics("hourly-revenue").unwrap().timers_fired, 1);
    }

    fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
        serde_json::to_vec(value).unwrap()
    }

    /// The payments service's view in a driver test: `orders` written by a plain producer,
    /// each payment stamped with a claim on its order by a causal producer that saw it.
    #[test]
    fn revenue_per_customer_in_memory_with_a_payment_ahead_of_its_order() {
        use parsley::TopologyTestDriver;

        let t = topology("shop", "orders", "payments", "revenue").unwrap();
        let driver = TopologyTestDriver::builder(t)
            .partitions("orders", 4)
            .partitions("payments", 4)
            .build()
            .unwrap();
        let shop = driver.causal_producer("shop");
        let payments = driver.causal_producer("payments");
        let order = |id: &str, customer: &str, cents: i64| {
            let o = Order {
                customer: customer.into(),
                amount_cents: cents,
            };
            shop.send("orders", id.as_bytes(), &json(&o)).unwrap()
        };
        let pay = |id: &str, cents: i64| {
            let p = Payment {
                order: id.into(),
                amount_cents: cents,
            };
            payments.send("payments", id.as_bytes(), &json(&p)).unwrap();
        };
        let o1 = order("o-1", "c-1", 500);
        payments.observe(o1.coordinate, None);
        pay("o-1", 500);
        // An order in the shop's open transaction: written, not visible to the join yet. The
        // payments service saw it and pays; the payment waits for it.
        shop.begin();
        let o2 = order("o-2", "c-1", 250);
        payments.observe(o2.coordinate, None);
        pay("o-2", 250);
        let mut revenue = driver.output_topic("revenue", Utf8, Json).unwrap();
        assert_eq!(revenue.read_key_values(), [("c-1".to_string(), 500i64)]);
        shop.commit().unwrap();
        assert_eq!(revenue.read_key_values(), [("c-1".to_string(), 750i64)]);
        // A payment of an order that never existed joins nothing (an inner join).
        pay("o-9", 100);
        assert!(revenue.read_key_values().is_empty());
    }
}
