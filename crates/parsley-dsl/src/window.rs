//! Time windows closed by evidence: [`TimeWindows`] (tumbling and hopping), the windowed
//! aggregations of a [`TimeWindowedKStream`] into a table keyed by [`Windowed`] keys, and the
//! kinds of windows a grouped stream is aggregated in ([`Windowing`]). Records that arrive
//! after their windows closed go as the [`LatePolicy`](crate::LatePolicy) says.
//!
//! A record with event time `t` (its Kafka record timestamp, ms since the epoch) belongs to
//! every window `[start, start + size)` with `start <= t < start + size`, where `start` is a
//! multiple of the advance (the size for tumbling windows) and not negative: as in Kafka
//! Streams, the first window starts at the epoch. A window **closes** when the
//! stage's event-time watermark reaches `end + grace`: the watermark moves only on Kafka's
//! evidence (offset completeness during history, the clock once live), so a window closes once
//! every record that belongs to it has been handed over, except records written later than
//! `grace` behind. At that moment its final result is emitted — once — and its state is
//! dropped. On request every update is emitted instead, and nothing when the window closes
//! ([`TimeWindowedKStream::emit_updates`]). Every result carries the window's timestamp as
//! Kafka Streams sets it: the latest event time among the window's records.
//!
//! Invariants:
//! - Per key, the operator's state slot holds the key and the aggregate and timestamp of every
//!   open window by start; a window is in it iff it received a record and has not closed.
//! - A timer is set at `end + grace` for every window when it opens; the timer closes every
//!   window of the key that closes at or before its time, in start order.
//! - A record whose windows have all closed when it arrives is never dropped silently: it is
//!   counted (`too_late`) and, under [`LatePolicy::ToTopic`](crate::LatePolicy::ToTopic),
//!   written to that topic.
//!
//! Above `grouped` and `table`; below `session`, whose windows are a [`Windowing`] too: it
//! imports nothing of `session`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::data::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward_at, forward_headed};
use crate::grouped::KGroupedStream;
use crate::table::KTable;

/// Windows of a fixed size that start at multiples of an advance (Kafka Streams'
/// `TimeWindows`): tumbling when the advance is the size, hopping when it is smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindows {
    size_ms: i64,
    advance_ms: i64,
    grace_ms: i64,
}

impl TimeWindows {
    /// Tumbling windows of `size` (no grace: a window closes when the watermark reaches its
    /// end).
    ///
    /// # Panics
    /// When `size` is under 1 ms or over `i64::MAX` ms.
    pub fn of_size(size: Duration) -> Self {
        let size_ms = millis(size);
        assert!(size_ms > 0, "a window is at least 1 ms long");
        TimeWindows {
            size_ms,
            advance_ms: size_ms,
            grace_ms: 0,
        }
    }

    /// Hopping windows: one starts every `advance`.
    ///
    /// # Panics
    /// When `advance` is under 1 ms or longer than the size.
    pub fn advance_by(mut self, advance: Duration) -> Self {
        let advance_ms = millis(advance);
        assert!(
            advance_ms > 0 && advance_ms <= self.size_ms,
            "a window's advance is between 1 ms and its size"
        );
        self.advance_ms = advance_ms;
        self
    }

    /// Keeps each window open `grace` longer, for producers known to write late: a window
    /// closes when the watermark reaches its end plus `grace`.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace_ms = millis(grace);
        self
    }

    /// The size, ms.
    pub fn size_ms(&self) -> i64 {
        self.size_ms
    }

    /// The advance, ms.
    pub fn advance_ms(&self) -> i64 {
        self.advance_ms
    }

    /// The grace, ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The starts of the windows that hold event time `t`, ascending: none starts before the
    /// epoch (Kafka Streams' `TimeWindows::windowsFor`), so a hopping window's first windows
    /// are the ones that start at 0 or later.
    pub fn starts_of(&self, t: i64) -> Vec<i64> {
        let last = t - t.rem_euclid(self.advance_ms);
        let mut starts: Vec<i64> =
            std::iter::successors(Some(last), |s| s.checked_sub(self.advance_ms))
                .take_while(|s| *s >= 0 && s.checked_add(self.size_ms).is_none_or(|end| end > t))
                .collect();
        starts.reverse();
        starts
    }

    /// The time the window starting at `start` closes at: end plus grace, ms.
    fn closes_at(&self, start: i64) -> i64 {
        start
            .saturating_add(self.size_ms)
            .saturating_add(self.grace_ms)
    }

    fn describe(&self) -> String {
        if self.advance_ms == self.size_ms {
            format!("tumbling {} ms, grace {} ms", self.size_ms, self.grace_ms)
        } else {
            format!(
                "hopping {} ms every {} ms, grace {} ms",
                self.size_ms, self.advance_ms, self.grace_ms
            )
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("a duration of at most i64::MAX ms")
}

/// A key and the window `[start, end)` of a windowed aggregation's result (Kafka Streams'
/// `Windowed`); times in ms since the epoch. With the default codecs it is written as JSON:
/// `{"key":…,"start":…,"end":…}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Windowed<K> {
    /// The grouping key.
    pub key: K,
    /// The window's start, inclusive.
    pub start: i64,
    /// The window's end, exclusive.
    pub end: i64,
}

