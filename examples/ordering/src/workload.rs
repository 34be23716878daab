//! The silence-problem workload, as data: topics, products, the history plan and the record
//! format (pure, no I/O; [`crate::produce`] writes it).
//!
//! - `event_topics` topics with event time (Kafka record timestamp = event time, CreateTime)
//!   and one topic without event time, the valid products, used as the control stream: 13
//!   topics × 3 partitions by default, as in the source.
//! - Records are keyed by product (`p00042`); every topic puts a product in the same
//!   partition (murmur2 of the key, [`partition_for`](parsley_runtime::partition_for)), so all of a product's events meet in
//!   task `p` of a co-partitioned stage.
//! - **Ground truth**: each product's events carry a per-key sequence number in the value
//!   (`h17`: history, `l18`: live), in ascending event time — strictly ascending per product.
//!   A strategy that releases a product's event after a later one of the same product has
//!   released it out of order.
//! - **History**: `history_records` events with event times spread over `history_span_ms`
//!   before the generation time, written in ascending event time (every partition is in
//!   event-time order, as a log recorded live would be). Each event goes to one of the event
//!   topics, chosen by seeded weights per (topic, partition), so partitions have different
//!   lengths.
//! - **Live**: after the history, `live_rate` events per second for `live_ms`, event time =
//!   the time of writing, and (with a hand-run ticker, `control_interval_ms > 0`) a control
//!   record per control partition every `control_interval_ms`.
//! - **A silent partition**: one (topic, partition) has no history and receives live events
//!   only `silent_ms` after live traffic starts (the events of its products go to the other
//!   topics meanwhile, so no product's order is disturbed).
//!
//! Everything is deterministic given [`WorkloadConfig::seed`], except the live event times,
//! which are wall-clock times.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// One day, ms.
pub const DAY_MS: i64 = 24 * 3_600_000;

/// Sizes and shape of the workload. Times in ms.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadConfig {
    /// Prefix of every topic name of one generated input.
    pub prefix: String,
    /// Topics with event time (the control topic comes on top).
    pub event_topics: usize,
    /// Partitions of every topic.
    pub partitions: i32,
    /// Distinct products (keys).
    pub products: u32,
    /// History events over all event topics.
    pub history_records: u64,
    /// How far back the history's event times go, ms.
    pub history_span_ms: i64,
    /// Live events per second.
    pub live_rate: u32,
    /// How long live events are written, ms.
    pub live_ms: u64,
    /// A control record is written to every control partition this often, ms: the hand-run
    /// ticker of a stage ordered by a control stream. 0: none (a stage with the built-in clock
    /// needs no ticker; the baselines' processing-time source reads none either).
    pub control_interval_ms: u64,
    /// The silent partition, if any.
    pub silent: Option<Silent>,
    /// How unequal partition lengths are: each (topic, partition) gets a weight drawn from
    /// `[1 - skew, 1 + skew]` (`0 <= skew < 1`).
    pub skew: f64,
    /// Seed of every random choice.
    pub seed: u64,
}

/// A partition that stays silent at startup: no history, and live events only after a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silent {
    /// Index of the event topic.
    pub topic: usize,
    /// Partition.
    pub partition: i32,
    /// Live events reach it this long after live traffic starts, ms.
    pub live_delay_ms: u64,
}

impl Default for WorkloadConfig {
    /// The source's shape at a size that generates in seconds on two cores: 12 event topics
    /// and the control topic, 3 partitions, 2,000 products, 240,000 history events over 7
    /// days, then 500 live events/s for 30 s; partition 0 of the first topic silent for 5 s.
    fn default() -> Self {
        WorkloadConfig {
            prefix: "ordering".to_string(),
            event_topics: 12,
            partitions: 3,
            products: 2_000,
            history_records: 240_000,
            history_span_ms: 7 * DAY_MS,
            live_rate: 500,
            live_ms: 30_000,
            control_interval_ms: 20,
            silent: Some(Silent {
                topic: 0,
                partition: 0,
                live_delay_ms: 5_000,
            }),
            skew: 0.6,
            seed: 1,
        }
    }
}

/// Whether an event belongs to the history or to live traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Written before the job starts.
    History,
    /// Written while the job runs, event time = time of writing.
    Live,
}

/// The value of an event record: its phase and its product's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventValue {
    /// History or live.
    pub phase: Phase,
    /// The product's sequence number: 0, 1, … in ascending event time.
    pub seq: u64,
}

impl EventValue {
    /// `h17` / `l17`.
    pub fn encode(&self) -> String {
        let p = match self.phase {
            Phase::History => 'h',
            Phase::Live => 'l',
        };
        format!("{p}{}", self.seq)
    }

    /// Parses [`EventValue::encode`]'s text.
    ///
    /// # Errors
    /// A message saying what does not parse.
    pub fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "value is not UTF-8".to_string())?;
        let phase = match text.as_bytes().first() {
            Some(b'h') => Phase::History,
            Some(b'l') => Phase::Live,
            _ => return Err(format!("value {text:?} is not h<seq> or l<seq>")),
        };
        let seq = text[1..]
            .parse()
            .map_err(|_| format!("value {text:?}: bad sequence number"))?;
        Ok(EventValue { phase, seq })
    }
}

