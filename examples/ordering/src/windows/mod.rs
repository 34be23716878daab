//! Windowed counting on the experiment's workload: the number of events per product and
//! tumbling event-time window, computed three ways on the same kind of input.
//!
//! - **Closed by evidence** ([`evidence`]): a Parsley DSL pipeline — the 12 event topics
//!   merged, `group_by_key().windowed_by(TimeWindows::of_size(…)).count()` — whose stage
//!   orders by event time with the built-in clock: a window closes when the stage's watermark
//!   reaches its end, which it does during history only on offset evidence and live only as
//!   the clock passes the end plus the lag.
//! - **Stream time with grace** ([`stream_time`]): Kafka Streams' rule, on real consumers. A
//!   task (one per partition number, reading that partition of every event topic) keeps its
//!   stream time, the highest record timestamp it has processed; a window closes, and its
//!   final result is emitted, once stream time reaches its end plus the grace; a record whose
//!   window has closed is dropped. Several graces are run on the same record sequence.
//! - **The batch ground truth** ([`Truth`]): the counts per product and window of every event
//!   written (history and live), computed from the generator's own record of them.
//!
//! Each way's final results are read back by a `read_committed` consumer
//! ([`crate::observe`]), and compared with the ground truth ([`WindowFigures`]): how many
//! windows' final results differ (a wrong count, no result, a result for a window that has no
//! events, a second result), and the **time to final result** of each window: from the moment
//! the window could first be closed — its end, as wall-clock time, and no earlier than the
//! job's start — until its final result was committed (read by the `read_committed`
//! consumer). Live events are produced at their event time, so every record of a live window
//! is produced before its end; a record still on its way at the end is what a method must
//! wait for (or miss). The producer's acknowledgements are no measure of when a record became
//! visible: they came back up to tens of milliseconds after another consumer had read the
//! record. A window whose records were all written before the job started (history) counts
//! from the job's start. As with the ordering rows' holds, the
//! windows are split at the moment the method had committed every history window's result
//! (its *drain*): *steady live* windows could first be closed after it, the others belong to
//! *catch-up*. For steady live windows the time until the result was emitted (handed to the
//! producer, before its commit) is kept too: the rest is the commit.

pub mod evidence;
pub mod run;
pub mod stream_time;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Instant;

use crate::measure::{Anchor, Hold};
use crate::produce::Acked;
use crate::workload::History;

/// A product's window: (product, window start in ms since the epoch).
pub type WindowId = (u32, i64);

/// One final result as a `read_committed` consumer read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Final {
    /// The product.
    pub product: u32,
    /// The window's start, ms since the epoch.
    pub start: i64,
    /// The count.
    pub count: u64,
    /// When the consumer read it: committed by then.
    pub at: Instant,
}

/// A window of the ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TruthWindow {
    /// Events in it.
    pub count: u64,
    /// Whether it has a live event (written after the job started); `false`: every event was
    /// history, written before.
    pub live: bool,
}

/// The batch ground truth: counts per product and window of every event written.
#[derive(Debug, Clone, PartialEq)]
pub struct Truth {
    /// The window size, ms.
    pub size_ms: i64,
    /// Every window that has an event.
    pub windows: HashMap<WindowId, TruthWindow>,
}

/// The start of the `size_ms` tumbling window of event time `t`.
pub fn window_start(t: i64, size_ms: i64) -> i64 {
    t - t.rem_euclid(size_ms)
}

impl Truth {
    /// Counts `history` and the acknowledged `live` events in tumbling windows of `size_ms`.
    pub fn new(size_ms: i64, history: &History, live: &[Acked]) -> Self {
        let mut windows: HashMap<WindowId, TruthWindow> = HashMap::new();
        for e in &history.events {
            let w = windows
                .entry((e.product, window_start(e.event_time_ms, size_ms)))
                .or_insert(TruthWindow {
                    count: 0,
                    live: false,
                });
            w.count += 1;
        }
        for e in live {
            let w = windows
                .entry((e.product, window_start(e.event_time_ms, size_ms)))
                .or_insert(TruthWindow {
                    count: 0,
                    live: true,
                });
            w.count += 1;
            w.live = true;
        }
        Truth { size_ms, windows }
    }

    /// Events counted.
    pub fn events(&self) -> u64 {
        self.windows.values().map(|w| w.count).sum()
    }
}

/// How one run's final results compare with the ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowFigures {
    /// Windows of the ground truth.
    pub windows: u64,
    /// Windows whose (first) final result has another count.
    pub wrong: u64,
    /// Windows with no final result.
    pub missing: u64,
    /// Final results for windows that have no events.
    pub extra: u64,
    /// Final results after a window's first.
    pub duplicates: u64,
    /// Time to final result (module docs) of the windows that could be closed before the
    /// drain: every history window, and live windows that ended during catch-up.
    pub catch_up_final: Hold,
    /// The same for the windows with a live event that could be closed after the drain.
    pub live_final: Hold,
    /// Steady live windows: from when they could first be closed until their result was
    /// emitted (before its commit).
    pub live_emitted: Hold,
}

impl WindowFigures {
    /// Windows whose final result differs from the ground truth.
    pub fn differing(&self) -> u64 {
        self.wrong + self.missing + self.extra + self.duplicates
    }

