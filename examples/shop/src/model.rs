//! The shop's records. Values are JSON (serde's field names); keys are UTF-8 strings: an order
//! id (`o-000017`) for orders and payments, a customer id (`c-0003`) for revenue.

use serde::{Deserialize, Serialize};

/// An order, keyed by its order id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The customer's id.
    pub customer: String,
    /// What the order costs, in cents.
    pub amount_cents: i64,
}

/// A payment of an order, keyed by the order id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The order id.
    pub order: String,
    /// What was paid, in cents.
    pub amount_cents: i64,
}

/// A payment joined with its order: what the revenue per customer sums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    /// The order id.
    pub order: String,
    /// The order's customer.
    pub customer: String,
    /// What was paid, in cents.
    pub amount_cents: i64,
}

/// A customer, keyed by the customer id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Customer {
    /// The customer's name.
    pub name: String,
    /// The city the customer's orders go to: the key of the regions table.
    pub city: String,
}

/// An order to deliver, keyed by the order id: the order with its customer's name and city,
/// and the region of that city (empty until it is known).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The customer's id.
    pub customer: String,
    /// The customer's name.
    pub name: String,
    /// The city to deliver to.
    pub city: String,
    /// The city's region.
    pub region: String,
    /// What the order costs, in cents.
    pub amount_cents: i64,
}

impl Delivery {
    /// `order` to deliver to `customer`, its region not known yet.
    pub fn of(order: &Order, customer: &Customer) -> Delivery {
        Delivery {
            customer: order.customer.clone(),
            name: customer.name.clone(),
            city: customer.city.clone(),
            region: String::new(),
            amount_cents: order.amount_cents,
        }
    }

    /// The delivery with its city's region.
    pub fn in_region(self, region: &str) -> Delivery {
        Delivery {
            region: region.to_string(),
            ..self
        }
    }
}

/// The id of order number `n` (numbers start at 1): `o-000017`.
pub fn order_id(n: u64) -> String {
    format!("o-{n:06}")
}

/// The number of an order id made by [`order_id`], if it is one.
pub fn order_number(id: &str) -> Option<u64> {
    id.strip_prefix("o-")?.parse().ok()
}

/// The id of customer number `n` (numbers start at 1): `c-0003`.
pub fn customer_id(n: u64) -> String {
    format!("c-{n:04}")
}

/// Whether order number `n` stays unpaid when every `skip_every`-th order does (`None` or
/// `Some(0)`: every order is paid).
pub fn unpaid(n: u64, skip_every: Option<u64>) -> bool {
    skip_every.is_some_and(|k| k > 0 && n.is_multiple_of(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_and_values_are_the_documented_json() {
        assert_eq!(order_id(17), "o-000017");
        assert_eq!(order_number("o-000017"), Some(17));
        assert_eq!(order_number("x-1"), None);
        assert_eq!(customer_id(3), "c-0003");
        let order = Order {
            customer: customer_id(3),
            amount_cents: 1250,
        };
        let json = serde_json::to_string(&order).unwrap();
        assert_eq!(json, r#"{"customer":"c-0003","amount_cents":1250}"#);
        assert_eq!(serde_json::from_str::<Order>(&json).unwrap(), order);
        let payment = Payment {
            order: order_id(17),
            amount_cents: 1250,
        };
        assert_eq!(
            serde_json::to_string(&payment).unwrap(),
            r#"{"order":"o-000017","amount_cents":1250}"#
        );
        let settlement = Settlement {
            order: order_id(17),
            customer: customer_id(3),
            amount_cents: 1250,
        };
        assert_eq!(
            serde_json::to_string(&settlement).unwrap(),
            r#"{"order":"o-000017","customer":"c-0003","amount_cents":1250}"#
        );
    }

    #[test]
    fn every_kth_order_is_unpaid() {
        let unpaid_of_10 = |k| (1..=10).filter(|n| unpaid(*n, k)).count();
        assert_eq!(unpaid_of_10(Some(3)), 3);
        assert_eq!(unpaid_of_10(Some(1)), 10);
        assert_eq!(unpaid_of_10(Some(0)), 0);
        assert_eq!(unpaid_of_10(None), 0);
    }
}
