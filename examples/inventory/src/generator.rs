//! The workload generator: a warehouse and a shop per partition slice.
//!
//! Products are spread over `partitions` slices by the key hash every Kafka client uses, so
//! slice `p` owns exactly the products of partition `p` of every topic. Each slice is one
//! process (one transactional [`CausalProducer`]): per round it writes a batch of stock
//! events, then sells from the stock it has written — the sales are stamped after the stock
//! sends were acknowledged, so each sale claims the stock before it. A configurable share of
//! rounds aborts its transaction; those records never count.
//!
//! The ground truth is each slice's committed sends in send order, with the coordinates the
//! broker acknowledged: what the oracle rebuilds happened-before from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, ClientSettings, Coordinate, partition_for,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::Event;

/// Generator settings.
#[derive(Debug, Clone)]
pub struct GenConfig {
    /// Number of products.
    pub products: usize,
    /// Rounds of stock-then-sales per slice.
    pub rounds: usize,
    /// Partitions of every topic (= slices).
    pub partitions: i32,
    /// Random seed.
    pub seed: u64,
    /// Bytes of padding in each stock event's note.
    pub note_bytes: usize,
    /// Share of a slice's rounds whose transaction aborts.
    pub abort_ratio: f64,
    /// Prefix of the generator's transactional ids.
    pub transactional_prefix: String,
    /// A pause before each transaction but the first: spreads the workload over time (the
    /// fault-injection suite wants stages busy while it injects faults). Workload shaping, not
    /// synchronisation.
    pub pace: std::time::Duration,
    /// The producers' client settings (security and the rest).
    pub clients: ClientSettings,
    /// Committed records (stock events and sales) per second: the transactions start on the
    /// schedule of a steady stream at this rate (a [`Pacer`]) instead of after `pace`.
    pub rate: Option<f64>,
    /// Stops or pauses the generator from another thread (a long run's driver): it stops
    /// before its next transaction once stopped, and rounds no longer bound it then.
    pub control: Option<Arc<GenControl>>,
}

/// Paces a stream of records at `rate` per second: a batch may start once the records sent
/// so far are due, and time spent paused on request does not count.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: f64,
    paused: Duration,
}

impl Pacer {
    /// A pacer at `rate` records per second (positive).
    pub fn new(rate: f64) -> Self {
        Pacer {
            rate: rate.max(f64::MIN_POSITIVE),
            paused: Duration::ZERO,
        }
    }

    /// How long to wait before the next batch, `elapsed` after the start with `sent` records
    /// sent: zero when the stream is behind its schedule.
    pub fn wait(&self, sent: u64, elapsed: Duration) -> Duration {
        let due = Duration::from_secs_f64(sent as f64 / self.rate) + self.paused;
        due.saturating_sub(elapsed)
    }

    /// The stream was paused for `d`: the schedule moves by as much (no burst afterwards).
    pub fn pause(&mut self, d: Duration) {
        self.paused += d;
    }
}

/// Stops and pauses a running generator from another thread.
#[derive(Debug, Default)]
pub struct GenControl {
    stop: AtomicBool,
    state: Mutex<PauseState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct PauseState {
    requested: bool,
    idle: bool,
    done: bool,
}

impl GenControl {
    /// The generator ends before its next transaction.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.resume();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PauseState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the generator to pause between two transactions and returns once it has (no
    /// transaction of its is open then), or once it has ended.
    pub fn pause(&self) {
        let mut s = self.lock();
        s.requested = true;
        while !s.idle && !s.done {
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Lets a paused generator go on.
    pub fn resume(&self) {
        self.lock().requested = false;
        self.changed.notify_all();
    }

    /// The generator's side, between transactions: waits while a pause is requested and
    /// returns how long it waited.
    fn checkpoint(&self) -> Duration {
        let mut s = self.lock();
        if !s.requested {
            return Duration::ZERO;
        }
        let since = Instant::now();
        s.idle = true;
        self.changed.notify_all();
        while s.requested {
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.idle = false;
        since.elapsed()
    }
}

/// Marks the generator ended when dropped (on every way out, errors included), so that a
/// pause request does not wait for it.
struct Ended(Option<Arc<GenControl>>);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.lock().done = true;
            c.changed.notify_all();
        }
    }
}

/// One committed send of the generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// Event id.
    pub id: u64,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset the broker assigned.
    pub offset: i64,
    /// What the event does to its product's stock level: `+qty` for a stock event, `-qty` for
    /// a sale (the fold the ledger's state must equal).
    pub delta: i64,
}

