//! `shop`: the shop pipeline's command line.
//!
//! - `produce-orders`: writes generated orders to an existing topic;
//! - `payments`: the payments service: pays the orders (but every K-th), each payment stamped
//!   with a claim on its order.
//!
//! `cargo xtask compare` runs them, and the same pipeline in Kafka Streams, on the same input.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use shop::orders::produce_orders;
use shop::payments::{self, PaymentsConfig};

/// A shop on Kafka: order generator and payments service.
#[derive(Parser, Debug)]
#[command(name = "shop")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The subcommands. The Parsley pipeline itself (`run`) is not part of this binary yet.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write N orders (keys: order ids `o-000001`…, values: JSON, timestamps: now) to an
    /// existing topic; returns once every order is acknowledged.
    ProduceOrders {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The orders topic (it must exist).
        #[arg(long, default_value = "orders")]
        topic: String,
        /// How many orders.
        #[arg(long)]
        orders: u64,
        /// How many customers the orders are spread over.
        #[arg(long, default_value_t = 50)]
        customers: u64,
        /// Seed of the generator: the same seed writes the same orders.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The payments service: read the orders topic to the end offsets read at start and pay
    /// each order (but every K-th) with a payment keyed by the order id, stamped by Parsley's
    /// CausalProducer with a claim on the order; exits once every payment is acknowledged.
    Payments {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The orders topic (read).
        #[arg(long, default_value = "orders")]
        orders_topic: String,
        /// The payments topic (written; it must exist).
        #[arg(long, default_value = "payments")]
        payments_topic: String,
        /// The service's consumer group.
        #[arg(long)]
        group: String,
        /// Leave every K-th order (by order number) unpaid.
        #[arg(long)]
        skip_every: Option<u64>,
        /// Stamp each payment with its order's timestamp minus this many ms (a payments
        /// service whose clock runs behind); 0: the time of sending.
        #[arg(long, default_value_t = 0)]
        clock_skew_ms: i64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shop: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::ProduceOrders {
            bootstrap,
            topic,
            orders,
            customers,
            seed,
        } => {
            let p = produce_orders(&bootstrap, &topic, orders, customers, seed)?;
            println!(
                "shop: wrote {} orders ({} cents in all) to {topic} in {:.1} s",
                p.orders,
                p.total_cents,
                p.elapsed.as_secs_f64()
            );
        }
        Cmd::Payments {
            bootstrap,
            orders_topic,
            payments_topic,
            group,
            skip_every,
            clock_skew_ms,
        } => {
            let r = payments::run(&PaymentsConfig {
                bootstrap,
                orders_topic,
                payments_topic: payments_topic.clone(),
                group,
                skip_every,
                clock_skew_ms,
            })?;
            println!(
                "shop: payments: read {} orders, paid {} ({} cents) to {payments_topic}, left {} unpaid, in {:.1} s",
                r.orders,
                r.payments,
                r.paid_cents,
                r.unpaid,
                r.elapsed.as_secs_f64()
            );
        }
    }
    Ok(())
}
