//! The payments service: reads the orders and pays them, each payment stamped so that it
//! claims its order.
//!
//! It consumes the orders topic as a member of its group (`read_committed`, from the beginning
//! for a new group) until it has reached, on every partition, the end offset it read at start
//! (the last stable offset: what a `read_committed` consumer can reach). For each order but
//! every K-th ([`unpaid`]) it sends a [`Payment`] of the order's amount, keyed by the order id,
//! through a [`CausalProducer`] after [`CausalProducer::observe_message`] on the order: the
//! payment's stamp claims the order's coordinate. It then waits until every payment
//! is acknowledged and commits its consumer offsets.
//!
//! The producer is idempotent, not transactional: it flushes before a send to another
//! partition while earlier sends are not acknowledged. The orders of one poll batch are
//! therefore handled partition by partition (each payment still claims its own order, and
//! every order observed before it).
//!
//! A payment's record timestamp is now, or with a clock skew of X ms the order's timestamp
//! minus X: a payments service whose clock runs behind the shop's. Event-time joins then see
//! the payment before its order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley::runtime::rdkafka::ClientConfig;
use parsley::runtime::rdkafka::Message;
use parsley::runtime::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use parsley::runtime::rdkafka::message::OwnedMessage;
use parsley::runtime::{Admin, CausalProducer, CausalProducerConfig, OutgoingRecord};

use crate::model::{Order, Payment, order_number, unpaid};

/// How long the service may take to reach the end offsets: a safety net, not a decision.
const DEADLINE: Duration = Duration::from_secs(600);
/// The most orders handled per poll batch.
const BATCH: usize = 1_000;

/// What the payments service is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentsConfig {
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// The orders topic (read).
    pub orders_topic: String,
    /// The payments topic (written; it must exist).
    pub payments_topic: String,
    /// The service's consumer group.
    pub group: String,
    /// Every K-th order (by order number) stays unpaid; `None`: every order is paid.
    pub skip_every: Option<u64>,
    /// A payment's record timestamp is its order's minus this many ms; 0: now.
    pub clock_skew_ms: i64,
}

/// What the payments service did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentsReport {
    /// Orders read.
    pub orders: u64,
    /// Payments acknowledged.
    pub payments: u64,
    /// Orders left unpaid.
    pub unpaid: u64,
    /// The amounts paid, added up, in cents.
    pub paid_cents: i64,
    /// From joining the group to the last acknowledgement.
    pub elapsed: Duration,
}

/// Runs the payments service to the end offsets of the orders topic read at its start.
///
/// # Errors
/// A client error, an order that does not decode or has no key, a skew that would make a
/// timestamp non-positive, a send the broker did not acknowledge, or the deadline (10 minutes)
/// passed.
pub fn run(config: &PaymentsConfig) -> Result<PaymentsReport> {
    let started = Instant::now();
    let admin = Admin::new(&config.bootstrap, Duration::from_secs(30))?;
    let topic = admin
        .describe_topics(&[config.orders_topic.as_str()])?
        .remove(0);
    let partitions: Vec<(&str, i32)> = (0..topic.partitions)
        .map(|p| (config.orders_topic.as_str(), p))
        .collect();
    let ends = admin
        .last_stable_offsets(&partitions)
        .context("reading the orders' end offsets")?;
    let mut waiting: HashMap<i32, i64> = (0..topic.partitions)
        .zip(ends)
        .filter(|(_, end)| *end > 0)
        .collect();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap)
        .set("group.id", &config.group)
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .context("creating the orders consumer")?;
    consumer
        .subscribe(&[config.orders_topic.as_str()])
        .context("subscribing to the orders")?;
    let mut producer = CausalProducer::new(CausalProducerConfig::new(&config.bootstrap))?;
    let mut report = PaymentsReport {
        orders: 0,
        payments: 0,
        unpaid: 0,
        paid_cents: 0,
        elapsed: Duration::ZERO,
    };
    while !waiting.is_empty() {
        if started.elapsed() > DEADLINE {
            bail!(
                "the orders' end offsets not reached within {DEADLINE:?}: partitions {:?} left",
                waiting.keys().collect::<Vec<_>>()
            );
        }
        let mut batch = Vec::new();
        let mut wait = Duration::from_millis(200);
        while batch.len() < BATCH {
            match consumer.poll(wait) {
                Some(m) => batch.push(m.context("reading the orders")?.detach()),
                None => break,
            }
            wait = Duration::ZERO;
        }
        // One partition after the other: fewer flushes at channel switches.
        batch.sort_by_key(|m| m.partition());
        for order in &batch {
            pay(config, &mut producer, order, &mut report)?;
            if waiting
                .get(&order.partition())
                .is_some_and(|end| order.offset() + 1 >= *end)
            {
                waiting.remove(&order.partition());
            }
        }
        // A partition whose end is a transaction marker: the position passes it.
        if !waiting.is_empty() {
            let positions = consumer.position().context("the consumer's positions")?;
            waiting.retain(|p, end| {
                positions
                    .find_partition(&config.orders_topic, *p)
                    .and_then(|e| e.offset().to_raw())
                    .is_none_or(|at| at < *end)
            });
        }
    }
    let acked = producer
        .flush()
        .context("waiting for the payments' acknowledgements")?;
    report.payments = acked.len() as u64;
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .context("committing the orders consumer's offsets")?;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Observes one order and sends its payment, unless it stays unpaid.
fn pay(
    config: &PaymentsConfig,
    producer: &mut CausalProducer,
    message: &OwnedMessage,
    report: &mut PaymentsReport,
) -> Result<()> {
    let at = || {
        format!(
            "order at {}/{}@{}",
            message.topic(),
            message.partition(),
            message.offset()
        )
    };
    producer
        .observe_message(message)
        .with_context(|| format!("observing the {}", at()))?;
    report.orders += 1;
    let key = message
        .key()
        .with_context(|| format!("the {} has no key", at()))?;
    let id = std::str::from_utf8(key).with_context(|| format!("the {}'s key", at()))?;
    let order: Order = serde_json::from_slice(message.payload().unwrap_or_default())
        .with_context(|| format!("decoding the {}", at()))?;
    if order_number(id).is_some_and(|n| unpaid(n, config.skip_every)) {
        report.unpaid += 1;
        return Ok(());
    }
    let payment = Payment {
        order: id.to_string(),
        amount_cents: order.amount_cents,
    };
    let value = serde_json::to_vec(&payment).context("encoding a payment")?;
    let mut record = OutgoingRecord::new(&config.payments_topic, key, &value);
    if config.clock_skew_ms != 0 {
        let ordered = message
            .timestamp()
            .to_millis()
            .with_context(|| format!("the {} has no timestamp", at()))?;
        let ts = ordered - config.clock_skew_ms;
        if ts <= 0 {
            bail!(
                "a clock skew of {} ms gives the payment of the {} a timestamp of {ts}",
                config.clock_skew_ms,
                at()
            );
        }
        record = record.timestamp(ts);
    }
    producer
        .send_record(record)
        .with_context(|| format!("sending the payment of {id}"))?;
    report.paid_cents += order.amount_cents;
    Ok(())
}
