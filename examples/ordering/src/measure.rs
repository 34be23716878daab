//! What a run measures, from the releases a strategy reports (pure).
//!
//! - **out of order**: a release of product `k` with a lower sequence number than one already
//!   released for `k`, over all released events (a duplicate release is counted apart);
//! - **catch-up hold**: release instant minus the instant the record reached the job (fetched
//!   by a baseline's consumer; delivered by the gate into the timer queue for offset
//!   completeness), for the records that are not *steady live*;
//! - **steady live hold**: for the live records produced after the last history record was
//!   released, release wall-clock time minus the time the record was produced (its event
//!   time: live events are stamped with the wall clock when they are written), so it includes
//!   the record's way to the job; the same records' hold from the job's receipt is kept apart
//!   ([`Summary::live_queue`]);
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

/// A wall-clock reading and the [`Instant`] it was taken at: converts instants to wall-clock
/// time (live event times are wall-clock times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The instant.
    pub instant: Instant,
    /// The wall clock at it, µs since the epoch.
    pub wall_us: i64,
}

impl Anchor {
    /// The wall clock now.
    pub fn now() -> Self {
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        Anchor {
            instant: Instant::now(),
            wall_us,
        }
    }

    /// Wall-clock time at `t`, µs since the epoch.
    pub fn wall_us(&self, t: Instant) -> i64 {
        match t.checked_duration_since(self.instant) {
            Some(d) => self.wall_us + d.as_micros() as i64,
            None => self.wall_us - self.instant.duration_since(t).as_micros() as i64,
        }
    }

    /// The instant of wall-clock time `wall_ms` (ms since the epoch), if it is not earlier than
    /// the anchor's; `None` for earlier times.
    pub fn instant_of_ms(&self, wall_ms: i64) -> Option<Instant> {
        let us = wall_ms.checked_mul(1000)? - self.wall_us;
        (us >= 0).then(|| self.instant + std::time::Duration::from_micros(us as u64))
    }
}

/// Average, median and 99th percentile of a set of holds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Hold {
    /// Records in the set.
    pub records: u64,
    /// Average hold, ms.
    pub avg_ms: f64,
    /// Median (nearest rank), ms.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99_ms: f64,
}

impl Hold {
    /// The figures of `holds_us` (µs; a negative one, from clock granularity, counts as 0).
    pub fn of(holds_us: Vec<i64>) -> Self {
        Hold::signed(holds_us.into_iter().map(|h| h.max(0)).collect())
    }

    /// The figures of `spans_us` (µs), negative ones as they are: a difference of two
    /// observations that may come in either order.
    pub fn signed(mut spans_us: Vec<i64>) -> Self {
        if spans_us.is_empty() {
            return Hold::default();
        }
        spans_us.sort_unstable();
        let n = spans_us.len();
        let rank = |q: f64| ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        Hold {
            records: n as u64,
            avg_ms: spans_us.iter().sum::<i64>() as f64 / n as f64 / 1000.0,
            p50_ms: spans_us[rank(0.5)] as f64 / 1000.0,
            p99_ms: spans_us[rank(0.99)] as f64 / 1000.0,
        }
    }
}

/// A tick of the built-in clock as a `read_committed` consumer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickSeen {
    /// Its partition of the clock topic: the task's.
    pub partition: i32,
    /// Its timestamp: the wall clock when the task wrote it, ms since the epoch.
    pub timestamp_ms: i64,
    /// When the consumer read it: its transaction had committed by then.
    pub visible: Instant,
}

/// Where the steady live hold goes with the built-in clock. A live record produced at `e`
/// (its event time) leaves once its task has read a tick with timestamp `>= e + lag` (and
/// every input is at its live head); the first such tick of its partition splits the hold in
/// two parts that add up to it:
///
/// - **to the tick**: the tick's timestamp minus `e`: the lag plus the wait for the next tick
///   (expected: the lag plus half a tick interval);
/// - **tick to release**: from the tick's timestamp to the handler call: the rest of the
///   transaction the tick was written in, the commit, the stage's fetch of the tick and the
///   release.
///
/// A `read_committed` consumer of the clock topic shows the commits: the ticks a transaction
/// carries become visible together, so ticks it read within [`SAME_COMMIT`] of each other are
/// one commit's. Between two such commits lies the **commit cycle**; from the last tick
/// written into a commit until that consumer read it, the **commit latency** (the commit's
/// round trips and the consumer's fetch). A tick waits on average about half a cycle plus one
/// latency.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClockBreakdown {
    /// Ticks written after the history drained: timestamp to visible.
    pub ticks: Hold,
    /// Between the commits that made those ticks visible.
    pub commit_cycle: Hold,
    /// From the last tick of such a commit to its visibility.
    pub commit_latency: Hold,
    /// Steady live records: to the releasing tick.
    pub to_tick: Hold,
    /// Steady live records: from their releasing tick's timestamp to their release.
    pub tick_to_release: Hold,
    /// Steady live records with no tick at or after their event time plus the lag.
    pub unmatched: u64,
}

