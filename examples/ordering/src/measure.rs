//! What a run measures, from the releases a strategy reports (pure).
//!
//! - **out of order**: a release of product `k` with a lower sequence number than one already
//!   released for `k`, over all released events (a duplicate release is counted apart);
//! - **hold**: release instant minus the instant the record reached the job (fetched by a
//!   baseline's consumer; delivered by the gate into the timer queue for offset
//!   completeness), split into *catch-up* (records that arrived before the last history
//!   record was released: the history and the live records written meanwhile) and *steady
//!   live* (live records that arrived after it);
//! - **history drain**: from the run's start until every history record is released;
//! - **first live output**: from the run's start until the first live record is released.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::workload::Phase;

/// One event released by a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// Product index.
    pub product: u32,
    /// The product's sequence number.
    pub seq: u64,
    /// History or live.
    pub phase: Phase,
    /// Event time, ms since the epoch.
    pub event_time_ms: i64,
    /// When the record reached the job.
    pub arrived: Instant,
    /// When the strategy released it.
    pub released: Instant,
}

/// Average and 99th percentile of a set of holds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Hold {
    /// Records in the set.
    pub records: u64,
    /// Average hold, ms.
    pub avg_ms: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99_ms: f64,
}

impl Hold {
    fn of(mut holds_us: Vec<u64>) -> Self {
        if holds_us.is_empty() {
            return Hold::default();
        }
        holds_us.sort_unstable();
        let n = holds_us.len();
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        Hold {
            records: n as u64,
            avg_ms: holds_us.iter().sum::<u64>() as f64 / n as f64 / 1000.0,
            p99_ms: holds_us[rank - 1] as f64 / 1000.0,
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    /// Distinct events released.
    pub records: u64,
    /// Releases of an event already released.
    pub duplicates: u64,
    /// Releases below the highest sequence already released for their product.
    pub out_of_order: u64,
    /// Of those, history records.
    pub out_of_order_history: u64,
    /// History events never released before the run stopped.
    pub unreleased_history: u64,
    /// Live events written but not released when the run stopped.
    pub unreleased_live: u64,
    /// Holds of records that arrived during catch-up.
    pub catch_up: Hold,
    /// Holds of live records that arrived after the history was drained.
    pub live: Hold,
    /// From the start until the last history record was released; `None`: not all were.
    pub history_drain: Option<Duration>,
    /// From the start until the first live record was released; `None`: none was.
    pub first_live: Option<Duration>,
}

impl Summary {
    /// Out-of-order releases as a percentage of distinct released events.
    pub fn out_of_order_pct(&self) -> f64 {
        if self.records == 0 {
            return 0.0;
        }
        100.0 * self.out_of_order as f64 / self.records as f64
    }

    /// Summarises `releases` (in release order per product) of a run that started at `start`
    /// with `history` history events and `live` live events written.
    pub fn of(releases: &[Release], start: Instant, history: u64, live: u64) -> Self {
        let mut seen: HashSet<(u32, u64)> = HashSet::with_capacity(releases.len());
        let mut highest: std::collections::HashMap<u32, u64> = Default::default();
        let mut s = Summary::default();
        let mut history_released = 0u64;
        let mut live_released = 0u64;
        let mut last_history: Option<Instant> = None;
        for r in releases {
            if !seen.insert((r.product, r.seq)) {
                s.duplicates += 1;
                continue;
            }
            s.records += 1;
            match highest.get(&r.product) {
                Some(&h) if r.seq < h => {
                    s.out_of_order += 1;
                    if r.phase == Phase::History {
                        s.out_of_order_history += 1;
                    }
                }
                _ => {
                    highest.insert(r.product, r.seq);
                }
            }
            match r.phase {
                Phase::History => {
                    history_released += 1;
                    last_history = last_history.max(Some(r.released));
                }
                Phase::Live => {
                    live_released += 1;
                    let since = r.released.saturating_duration_since(start);
                    s.first_live = Some(s.first_live.map_or(since, |f| f.min(since)));
                }
            }
        }
        s.unreleased_history = history.saturating_sub(history_released);
        s.unreleased_live = live.saturating_sub(live_released);
        let drained_at = last_history.filter(|_| s.unreleased_history == 0);
        s.history_drain = drained_at.map(|t| t.saturating_duration_since(start));
        let mut catch_up = Vec::new();
        let mut steady = Vec::new();
        let mut counted: HashSet<(u32, u64)> = HashSet::with_capacity(releases.len());
        for r in releases {
            if !counted.insert((r.product, r.seq)) {
                continue;
            }
            let hold = r.released.saturating_duration_since(r.arrived).as_micros() as u64;
            match drained_at {
                Some(d) if r.phase == Phase::Live && r.arrived >= d => steady.push(hold),
                _ => catch_up.push(hold),
            }
        }
        s.catch_up = Hold::of(catch_up);
        s.live = Hold::of(steady);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    fn r(
        start: Instant,
        product: u32,
        seq: u64,
        phase: Phase,
        arrived: u64,
        released: u64,
    ) -> Release {
        Release {
            product,
            seq,
            phase,
            event_time_ms: 0,
            arrived: at(start, arrived),
            released: at(start, released),
        }
    }

    #[test]
    fn out_of_order_duplicates_and_phases() {
        let s0 = Instant::now();
        let releases = [
            r(s0, 1, 0, Phase::History, 0, 10),
            r(s0, 1, 2, Phase::History, 1, 20),
            r(s0, 1, 1, Phase::History, 2, 30), // below 2: out of order
            r(s0, 2, 0, Phase::History, 3, 40),
            r(s0, 2, 0, Phase::History, 3, 41), // duplicate
            r(s0, 2, 1, Phase::Live, 45, 50),   // arrived after the drain at 40
            r(s0, 1, 3, Phase::Live, 20, 60),   // arrived during catch-up
        ];
        let s = Summary::of(&releases, s0, 4, 3);
        assert_eq!(s.records, 6);
        assert_eq!(s.duplicates, 1);
        assert_eq!(s.out_of_order, 1);
        assert_eq!(s.out_of_order_history, 1);
        assert_eq!(s.unreleased_history, 0);
        assert_eq!(s.unreleased_live, 1);
        assert_eq!(s.history_drain, Some(Duration::from_millis(40)));
        assert_eq!(s.first_live, Some(Duration::from_millis(50)));
        assert_eq!(s.live.records, 1);
        assert_eq!(s.live.avg_ms, 5.0);
        assert_eq!(s.catch_up.records, 5);
        assert_eq!(s.catch_up.p99_ms, 40.0);
        assert!((s.out_of_order_pct() - 100.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn an_undrained_history_has_no_drain_time_and_no_steady_phase() {
        let s0 = Instant::now();
        let s = Summary::of(&[r(s0, 1, 0, Phase::Live, 0, 5)], s0, 1, 1);
        assert_eq!(s.history_drain, None);
        assert_eq!(s.unreleased_history, 1);
        assert_eq!(s.live.records, 0);
        assert_eq!(s.catch_up.records, 1);
    }
}