/// The open windows of one key (module docs): by start, the aggregate and its timestamp (the
/// latest event time of its records).
#[derive(Serialize, Deserialize)]
struct Open<K, A> {
    key: K,
    windows: BTreeMap<i64, (A, i64)>,
}

/// The open windows of one key as version 1 of the state encoding kept them, without
/// timestamps: read as if each window's latest record were at its start.
#[derive(Serialize, Deserialize)]
struct OpenV1<K, A> {
    key: K,
    windows: BTreeMap<i64, A>,
}

impl<K, A> From<OpenV1<K, A>> for Open<K, A> {
    fn from(old: OpenV1<K, A>) -> Self {
        Open {
            key: old.key,
            windows: old.windows.into_iter().map(|(s, a)| (s, (a, s))).collect(),
        }
    }
}

/// The open windows in slot `slot` of the context's key.
fn load_open<K: Data, A: Data>(ctx: &mut Ctx<'_>, slot: &str) -> Result<Option<Open<K, A>>, Error> {
    ctx.load_upgraded(slot, |old: OpenV1<K, A>| Open::from(old))
}

/// A grouped stream in time windows (Kafka Streams' `TimeWindowedKStream`), from
/// [`KGroupedStream::windowed_by`].
pub struct TimeWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: TimeWindows,
    updates: bool,
}

impl<K: Data, V: Data> TimeWindowedKStream<K, V> {
    pub(crate) fn new(grouped: KGroupedStream<K, V>, windows: TimeWindows) -> Self {
        TimeWindowedKStream {
            grouped,
            windows,
            updates: false,
        }
    }

    /// Emits each window's new value after every record instead of its final result (Kafka
    /// Streams' default, `EmitStrategy.onWindowUpdate`): the last update of a window is its
    /// final value, and nothing more is emitted when it closes. Without it only final results
    /// are emitted, once per window (Kafka Streams' `EmitStrategy.onWindowClose`).
    pub fn emit_updates(mut self) -> Self {
        self.updates = true;
        self
    }

    /// The number of records per key and window.
    pub fn count(self) -> KTable<Windowed<K>, i64> {
        self.fold("count", |_k: &K, _v, n: Option<i64>| n.unwrap_or(0) + 1)
    }

