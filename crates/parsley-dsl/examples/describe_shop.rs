//! Prints what the shop and word-count pipelines compile to.
use parsley_dsl::StreamsBuilder;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
struct Order {
    customer: String,
    amount_cents: i64,
}
#[derive(Clone, Serialize, Deserialize)]
struct Payment {
    amount_cents: i64,
}

fn main() {
    let builder = StreamsBuilder::new("shop");
    let orders = builder.table::<String, Order>("orders");
    builder
        .stream::<String, Payment>("payments")
        .join(&orders, |_payment, order| order.clone())
        .select_key(|_order_id, order| order.customer.clone())
        .group_by_key()
        .named("revenue")
        .aggregate(
            || 0i64,
            |_customer, order, total| total + order.amount_cents,
        )
        .to_stream()
        .to("revenue");
    println!("{}", builder.build().unwrap().describe());
    let builder = StreamsBuilder::new("wordcount");
    builder
        .stream::<(), String>("lines")
        .flat_map_values(|line| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, word| word.clone())
        .count()
        .to_stream()
        .to("word-counts");
    println!("{}", builder.build().unwrap().describe());
}