/// What the generator committed, per slice, in send order.
#[derive(Debug, Clone, Default)]
pub struct GroundTruth {
    /// Per slice: its committed sends in send order.
    pub slices: Vec<Vec<Sent>>,
    /// Committed stock events.
    pub stock_events: u64,
    /// Committed sales.
    pub sales: u64,
    /// Events written in aborted transactions.
    pub aborted_events: u64,
    /// Transactions committed.
    pub transactions: u64,
}

/// Writes the workload to `stock` and `sales` and returns the ground truth.
///
/// # Errors
/// Any producer error.
pub fn generate(
    bootstrap: &str,
    stock: &str,
    sales: &str,
    config: &GenConfig,
    bar: &ProgressBar,
) -> Result<GroundTruth> {
    let _ended = Ended(config.control.clone());
    let mut rng = StdRng::seed_from_u64(config.seed);
    let keys: Vec<String> = (0..config.products)
        .map(|i| format!("sku-{i:06}"))
        .collect();
    let mut slices: Vec<Vec<usize>> = vec![Vec::new(); config.partitions as usize];
    for (i, k) in keys.iter().enumerate() {
        slices[partition_for(k.as_bytes(), config.partitions) as usize].push(i);
    }
    let mut producers = (0..config.partitions)
        .map(|p| {
            CausalProducer::new(
                CausalProducerConfig::new(bootstrap)
                    .client_settings(config.clients.clone())
                    .transactional(format!("{}-{p}", config.transactional_prefix)),
            )
            .with_context(|| format!("creating the producer of slice {p}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut level = vec![0i64; config.products];
    let mut stocked = vec![false; config.products];
    let mut next_id = vec![0u64; config.partitions as usize];
    let mut truth = GroundTruth {
        slices: vec![Vec::new(); config.partitions as usize],
        ..GroundTruth::default()
    };
    let note: String = "n".repeat(config.note_bytes);
    bar.set_length(config.rounds.saturating_mul(slices.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("generate {bar:30} {pos}/{len} transactions {msg}")
            .expect("template"),
    );
    let started = Instant::now();
    let mut pacer = config.rate.map(Pacer::new);
    'rounds: for round in 0..config.rounds {
        for (p, products) in slices.iter().enumerate() {
            if let Some(pacer) = &pacer {
                // Workload shaping, not synchronisation: the next transaction's start.
                let wait = pacer.wait(truth.stock_events + truth.sales, started.elapsed());
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
            } else if (round, p) != (0, 0) && !config.pace.is_zero() {
                std::thread::sleep(config.pace);
            }
            if let Some(control) = &config.control {
                if control.stopped() {
                    break 'rounds;
                }
                let paused = control.checkpoint();
                if let Some(pacer) = &mut pacer {
                    pacer.pause(paused);
                }
                if control.stopped() {
                    break 'rounds;
                }
            }
            let producer = &mut producers[p];
            producer.begin()?;
            let (saved_level, saved_stocked) = (level.clone(), stocked.clone());
            let mut pending: Vec<(u64, u64, &str, i64)> = Vec::new(); // (seq, id, topic, delta)
            let new_id = |next: &mut u64| {
                *next += 1;
                ((p as u64 + 1) << 40) | *next
            };
            // The warehouse: first delivery for every product in round 0, restocks later.
            for &i in products {
                if round > 0 && !rng.random_bool(0.5) {
                    continue;
                }
                let id = new_id(&mut next_id[p]);
                let qty = rng.random_range(1..=20u32);
                let event = if stocked[i] {
                    Event::Restocked {
                        id,
                        product: keys[i].clone(),
                        qty,
                        note: note.clone(),
                    }
                } else {
                    Event::InStock {
                        id,
                        product: keys[i].clone(),
                        qty,
                        note: note.clone(),
                    }
                };
                stocked[i] = true;
                level[i] += i64::from(qty);
                let (seq, _) =
                    producer.send(stock, keys[i].as_bytes(), &serde_json::to_vec(&event)?)?;
                pending.push((seq, id, stock, i64::from(qty)));
            }
            // The shop sells only what the warehouse's acknowledged events put on the shelf: it
            // waits for the acknowledgements, so each sale claims exact stock coordinates, not
            // sends in flight (which a stage that does not read stock would have to replace by
            // the partition's end offset at the time: a true but coarser claim, under which an
            // event-time ledger parks a fact behind later stock events).
            let mut acked = producer.flush()?;
            for &i in products {
                if level[i] <= 0 || !rng.random_bool(0.6) {
                    continue;
                }
                let id = new_id(&mut next_id[p]);
                let qty = rng.random_range(1..=level[i].min(5) as u32);
                level[i] -= i64::from(qty);
                let event = Event::Sold {
                    id,
                    product: keys[i].clone(),
                    qty,
                };
                let (seq, _) =
                    producer.send(sales, keys[i].as_bytes(), &serde_json::to_vec(&event)?)?;
                pending.push((seq, id, sales, -i64::from(qty)));
            }
            if rng.random_bool(config.abort_ratio) {
                producer.flush()?; // the records reach the log, then the transaction aborts
                producer.abort()?;
                truth.aborted_events += pending.len() as u64;
                level = saved_level;
                stocked = saved_stocked;
            } else {
                acked.extend(producer.commit()?);
                let acked: HashMap<u64, Coordinate> =
                    acked.into_iter().map(|a| (a.seq, a.coordinate)).collect();
                truth.transactions += 1;
                pending.sort_by_key(|(seq, _, _, _)| *seq);
                for (seq, id, topic, delta) in pending {
                    let c = acked
                        .get(&seq)
                        .with_context(|| format!("no acknowledgement for send {seq}"))?;
                    if topic == stock {
                        truth.stock_events += 1;
                    } else {
                        truth.sales += 1;
                    }
                    truth.slices[p].push(Sent {
                        id,
                        topic: topic.to_string(),
                        partition: c.channel.partition,
                        offset: c.offset,
                        delta,
                    });
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_with_message(format!(
        "{} stock, {} sales committed; {} events aborted",
        truth.stock_events, truth.sales, truth.aborted_events
    ));
    Ok(truth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_a_batch_until_its_records_are_due() {
        let mut pacer = Pacer::new(100.0);
        // 50 records at 100/s are due at 0.5 s.
        assert_eq!(
            pacer.wait(50, Duration::from_millis(200)),
            Duration::from_millis(300)
        );
        // Behind schedule: no wait.
        assert_eq!(pacer.wait(50, Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(pacer.wait(0, Duration::ZERO), Duration::ZERO);
        // A pause of 2 s moves the schedule: no burst to catch up.
        pacer.pause(Duration::from_secs(2));
        assert_eq!(
            pacer.wait(50, Duration::from_millis(2_400)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn a_pause_waits_for_the_generator_between_transactions() {
        let control = Arc::new(GenControl::default());
        let worker = {
            let control = Arc::clone(&control);
            std::thread::spawn(move || {
                // Transactions until stopped, each checkpointing first.
                let mut transactions = 0u32;
                let mut paused = Duration::ZERO;
                while !control.stopped() {
                    paused += control.checkpoint();
                    transactions += 1;
                    std::thread::yield_now();
                }
                (transactions, paused)
            })
        };
        control.pause(); // returns only once the generator is idle
        assert!(control.lock().idle);
        control.resume();
        control.stop();
        let (transactions, _) = worker.join().unwrap();
        assert!(transactions >= 1);
        // An ended generator does not hold a pause up.
        drop(Ended(Some(Arc::clone(&control))));
        control.pause();
        control.resume();
    }
}
