//! Command-line flags shared by the `generate` and `experiment` binaries.

use clap::Args;

use crate::workload::{DAY_MS, Silent, WorkloadConfig};

/// The workload's sizes (defaults: [`WorkloadConfig::default`]).
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Topics, the control topic (valid products, no event time) included.
    #[arg(long, default_value_t = 13)]
    pub topics: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Distinct products (keys).
    #[arg(long, default_value_t = 2_000)]
    pub products: u32,
    /// History events over all event topics.
    #[arg(long, default_value_t = 240_000)]
    pub history_records: u64,
    /// How many days back the history's event times go.
    #[arg(long, default_value_t = 7.0)]
    pub history_days: f64,
    /// Live events per second.
    #[arg(long, default_value_t = 500)]
    pub live_rate: u32,
    /// Seconds of live events.
    #[arg(long, default_value_t = 30.0)]
    pub live_secs: f64,
    /// A control record per control partition every this many ms: the hand-run ticker of a
    /// stage ordered by a control stream (`experiment` writes none unless `--ticker`; 0: none).
    #[arg(long, default_value_t = 20)]
    pub control_interval_ms: u64,
    /// Partition 0 of the first event topic has no history and gets live events only this
    /// many ms after live traffic starts (0: no silent partition).
    #[arg(long, default_value_t = 5_000)]
    pub silent_ms: u64,
    /// Partition length skew: weights per (topic, partition) in [1 - skew, 1 + skew].
    #[arg(long, default_value_t = 0.6)]
    pub skew: f64,
}

impl WorkloadArgs {
    /// The workload of `seed` with topic prefix `prefix`.
    pub fn config(&self, prefix: &str, seed: u64) -> WorkloadConfig {
        WorkloadConfig {
            prefix: prefix.to_string(),
            event_topics: self.topics.saturating_sub(1),
            partitions: self.partitions,
            products: self.products,
            history_records: self.history_records,
            history_span_ms: (self.history_days * DAY_MS as f64) as i64,
            live_rate: self.live_rate,
            live_ms: (self.live_secs * 1000.0) as u64,
            control_interval_ms: self.control_interval_ms,
            silent: (self.silent_ms > 0).then_some(Silent {
                topic: 0,
                partition: 0,
                live_delay_ms: self.silent_ms,
            }),
            skew: self.skew,
            seed,
        }
    }
}

/// The bootstrap servers: `--bootstrap`, else `$PARSLEY_BOOTSTRAP`.
pub fn bootstrap(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("PARSLEY_BOOTSTRAP").ok())
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
}
