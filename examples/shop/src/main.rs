//! `shop`: the shop pipeline's command line.
//!
//! - `produce-orders`: writes generated orders to a topic (created if absent);
//! - `payments`: the payments service: pays the orders (but every K-th), each payment stamped
//!   with a claim on its order;
//! - `run`: revenue per customer in Parsley, until Ctrl-C or, with `--until-caught-up`, until
//!   it has consumed and committed everything its inputs held; with `--hourly`, revenue per
//!   customer and hour (one-hour windows of event time, every update emitted).
//!
//! `cargo xtask compare` runs them, and the same pipeline in Kafka Streams, on the same input.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use parsley::prelude::*;
use parsley::{Admin, TopicSpec};
use shop::orders::produce_orders;
use shop::payments::{self, PaymentsConfig};

/// A shop on Kafka: order generator, payments service and the Parsley pipeline.
#[derive(Parser, Debug)]
#[command(name = "shop")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write N orders (keys: order ids `o-000001`…, values: JSON, timestamps: now) to a topic
    /// (created if absent); returns once every order is acknowledged.
    ProduceOrders {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The orders topic.
        #[arg(long, default_value = "orders")]
        topic: String,
        /// The topic's partitions, when it is created (an existing topic is used as it is).
        #[arg(long, default_value_t = 4)]
        partitions: i32,
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
        /// The payments topic (written; created with the orders' partition count if absent,
        /// so that the two are co-partitioned).
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
    /// Run revenue per customer in Parsley: each payment joined with its order (causally: a
    /// payment is joined after the order its stamp claims), re-keyed by the order's customer
    /// and summed; every new total to the output topic (UTF-8 key, JSON number of cents).
    /// Runs until Ctrl-C (SIGINT or SIGTERM), or with --until-caught-up until every input and
    /// repartitioned record is consumed and committed. Topics the pipeline creates itself:
    /// `{application-id}-revenue-repartition`.
    Run {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The application id: the prefix of the consumer groups, transactional ids and
        /// internal topics.
        #[arg(long, default_value = "shop")]
        application_id: String,
        /// The orders topic (read as a table keyed by order id).
        #[arg(long, default_value = "orders")]
        orders: String,
        /// The payments topic (keyed by order id; co-partitioned with the orders).
        #[arg(long, default_value = "payments")]
        payments: String,
        /// The topic of revenue per customer (created with the orders' partition count if
        /// absent).
        #[arg(long, default_value = "revenue")]
        output: String,
        /// Stop cleanly and exit 0 once every stage has committed everything its sources hold.
        #[arg(long)]
        until_caught_up: bool,
        /// With --until-caught-up: fail if that takes longer than this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Print the compiled topology before starting.
        #[arg(long)]
        describe: bool,
        /// Revenue per customer and hour instead (`shop::pipeline::hourly_revenue`): one-hour
        /// windows of the payments' event time, every update of a window's sum emitted, keyed
        /// by `{"key":customer,"start":ms,"end":ms}`. Topics it creates itself:
        /// `{application-id}-hourly-revenue-repartition` and `{application-id}-hourly-revenue-clock`.
        /// Live payments are taken 2 s after their event time (the built-in clock's lag), so
        /// --until-caught-up may stop with the last ones still parked (their offsets commit
        /// with the queue; a restart takes them).
        #[arg(long)]
        hourly: bool,
    },
}

fn main() -> ExitCode {
    // Parsley logs through `tracing`: without a subscriber nothing is printed.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
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
            partitions,
            orders,
            customers,
            seed,
        } => {
            admin(&bootstrap)?
                .create_topic_if_absent(&TopicSpec::new(&topic, partitions))
                .with_context(|| format!("creating {topic}"))?;
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
            create_like(&bootstrap, &payments_topic, &orders_topic)?;
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
        Cmd::Run {
            bootstrap,
            application_id,
            orders,
            payments,
            output,
            until_caught_up,
            timeout_secs,
            describe,
            hourly,
        } => {
            create_like(&bootstrap, &output, &orders)?;
            let build = if hourly {
                shop::pipeline::hourly_revenue
            } else {
                shop::pipeline::topology
            };
            let topology = build(&application_id, &orders, &payments, &output)
                .context("building the topology")?;
            if describe {
                println!("{}", topology.describe());
            }
            let runtime = Runtime::new(topology, RuntimeConfig::new(&bootstrap));
            let started = Instant::now();
            println!(
                "shop: running {application_id}: {orders} and {payments} -> {output} on {bootstrap}"
            );
            let stages = if until_caught_up {
                let running = runtime.start()?;
                if let Err(e) = running.wait_until_caught_up(Duration::from_secs(timeout_secs)) {
                    let _ = running.stop();
                    return Err(e).context("waiting for the shop pipeline to catch up");
                }
                running.stop()?
            } else {
                runtime.run_until_signal()?
            };
            let per_stage: Vec<String> = stages
                .iter()
                .map(|(stage, m)| format!("{stage} {}", m.committed_deliveries))
                .collect();
            println!(
                "shop: {} after {:.1} s; records committed per stage: {}",
                if until_caught_up {
                    "caught up"
                } else {
                    "stopped"
                },
                started.elapsed().as_secs_f64(),
                per_stage.join(", ")
            );
        }
    }
    Ok(())
}

/// An admin client of the cluster at `bootstrap`.
fn admin(bootstrap: &str) -> Result<Admin> {
    Admin::new(bootstrap, Duration::from_secs(30))
        .with_context(|| format!("connecting to {bootstrap}"))
}

/// Creates `topic`, unless it exists, with as many partitions as `like` has.
fn create_like(bootstrap: &str, topic: &str, like: &str) -> Result<()> {
    let admin = admin(bootstrap)?;
    let partitions = admin.describe_topics(&[like])?[0].partitions;
    admin
        .create_topic_if_absent(&TopicSpec::new(topic, partitions))
        .with_context(|| format!("creating {topic}"))?;
    Ok(())
}