/// The key of product `index`.
pub fn product_key(index: u32) -> String {
    format!("p{index:05}")
}

/// The product index of a key written by [`product_key`].
///
/// # Errors
/// A message when the key is not `p<digits>`.
pub fn parse_product(key: &[u8]) -> std::result::Result<u32, String> {
    std::str::from_utf8(key)
        .ok()
        .and_then(|k| k.strip_prefix('p'))
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| {
            format!(
                "key {:?} is not a product key",
                String::from_utf8_lossy(key)
            )
        })
}

/// One history event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Product index.
    pub product: u32,
    /// The product's sequence number.
    pub seq: u64,
    /// Index of the event topic.
    pub topic: usize,
    /// Event time, ms since the epoch.
    pub event_time_ms: i64,
}

/// The generated history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// Events in writing order: ascending event time (ties by product, then sequence).
    pub events: Vec<Event>,
    /// Per product: its history events (= the first live sequence number).
    pub per_product: Vec<u64>,
    /// Per product: the event time of its last history event, ms (`i64::MIN` if none).
    pub last_event_ms: Vec<i64>,
}

/// The workload with its derived facts: topic names, product partitions, topic weights.
#[derive(Debug, Clone)]
pub struct Workload {
    config: WorkloadConfig,
    /// Partition of each product.
    partition_of: Vec<i32>,
    /// Per event topic and partition: its weight when choosing a product's topic.
    weights: Vec<Vec<f64>>,
}

impl Workload {
    /// Checks `config` and derives the partitions of the products (`partition_for`).
    ///
    /// # Errors
    /// [`Error::Config`] naming a setting that cannot work.
    pub fn new(config: WorkloadConfig) -> Result<Self> {
        if config.event_topics == 0 {
            return Err(Error::config("event_topics", "at least one is needed"));
        }
        if config.partitions <= 0 {
            return Err(Error::config("partitions", "at least one is needed"));
        }
        if config.products == 0 {
            return Err(Error::config("products", "at least one is needed"));
        }
        if config.history_span_ms <= 0 {
            return Err(Error::config("history_span_ms", "must be positive"));
        }
        if !(0.0..1.0).contains(&config.skew) {
            return Err(Error::config("skew", "must be in [0, 1)"));
        }
        if let Some(s) = config.silent {
            if s.topic >= config.event_topics || !(0..config.partitions).contains(&s.partition) {
                return Err(Error::config(
                    "silent",
                    format!(
                        "topic {} partition {} does not exist ({} event topics, {} partitions)",
                        s.topic, s.partition, config.event_topics, config.partitions
                    ),
                ));
            }
            if config.event_topics < 2 {
                return Err(Error::config(
                    "silent",
                    "needs a second event topic to carry the silent partition's products",
                ));
            }
        }
        let partition_of = (0..config.products)
            .map(|i| parsley_runtime::partition_for(product_key(i).as_bytes(), config.partitions))
            .collect();
        let mut rng = StdRng::seed_from_u64(config.seed ^ 0x5eed_0f70_91c5);
        let weights = (0..config.event_topics)
            .map(|_| {
                (0..config.partitions)
                    .map(|_| 1.0 + config.skew * (2.0 * rng.random::<f64>() - 1.0))
                    .collect()
            })
            .collect();
        Ok(Workload {
            config,
            partition_of,
            weights,
        })
    }

    /// The settings.
    pub fn config(&self) -> &WorkloadConfig {
        &self.config
    }

    /// Name of event topic `i`: `{prefix}.events-{i:02}`.
    pub fn event_topic(&self, i: usize) -> String {
        format!("{}.events-{i:02}", self.config.prefix)
    }

    /// The event topics, in index order.
    pub fn event_topics(&self) -> Vec<String> {
        (0..self.config.event_topics)
            .map(|i| self.event_topic(i))
            .collect()
    }

    /// The control topic (valid products, no event time): `{prefix}.products`.
    pub fn control_topic(&self) -> String {
        format!("{}.products", self.config.prefix)
    }

    /// Every topic: the event topics, then the control topic.
    pub fn topics(&self) -> Vec<String> {
        let mut t = self.event_topics();
        t.push(self.control_topic());
        t
    }

    /// The partition of product `product`.
    pub fn partition_of(&self, product: u32) -> i32 {
        self.partition_of[product as usize]
    }

    /// The products whose partition is `partition`, ascending.
    pub fn products_of(&self, partition: i32) -> Vec<u32> {
        (0..self.config.products)
            .filter(|&p| self.partition_of(p) == partition)
            .collect()
    }