/// Ticks read this close together were made visible by one commit.
pub const SAME_COMMIT: std::time::Duration = std::time::Duration::from_millis(5);

impl ClockBreakdown {
    /// The breakdown of the steady live records among `releases` (live, produced at or after
    /// `drained_at`, first release of each) with `ticks`; `partition_of` gives a product's
    /// partition, `anchor` converts instants to wall-clock time.
    pub fn of(
        releases: &[Release],
        ticks: &[TickSeen],
        anchor: Anchor,
        drained_at: Instant,
        lag_ms: i64,
        partition_of: impl Fn(u32) -> i32,
    ) -> Self {
        let drained_us = anchor.wall_us(drained_at);
        let mut by_partition: std::collections::HashMap<i32, Vec<(i64, i64)>> = Default::default();
        let mut steady = Vec::with_capacity(ticks.len());
        for t in ticks {
            let visible_us = anchor.wall_us(t.visible);
            by_partition
                .entry(t.partition)
                .or_default()
                .push((t.timestamp_ms, visible_us));
            if t.timestamp_ms * 1000 >= drained_us {
                steady.push((visible_us, t.timestamp_ms * 1000));
            }
        }
        for v in by_partition.values_mut() {
            v.sort_unstable();
        }
        steady.sort_unstable();
        // Commits: (visible, the latest tick timestamp it carried), µs.
        let mut commits: Vec<(i64, i64)> = Vec::new();
        let same = SAME_COMMIT.as_micros() as i64;
        let mut last_visible = i64::MIN;
        for &(visible, ts) in &steady {
            match commits.last_mut() {
                Some(c) if visible - last_visible <= same => c.1 = c.1.max(ts),
                _ => commits.push((visible, ts)),
            }
            last_visible = visible;
        }
        let mut b = ClockBreakdown {
            ticks: Hold::signed(steady.iter().map(|(v, ts)| v - ts).collect()),
            commit_cycle: Hold::signed(commits.windows(2).map(|w| w[1].0 - w[0].0).collect()),
            commit_latency: Hold::signed(commits.iter().map(|(v, ts)| v - ts).collect()),
            ..ClockBreakdown::default()
        };
        let (mut to_tick, mut to_release) = (Vec::new(), Vec::new());
        let mut counted: HashSet<(u32, u64)> = HashSet::new();
        for r in releases {
            if r.phase != Phase::Live
                || r.event_time_ms * 1000 < drained_us
                || !counted.insert((r.product, r.seq))
            {
                continue;
            }
            let due = r.event_time_ms + lag_ms;
            let tick = by_partition.get(&partition_of(r.product)).and_then(|v| {
                let i = v.partition_point(|(ts, _)| *ts < due);
                v.get(i).copied()
            });
            let Some((ts, _)) = tick else {
                b.unmatched += 1;
                continue;
            };
            to_tick.push((ts - r.event_time_ms) * 1000);
            to_release.push(anchor.wall_us(r.released) - ts * 1000);
        }
        b.to_tick = Hold::signed(to_tick);
        b.tick_to_release = Hold::signed(to_release);
        b
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
    /// Holds of the records that are not steady live, from their arrival at the job.
    pub catch_up: Hold,
    /// Steady live: holds of the live records produced after the history was drained, from
    /// the moment they were produced.
    pub live: Hold,
    /// The same records' holds from their arrival at the job.
    pub live_queue: Hold,
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

    /// Summarises `releases` (in release order per product) of a run that started at
    /// `start.instant` with `history` history events and `live` live events written.
    pub fn of(releases: &[Release], start: Anchor, history: u64, live: u64) -> Self {
        let anchor = start;
        let start = anchor.instant;
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
        let mut steady_queue = Vec::new();
        let mut counted: HashSet<(u32, u64)> = HashSet::with_capacity(releases.len());
        let drained_us = drained_at.map(|d| anchor.wall_us(d));
        for r in releases {
            if !counted.insert((r.product, r.seq)) {
                continue;
            }
            let hold = r.released.saturating_duration_since(r.arrived).as_micros() as i64;
            match drained_us {
                Some(d) if r.phase == Phase::Live && r.event_time_ms * 1000 >= d => {
                    steady.push(anchor.wall_us(r.released) - r.event_time_ms * 1000);
                    steady_queue.push(hold);
                }
                _ => catch_up.push(hold),
            }
        }
        s.catch_up = Hold::of(catch_up);
        s.live = Hold::of(steady);
        s.live_queue = Hold::of(steady_queue);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// The wall clock at `start`: 1,000,000 ms since the epoch.
    const START_MS: i64 = 1_000_000;

    fn anchor(start: Instant) -> Anchor {
        Anchor {
            instant: start,
            wall_us: START_MS * 1000,
        }
    }

    fn r(
        start: Instant,
        product: u32,
        seq: u64,
        phase: Phase,
        arrived: u64,
        released: u64,
    ) -> Release {
        // Produced 2 ms before it reached the job.
        Release {
            product,
            seq,
            phase,
            event_time_ms: START_MS + arrived as i64 - 2,
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
            r(s0, 2, 1, Phase::Live, 45, 50),   // produced after the drain at 40
            r(s0, 1, 3, Phase::Live, 20, 60),   // produced during catch-up
        ];
        let s = Summary::of(&releases, anchor(s0), 4, 3);
        assert_eq!(s.records, 6);
        assert_eq!(s.duplicates, 1);
        assert_eq!(s.out_of_order, 1);
        assert_eq!(s.out_of_order_history, 1);
        assert_eq!(s.unreleased_history, 0);
        assert_eq!(s.unreleased_live, 1);
        assert_eq!(s.history_drain, Some(Duration::from_millis(40)));
        assert_eq!(s.first_live, Some(Duration::from_millis(50)));
        assert_eq!(s.live.records, 1);
        // From production: 2 ms on the way, 5 ms held.
        assert_eq!(s.live.avg_ms, 7.0);
        assert_eq!(s.live.p50_ms, 7.0);
        assert_eq!(s.live_queue.avg_ms, 5.0);
        assert_eq!(s.catch_up.records, 5);
        assert_eq!(s.catch_up.p99_ms, 40.0);
        assert!((s.out_of_order_pct() - 100.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn an_undrained_history_has_no_drain_time_and_no_steady_phase() {
        let s0 = Instant::now();
        let s = Summary::of(&[r(s0, 1, 0, Phase::Live, 0, 5)], anchor(s0), 1, 1);
        assert_eq!(s.history_drain, None);
        assert_eq!(s.unreleased_history, 1);
        assert_eq!(s.live.records, 0);
        assert_eq!(s.catch_up.records, 1);
    }

    #[test]
    fn a_live_hold_splits_at_its_releasing_tick() {
        let s0 = Instant::now();
        let a = anchor(s0);
        // Drained at 10 ms; ticks of partition 0 at 20, 40, 60 ms, each visible 50 ms later.
        let ticks: Vec<TickSeen> = [20, 40, 60]
            .into_iter()
            .map(|ms| TickSeen {
                partition: 0,
                timestamp_ms: START_MS + ms,
                visible: at(s0, ms as u64 + 50),
            })
            .collect();
        // Produced at 13 ms (arrived 15), lag 20: the tick of 40 releases it, at 93 ms. A
        // history record is left out, and a record of a partition with no ticks is unmatched.
        let live = r(s0, 1, 0, Phase::Live, 15, 93);
        let other = r(s0, 2, 0, Phase::Live, 15, 93);
        let history = r(s0, 1, 9, Phase::History, 0, 5);
        let b = ClockBreakdown::of(&[live, history, other], &ticks, a, at(s0, 10), 20, |p| {
            if p == 1 { 0 } else { 1 }
        });
        // All three written after the drain; each visible alone, 20 ms apart.
        assert_eq!(b.ticks.records, 3);
        assert_eq!(b.ticks.avg_ms, 50.0);
        assert_eq!(b.commit_cycle.records, 2);
        assert_eq!(b.commit_cycle.avg_ms, 20.0);
        assert_eq!(b.commit_latency.avg_ms, 50.0);
        assert_eq!(b.to_tick.records, 1);
        assert_eq!(b.to_tick.avg_ms, 27.0);
        assert_eq!(b.tick_to_release.avg_ms, 53.0);
        assert_eq!(b.unmatched, 1);
    }

    #[test]
    fn ticks_read_together_are_one_commit() {
        let s0 = Instant::now();
        let tick = |partition, ms: i64, visible: u64| TickSeen {
            partition,
            timestamp_ms: START_MS + ms,
            visible: at(s0, visible),
        };
        // One commit at 150 carries ticks of 100 and 120 (two partitions), the next at 250
        // ticks of 140 and 200; a tick of 5, before the drain, is left out.
        let ticks = [
            tick(0, 5, 150),
            tick(0, 100, 150),
            tick(1, 120, 152),
            tick(0, 140, 250),
            tick(1, 200, 251),
        ];
        let b = ClockBreakdown::of(&[], &ticks, anchor(s0), at(s0, 10), 20, |_| 0);
        assert_eq!(b.ticks.records, 4);
        assert_eq!(b.commit_cycle.records, 1);
        assert_eq!(b.commit_cycle.avg_ms, 100.0);
        // 150 - 120 and 250 - 200.
        assert_eq!(b.commit_latency.avg_ms, 40.0);
    }

    #[test]
    fn holds_have_nearest_rank_percentiles_and_an_anchor_converts_both_ways() {
        let h = Hold::of((1..=100).map(|ms| ms * 1000).collect());
        assert_eq!((h.records, h.p50_ms, h.p99_ms), (100, 50.0, 99.0));
        assert_eq!(h.avg_ms, 50.5);
        assert_eq!(Hold::of(vec![-3]).avg_ms, 0.0);
        let s0 = Instant::now();
        let a = anchor(s0);
        assert_eq!(a.wall_us(at(s0, 7)), (START_MS + 7) * 1000);
        assert_eq!(a.instant_of_ms(START_MS + 7), Some(at(s0, 7)));
        assert_eq!(a.instant_of_ms(START_MS - 1), None);
    }
}