    /// Compares `finals`, read in a job started at `start`, with `truth`; `emitted` has the
    /// instant each window's result was first emitted, where known.
    pub fn of(
        truth: &Truth,
        finals: &[Final],
        emitted: &HashMap<WindowId, Instant>,
        start: Anchor,
    ) -> Self {
        let mut f = WindowFigures {
            windows: truth.windows.len() as u64,
            ..WindowFigures::default()
        };
        let mut first: HashMap<WindowId, Final> = HashMap::with_capacity(finals.len());
        for r in finals {
            match first.entry((r.product, r.start)) {
                Entry::Occupied(_) => f.duplicates += 1,
                Entry::Vacant(v) => {
                    v.insert(*r);
                }
            }
        }
        let drained = truth
            .windows
            .iter()
            .filter(|(_, w)| !w.live)
            .filter_map(|(id, _)| first.get(id).map(|r| r.at))
            .max()
            .unwrap_or(start.instant);
        let (mut catch_up, mut live, mut live_emitted) = (Vec::new(), Vec::new(), Vec::new());
        for (id, w) in &truth.windows {
            let Some(r) = first.get(id) else {
                f.missing += 1;
                continue;
            };
            if r.count != w.count {
                f.wrong += 1;
            }
            let from = start
                .instant_of_ms(id.1 + truth.size_ms)
                .unwrap_or(start.instant);
            let us = start.wall_us(r.at) - start.wall_us(from);
            if w.live && from >= drained {
                live.push(us);
                if let Some(e) = emitted.get(id) {
                    live_emitted.push(start.wall_us(*e) - start.wall_us(from));
                }
            } else {
                catch_up.push(us);
            }
        }
        f.extra = first
            .keys()
            .filter(|id| !truth.windows.contains_key(id))
            .count() as u64;
        f.catch_up_final = Hold::signed(catch_up);
        f.live_final = Hold::signed(live);
        f.live_emitted = Hold::signed(live_emitted);
        f
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workload::Event;

    const START_MS: i64 = 1_000_000;

    fn history(events: &[(u32, i64)]) -> History {
        History {
            events: events
                .iter()
                .map(|&(product, t)| Event {
                    product,
                    seq: 0,
                    topic: 0,
                    event_time_ms: t,
                })
                .collect(),
            per_product: Vec::new(),
            last_event_ms: Vec::new(),
        }
    }

    #[test]
    fn the_ground_truth_counts_per_product_and_window() {
        assert_eq!(window_start(1_999, 1_000), 1_000);
        assert_eq!(window_start(-1, 1_000), -1_000);
        let t = Truth::new(
            1_000,
            &history(&[(1, 10), (1, 999), (2, 10), (1, 1_000)]),
            &[Acked {
                product: 1,
                event_time_ms: 1_500,
            }],
        );
        assert_eq!(t.windows.len(), 3);
        assert_eq!(t.windows[&(1, 0)].count, 2);
        assert_eq!(
            t.windows[&(1, 1_000)],
            TruthWindow {
                count: 2,
                live: true
            }
        );
        assert_eq!(t.events(), 5);
    }

    #[test]
    fn final_results_are_compared_and_timed_from_when_the_window_could_close() {
        let s0 = Instant::now();
        let anchor = Anchor {
            instant: s0,
            wall_us: START_MS * 1000,
        };
        let at = |ms: u64| s0 + Duration::from_millis(ms);
        // History windows (1, 0) and (2, 0); live windows (1, START) and (3, START), which
        // end at 1,000 ms.
        let t = Truth::new(
            1_000,
            &history(&[(1, 5), (2, 5), (2, 6)]),
            &[
                Acked {
                    product: 1,
                    event_time_ms: START_MS + 990,
                },
                Acked {
                    product: 3,
                    event_time_ms: START_MS + 100,
                },
            ],
        );
        let f = |product, start, count, ms| Final {
            product,
            start,
            count,
            at: at(ms),
        };
        let finals = [
            f(1, 0, 1, 50),
            f(2, 0, 1, 60),           // wrong: 2 events
            f(1, START_MS, 1, 1_050), // 50 ms after its end
            f(1, START_MS, 1, 1_300), // a second result
            f(9, 0, 1, 70),           // no such window
        ];
        // The second live window, (3, START), has no result; the first was emitted at 1,030.
        let emitted = HashMap::from([((1, START_MS), at(1_030))]);
        let w = WindowFigures::of(&t, &finals, &emitted, anchor);
        assert_eq!(w.windows, 4);
        assert_eq!((w.wrong, w.missing, w.extra, w.duplicates), (1, 1, 1, 1));
        assert_eq!(w.differing(), 4);
        // History: drained at 60 ms.
        assert_eq!(w.catch_up_final.records, 2);
        assert_eq!(w.catch_up_final.avg_ms, 55.0);
        assert_eq!(w.live_final.records, 1);
        assert_eq!(w.live_final.avg_ms, 50.0);
        assert_eq!(w.live_emitted.avg_ms, 30.0);
        // A live window that could close before the drain belongs to catch-up.
        let late_drain = [f(1, 0, 1, 1_400), f(1, START_MS, 1, 1_050)];
        let w = WindowFigures::of(&t, &late_drain, &HashMap::new(), anchor);
        assert_eq!((w.catch_up_final.records, w.live_final.records), (2, 0));
    }
}