    /// Chooses the event topic of an event of `product`; `silent_open`: whether the silent
    /// partition takes events yet.
    pub fn choose_topic(&self, rng: &mut impl Rng, product: u32, silent_open: bool) -> usize {
        let p = self.partition_of(product);
        let weight = |t: usize| match self.config.silent {
            Some(s) if !silent_open && s.topic == t && s.partition == p => 0.0,
            _ => self.weights[t][p as usize],
        };
        let total: f64 = (0..self.config.event_topics).map(weight).sum();
        let mut x = rng.random::<f64>() * total;
        for t in 0..self.config.event_topics {
            x -= weight(t);
            if x < 0.0 {
                return t;
            }
        }
        // Rounding: the last topic with a weight.
        (0..self.config.event_topics)
            .rev()
            .find(|&t| weight(t) > 0.0)
            .unwrap_or(0)
    }

    /// The history, for a generation at `now_ms` (ms since the epoch): event times in
    /// `[now_ms - history_span_ms, now_ms)`, strictly ascending per product.
    pub fn history(&self, now_ms: i64) -> History {
        let c = &self.config;
        let mut rng = StdRng::seed_from_u64(c.seed);
        let start = now_ms - c.history_span_ms;
        let mut by_product: Vec<Vec<i64>> = vec![Vec::new(); c.products as usize];
        for _ in 0..c.history_records {
            let product = rng.random_range(0..c.products);
            by_product[product as usize].push(start + rng.random_range(0..c.history_span_ms));
        }
        let mut events = Vec::with_capacity(c.history_records as usize);
        let mut last_event_ms = vec![i64::MIN; c.products as usize];
        for (product, times) in by_product.iter_mut().enumerate() {
            times.sort_unstable();
            let mut previous = i64::MIN;
            for (seq, t) in times.iter_mut().enumerate() {
                // Strictly ascending per product: equal times would make the order ambiguous.
                *t = (*t).max(previous.saturating_add(1));
                previous = *t;
                events.push(Event {
                    product: product as u32,
                    seq: seq as u64,
                    topic: 0,
                    event_time_ms: *t,
                });
            }
            last_event_ms[product] = previous;
        }
        events.sort_unstable_by_key(|e| (e.event_time_ms, e.product, e.seq));
        for e in &mut events {
            e.topic = self.choose_topic(&mut rng, e.product, false);
        }
        History {
            per_product: by_product.iter().map(|t| t.len() as u64).collect(),
            last_event_ms,
            events,
        }
    }

    /// Records per (event topic, partition) in `history`: `[topic][partition]`.
    pub fn partition_lengths(&self, history: &History) -> Vec<Vec<u64>> {
        let mut n = vec![vec![0u64; self.config.partitions as usize]; self.config.event_topics];
        for e in &history.events {
            n[e.topic][self.partition_of(e.product) as usize] += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> Workload {
        Workload::new(WorkloadConfig {
            products: 50,
            history_records: 2_000,
            event_topics: 4,
            seed,
            ..WorkloadConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn history_is_deterministic_and_strictly_ordered_per_product() {
        let w = small(7);
        let a = w.history(1_000_000_000_000);
        assert_eq!(a, w.history(1_000_000_000_000));
        assert_ne!(a, small(8).history(1_000_000_000_000));
        assert_eq!(a.events.len(), 2_000);
        let mut last: Vec<Option<(u64, i64)>> = vec![None; 50];
        for e in &a.events {
            if let Some((seq, t)) = last[e.product as usize] {
                assert_eq!(e.seq, seq + 1);
                assert!(e.event_time_ms > t);
            } else {
                assert_eq!(e.seq, 0);
            }
            last[e.product as usize] = Some((e.seq, e.event_time_ms));
        }
        assert!(
            a.events
                .windows(2)
                .all(|p| p[0].event_time_ms <= p[1].event_time_ms)
        );
    }

    #[test]
    fn the_silent_partition_has_no_history_and_lengths_differ() {
        let w = small(3);
        let lengths = w.partition_lengths(&w.history(1_000_000_000_000));
        assert_eq!(lengths[0][0], 0);
        let mut all: Vec<u64> = lengths
            .iter()
            .flatten()
            .copied()
            .filter(|&n| n > 0)
            .collect();
        all.sort_unstable();
        assert!(all[0] < all[all.len() - 1], "{lengths:?}");
    }

    #[test]
    fn values_round_trip_and_garbage_is_refused() {
        for v in [
            EventValue {
                phase: Phase::History,
                seq: 0,
            },
            EventValue {
                phase: Phase::Live,
                seq: 123_456,
            },
        ] {
            assert_eq!(EventValue::decode(v.encode().as_bytes()), Ok(v));
        }
        for bad in [&b""[..], b"x1", b"h", b"h-1", b"l1x", &[0xff, 0xfe]] {
            assert!(EventValue::decode(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_product(b"p00042"), Ok(42));
        assert!(parse_product(b"q1").is_err());
        assert!(parse_product(&[0xff]).is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |c: WorkloadConfig| Workload::new(c).is_err();
        let d = WorkloadConfig::default;
        assert!(bad(WorkloadConfig {
            partitions: 0,
            ..d()
        }));
        assert!(bad(WorkloadConfig { skew: 1.0, ..d() }));
        assert!(bad(WorkloadConfig {
            silent: Some(Silent {
                topic: 99,
                partition: 0,
                live_delay_ms: 0
            }),
            ..d()
        }));
        assert!(!bad(d()));
    }
}