    /// Per key and window, the records' values combined by `reducer` (the first as it is).
    pub fn reduce(
        self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, V> {
        self.fold("reduce", move |_k, v, agg: Option<V>| match agg {
            Some(agg) => reducer(agg, v),
            None => v,
        })
    }

    /// Per key and window, `initializer()` folded with `aggregator` over the records' values.
    pub fn aggregate<A: Data>(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        self.fold("aggregate", move |k, v, agg: Option<A>| {
            aggregator(k, v, agg.unwrap_or_else(&initializer))
        })
    }

    fn fold<A: Data>(
        self,
        kind: &str,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        let TimeWindowedKStream {
            grouped,
            windows,
            updates,
        } = self;
        let what = format!("windowed {kind} ({})", windows.describe());
        let (graph, node, input, name) = grouped.stateful_node(kind, what);
        let (out, freeze) = Outlet::<Windowed<K>, Change<A>>::new();
        let mut g = graph.borrow_mut();
        g.on_freeze(freeze);
        let late = g.late_route(node, name.clone());
        let children = out.children();
        let slot = name.clone();
        let on_timer_children = children.clone();
        let on_timer_slot = slot.clone();
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                close(ctx, &on_timer_slot, windows, !updates, &on_timer_children)
            }),
        );
        drop(g);
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
            let t = ctx.timestamp;
            let watermark = ctx.watermark.unwrap_or(i64::MIN);
            let starts: Vec<i64> = windows
                .starts_of(t)
                .into_iter()
                .filter(|s| windows.closes_at(*s) > watermark)
                .collect();
            if starts.is_empty() {
                let start = windows.starts_of(t).last().copied().unwrap_or(t);
                let end = start.saturating_add(windows.size_ms);
                return late.take(ctx, k, v, (start, end));
            }
            let mut open: Open<K, A> = load_open(ctx, &slot)?.unwrap_or_else(|| Open {
                key: k.clone(),
                windows: BTreeMap::new(),
            });
            for start in starts {
                let (old, at) = match open.windows.remove(&start) {
                    Some((old, at)) => (Some(old), at.max(t)),
                    None => {
                        ctx.timers.push(windows.closes_at(start));
                        (None, t)
                    }
                };
                let new = step(&k, v.clone(), old.clone());
                open.windows.insert(start, (new.clone(), at));
                ctx.keep_headers(&slot, start)?;
                if updates {
                    let key = Windowed {
                        key: k.clone(),
                        start,
                        end: start.saturating_add(windows.size_ms),
                    };
                    forward_at(
                        &children,
                        ctx,
                        at,
                        key,
                        Change {
                            old,
                            new: Some(new),
                        },
                    )?;
                }
            }
            ctx.store(&slot, Some(&open))
        }));
        KTable::new(graph, node, out)
    }
}

/// The timer of the context's key at time `ctx.timestamp` (its windows' closing time): closes
/// every window in slot `slot` that closes at or before it, in start order — forwards its
/// final result with the window's timestamp when `finals` (not when every update was emitted
/// already), and drops it.
fn close<K: Data, A: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    windows: TimeWindows,
    finals: bool,
    children: &Children<Windowed<K>, Change<A>>,
) -> Result<(), Error> {
    let Some(mut open) = load_open::<K, A>(ctx, slot)? else {
        return Ok(());
    };
    let now = ctx.timestamp;
    let due: Vec<i64> = open
        .windows
        .keys()
        .copied()
        .filter(|s| windows.closes_at(*s) <= now)
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    for start in due {
        let (value, at) = open.windows.remove(&start).expect("a due window");
        let headers = ctx.take_headers(slot, &start)?;
        if !finals {
            continue;
        }
        let key = Windowed {
            key: open.key.clone(),
            start,
            end: start.saturating_add(windows.size_ms),
        };
        forward_headed(
            children,
            ctx,
            (at, headers),
            key,
            Change {
                old: None,
                new: Some(value),
            },
        )?;
    }
    let rest = (!open.windows.is_empty()).then_some(&open);
    ctx.store(slot, rest)
}

/// A kind of windows a grouped stream can be aggregated in ([`KGroupedStream::windowed_by`]):
/// [`TimeWindows`] or [`SessionWindows`](crate::SessionWindows).
pub trait Windowing<K, V> {
    /// The windowed stream it makes.
    type Stream;

    /// `grouped` in these windows.
    fn windowed(self, grouped: KGroupedStream<K, V>) -> Self::Stream;
}

impl<K: Data, V: Data> Windowing<K, V> for TimeWindows {
    type Stream = TimeWindowedKStream<K, V>;

    fn windowed(self, grouped: KGroupedStream<K, V>) -> TimeWindowedKStream<K, V> {
        TimeWindowedKStream::new(grouped, self)
    }
}

impl<K: Data, V: Data> KGroupedStream<K, V> {
    /// The grouped stream in windows — [`TimeWindows`] (tumbling, hopping) or
    /// [`SessionWindows`](crate::SessionWindows) — for aggregations per key and window, each
    /// window's result emitted once when the stage's watermark closes it (module docs of
    /// windows). The stage that aggregates orders by event time.
    pub fn windowed_by<W: Windowing<K, V>>(self, windows: W) -> W::Stream {
        windows.windowed(self)
    }
}
