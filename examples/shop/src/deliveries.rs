//! Deliveries in Parsley's DSL: each order with its customer's name and city — a foreign-key
//! join of the orders table (order id → [`Order`]) with the customers table (customer id →
//! [`Customer`]), which are not co-partitioned — and the region of that city, from a global
//! table of regions (city → region) that every task reads whole; every update goes to the
//! output (UTF-8 key: the order id; value: [`Delivery`] as JSON).
//!
//! The same pipeline in Kafka Streams
//! (`compare/kafka-streams/src/main/java/dev/parsley/compare/Pipelines.java`):
//!
//! ```java
//! static Topology deliveries(String ordersTopic, String customersTopic, String regionsTopic,
//!         String output) {
//!     Serde<Model.Order> orderSerde = Json.serde(Model.Order.class);
//!     Serde<Model.Customer> customerSerde = Json.serde(Model.Customer.class);
//!     Serde<Model.Delivery> deliverySerde = Json.serde(Model.Delivery.class);
//!     StreamsBuilder builder = new StreamsBuilder();
//!     KTable<String, Model.Customer> customers =
//!             builder.table(customersTopic, Consumed.with(Serdes.String(), customerSerde));
//!     GlobalKTable<String, String> regions =
//!             builder.globalTable(regionsTopic, Consumed.with(Serdes.String(), Serdes.String()));
//!     builder.table(ordersTopic, Consumed.with(Serdes.String(), orderSerde))
//!             .join(customers, Model.Order::customer, Model.Delivery::of,
//!                     TableJoined.as("order-customer"),
//!                     Materialized.with(Serdes.String(), deliverySerde))
//!             .toStream()
//!             .join(regions, (orderId, delivery) -> delivery.city(), Model.Delivery::inRegion)
//!             .to(output, Produced.with(Serdes.String(), deliverySerde));
//!     return builder.build();
//! }
//! ```
//!
//! Lines of the pipeline definition: **Parsley 11, Kafka Streams 16** (0.69×), counted as the
//! revenue pipeline's are (module `pipeline`); the test `line_counts_are_the_documented_ones`
//! recounts both. Both sides build the delivery with the same two helpers
//! ([`Delivery::of`], [`Delivery::in_region`]; `Model.Delivery` in Java).
//!
//! The differences: no serde and no store is named (Parsley's `Auto` codec, and state kept in
//! the stages); the global table is kept by every task of the stage that joins it, where Kafka
//! Streams keeps one copy per instance; and the join is causal — an order stamped after a
//! region change is joined with that change or a later one.

use parsley::prelude::*;

use crate::model::{Customer, Delivery, Order};

/// Deliveries from `orders` (order id → [`Order`]), `customers` (customer id → [`Customer`])
/// and `regions` (city → region name) to `output` (order id → [`Delivery`]), as the
/// application `application_id`.
///
/// # Errors
/// An invalid topology (an empty or repeated topic name).
pub fn deliveries(
    application_id: &str,
    orders: &str,
    customers: &str,
    regions: &str,
    output: &str,
) -> Result<Topology, parsley::stage::Error> {
    let builder = StreamsBuilder::new(application_id);
    let customers = builder.table::<String, Customer>(customers);
    let regions = builder.global_table::<String, String>(regions);
    builder
        .table::<String, Order>(orders)
        .named("order-customer")
        .join_on_foreign_key(&customers, |o| Some(o.customer.clone()), Delivery::of)
        .to_stream()
        .join_global(&regions, |_, d| Some(d.city.clone()), |d, r| d.in_region(r))
        .to(output);
    builder.build()
}

#[cfg(test)]
mod tests {
    use parsley::TopologyTestDriver;

    use super::*;
    use crate::pipeline::tests::documented_line_counts;

    #[test]
    fn line_counts_are_the_documented_ones() {
        let rust = include_str!("deliveries.rs");
        let (p, k) =
            documented_line_counts(rust, "pub fn deliveries(", "static Topology deliveries(");
        assert!(p <= k, "{p} lines against {k}: above 1.0×");
    }

    fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
        serde_json::to_vec(value).unwrap()
    }

    /// Orders (3 partitions) of customers (2 partitions) in cities whose regions (1 partition)
    /// change: every delivery names its customer and the region its city has when it is made.
    #[test]
    fn each_order_is_delivered_with_its_customer_and_region_in_memory() {
        let t = deliveries("shop", "orders", "customers", "regions", "deliveries").unwrap();
        assert_eq!(t.stages().len(), 2, "{}", t.describe());
        let driver = TopologyTestDriver::builder(t)
            .partitions("orders", 3)
            .partitions("customers", 2)
            .build()
            .unwrap();
        let crm = driver.causal_producer("crm");
        crm.send("regions", b"Lyon", b"south").unwrap();
        crm.send("regions", b"Lille", b"north").unwrap();
        let customer = |id: &str, name: &str, city: &str| {
            let c = Customer {
                name: name.into(),
                city: city.into(),
            };
            crm.send("customers", id.as_bytes(), &json(&c)).unwrap();
        };
        customer("c-1", "Ann", "Lyon");
        customer("c-2", "Bo", "Lille");
        let shop = driver.causal_producer("shop");
        let order = |id: &str, customer: &str, cents: i64| {
            let o = Order {
                customer: customer.into(),
                amount_cents: cents,
            };
            shop.send("orders", id.as_bytes(), &json(&o)).unwrap();
        };
        order("o-1", "c-1", 500);
        order("o-2", "c-2", 250);
        // Ann moves to Lille: her order is delivered again, to the north.
        customer("c-1", "Ann", "Lille");
        let mut out = driver.output_topic("deliveries", Utf8, Json).unwrap();
        let got: Vec<(String, Delivery)> = out.read_key_values();
        let delivery = |customer: &str, name: &str, city: &str, region: &str, cents| Delivery {
            customer: customer.into(),
            name: name.into(),
            city: city.into(),
            region: region.into(),
            amount_cents: cents,
        };
        assert_eq!(
            got,
            [
                ("o-1".into(), delivery("c-1", "Ann", "Lyon", "south", 500)),
                ("o-2".into(), delivery("c-2", "Bo", "Lille", "north", 250)),
                ("o-1".into(), delivery("c-1", "Ann", "Lille", "north", 500)),
            ]
        );
    }
}
