//! The order generator and `produce-orders`.
//!
//! Order `n` (1 to N) has id [`order_id(n)`](crate::model::order_id), a customer drawn
//! uniformly from `c-0001` to `c-{C}` and an amount from 1.00 to 500.00 (cents, uniformly). The
//! same seed gives the same orders.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{Order, customer_id, order_id};
use crate::plain::PlainProducer;

/// The smallest amount of an order, in cents.
pub const MIN_AMOUNT_CENTS: i64 = 100;
/// The largest amount of an order, in cents.
pub const MAX_AMOUNT_CENTS: i64 = 50_000;

/// `orders` orders over `customers` customers, seeded: `(order id, order)` in order-number
/// order.
///
/// # Panics
/// When `customers` is 0.
pub fn generate(orders: u64, customers: u64, seed: u64) -> Vec<(String, Order)> {
    assert!(customers > 0, "an order needs a customer");
    let mut rng = StdRng::seed_from_u64(seed);
    (1..=orders)
        .map(|n| {
            let order = Order {
                customer: customer_id(rng.random_range(1..=customers)),
                amount_cents: rng.random_range(MIN_AMOUNT_CENTS..=MAX_AMOUNT_CENTS),
            };
            (order_id(n), order)
        })
        .collect()
}

/// What [`produce_orders`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducedOrders {
    /// Orders acknowledged by the broker.
    pub orders: u64,
    /// Their amounts added up, in cents.
    pub total_cents: i64,
    /// From the first send to the last acknowledgement.
    pub elapsed: Duration,
}

/// Writes [`generate`]`(orders, customers, seed)` to `topic` (keys: order ids, values: JSON,
/// record timestamps: now) with a [`PlainProducer`] and returns once every order is
/// acknowledged. The topic must exist.
///
/// # Errors
/// No customers, or a producer error.
pub fn produce_orders(
    bootstrap: &str,
    topic: &str,
    orders: u64,
    customers: u64,
    seed: u64,
) -> Result<ProducedOrders> {
    ensure!(customers > 0, "--customers must be at least 1");
    write_orders(bootstrap, topic, &generate(orders, customers, seed))
}

/// Writes `orders` (`(order id, order)`, as [`generate`] gives them) to `topic` in their
/// order, as [`produce_orders`] does, and returns once every one is acknowledged. The topic
/// must exist.
///
/// # Errors
/// A producer error.
pub fn write_orders(
    bootstrap: &str,
    topic: &str,
    orders: &[(String, Order)],
) -> Result<ProducedOrders> {
    let mut producer = PlainProducer::new(bootstrap)?;
    let started = Instant::now();
    let mut total_cents = 0;
    for (id, order) in orders {
        total_cents += order.amount_cents;
        let value = serde_json::to_vec(order).context("encoding an order")?;
        producer.send(topic, id.as_bytes(), &value)?;
    }
    let orders = producer
        .finish()
        .with_context(|| format!("writing orders to {topic}"))?;
    Ok(ProducedOrders {
        orders,
        total_cents,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_orders_and_another_seed_others() {
        assert_eq!(generate(300, 20, 5), generate(300, 20, 5));
        assert_ne!(generate(300, 20, 5), generate(300, 20, 6));
    }

    #[test]
    fn orders_are_numbered_from_one_with_customers_and_amounts_in_range() {
        let orders = generate(1_000, 7, 1);
        assert_eq!(orders.len(), 1_000);
        assert_eq!(orders[0].0, "o-000001");
        assert_eq!(orders[999].0, "o-001000");
        let customers: HashSet<&str> = orders.iter().map(|(_, o)| o.customer.as_str()).collect();
        let all: HashSet<String> = (1..=7).map(customer_id).collect();
        assert_eq!(
            customers,
            all.iter().map(String::as_str).collect(),
            "every customer orders"
        );
        assert!(
            orders
                .iter()
                .all(|(_, o)| (MIN_AMOUNT_CENTS..=MAX_AMOUNT_CENTS).contains(&o.amount_cents))
        );
    }
}
