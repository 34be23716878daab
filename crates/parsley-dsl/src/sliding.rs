//! [`SlidingWindows`]: windows of a fixed time difference defined by the records themselves
//! (Kafka Streams' `SlidingWindows`, KIP-450), and the aggregations of a
//! [`SlidingWindowedKStream`] into a table keyed by [`Windowed`] keys, closed by evidence.
//!
//! A window `[start, start + d]` includes both ends (`d` is the time difference, ms). Only the
//! windows whose contents differ exist: for a record at event time `t`, its *left* window
//! `[t - d, t]` and, when a later record of the key lies within `d` after it, its *right*
//! window `[t + 1, t + 1 + d]`; every existing window that holds `t` takes the record too. A
//! record's right window starts from the aggregate of the window that held the later records,
//! and its left window from the window that ended just before it, so no window is folded
//! again from its records: each is kept as one aggregate and its latest event time. A record
//! earlier than `d` after the epoch has no left window of its own: the window `[0, d]` stands
//! for all of them (no window starts before the epoch). These are Kafka Streams' rules, as its
//! `KStreamSlidingWindowAggregate` applies them, record by record in arrival order, and the
//! results match its results (the conformance catalogue).
//!
//! Completeness is Parsley's: a window **closes** when the stage's event-time watermark
//! passes its end plus the grace, `end + grace + 1` (Kafka Streams: stream time). Then its final
//! result is emitted, once; with [`SlidingWindowedKStream::emit_updates`] every update is
//! emitted instead, and nothing at the close. A record whose windows have all closed
//! (`t + 1 + d + grace <= watermark`) is too late: counted and routed by the
//! [`LatePolicy`](crate::LatePolicy), never folded; a closed window a record would still
//! belong to is left as it was.
//!
//! Invariants:
//! - Per key, the operator's slot holds the key and every window by start: its aggregate, its
//!   latest event time, and whether it closed. A closed window is kept until no record that is
//!   not too late can read it (a record reads the windows that start up to `2d` before it):
//!   until the watermark passes `start + 3d + grace`.
//! - Each window gets a timer at its close and one at its removal when it is made.
//!
//! Above `window` (its [`Windowed`] keys and the [`Windowing`] trait); below `session` and
//! `builder`: it imports nothing of theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::data::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward_at, forward_headed};
use crate::grouped::KGroupedStream;
use crate::table::KTable;
use crate::window::{Windowed, Windowing};

/// Windows of a fixed time difference that slide with the records (Kafka Streams'
/// `SlidingWindows`): a window `[start, start + difference]`, both ends included, for the
/// records within `difference` before each record, and within `difference` after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindows {
    difference_ms: i64,
    grace_ms: i64,
}

impl SlidingWindows {
    /// Windows of time difference `difference`, closed when the watermark passes their end
    /// (Kafka Streams' `SlidingWindows.ofTimeDifferenceWithNoGrace`).
    ///
    /// # Panics
    /// When `difference` is under 1 ms or over `i64::MAX / 4` ms.
    pub fn of_time_difference_with_no_grace(difference: Duration) -> Self {
        Self::of_time_difference_and_grace(difference, Duration::ZERO)
    }

    /// Windows of time difference `difference`, each kept open `grace` after its end (Kafka
    /// Streams' `SlidingWindows.ofTimeDifferenceAndGrace`).
    ///
    /// # Panics
    /// When `difference` is under 1 ms (a window ends after it starts, as in Kafka Streams,
    /// whose windows of difference 0 fail at the first record), or `difference` or `grace` is
    /// over `i64::MAX / 4` ms.
    pub fn of_time_difference_and_grace(difference: Duration, grace: Duration) -> Self {
        let ms = |d: Duration| {
            i64::try_from(d.as_millis())
                .ok()
                .filter(|ms| *ms <= i64::MAX / 4)
                .expect("a time difference and a grace of at most i64::MAX / 4 ms")
        };
        let difference_ms = ms(difference);
        assert!(
            difference_ms >= 1,
            "a sliding window's time difference is at least 1 ms"
        );
        SlidingWindows {
            difference_ms,
            grace_ms: ms(grace),
        }
    }

    /// The time difference, ms: a window `[start, start + difference]`.
    pub fn time_difference_ms(&self) -> i64 {
        self.difference_ms
    }

    /// The grace, ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The watermark that closes the window starting at `start`: past its end plus grace.
    fn closes_at(&self, start: i64) -> i64 {
        start
            .saturating_add(self.difference_ms)
            .saturating_add(self.grace_ms)
            .saturating_add(1)
    }

    /// The watermark from which no record that is not too late reads the window starting at
    /// `start` (module docs).
    fn forgotten_at(&self, start: i64) -> i64 {
        start
            .saturating_add(self.difference_ms.saturating_mul(3))
            .saturating_add(self.grace_ms)
            .saturating_add(1)
    }

    fn end(&self, start: i64) -> i64 {
        start.saturating_add(self.difference_ms)
    }
}

/// One window of a key: its aggregate, the latest event time folded into it, and whether it
/// closed (its final result emitted when only final results are).
#[derive(Clone, Serialize, Deserialize)]
struct Slide<A> {
    agg: A,
    at: i64,
    closed: bool,
}

/// The windows of one key by start (module docs).
#[derive(Serialize, Deserialize)]
struct Slides<K, A> {
    key: K,
    windows: BTreeMap<i64, Slide<A>>,
}

/// A window's aggregate and latest event time, as a new or updated window starts from it;
/// `None`: from the initializer.
type Seed<A> = Option<(A, i64)>;

/// A grouped stream in sliding windows (Kafka Streams' `TimeWindowedKStream` of
/// `SlidingWindows`), from [`KGroupedStream::windowed_by`].
pub struct SlidingWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SlidingWindows,
    updates: bool,
}

impl<K: Data, V: Data> Windowing<K, V> for SlidingWindows {
    type Stream = SlidingWindowedKStream<K, V>;

    fn windowed(self, grouped: KGroupedStream<K, V>) -> SlidingWindowedKStream<K, V> {
        SlidingWindowedKStream {
            grouped,
            windows: self,
            updates: false,
        }
    }
}

impl<K: Data, V: Data> SlidingWindowedKStream<K, V> {
    /// Emits each window's new value after every record instead of its final result (Kafka
    /// Streams' default, `EmitStrategy.onWindowUpdate`); without it, only final results, once
    /// per window when it closes (`EmitStrategy.onWindowClose`).
    pub fn emit_updates(mut self) -> Self {
        self.updates = true;
        self
    }

    /// The number of records per key and window.
    ///
    /// `SlidingWindowedKStream<K, V>` → `KTable<Windowed<K>, i64>`; a window's key has
    /// `end = start + difference`, the last ms it includes.
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
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use parsley_dsl::{SlidingWindows, StreamsBuilder};
    /// let builder = StreamsBuilder::new("cards");
    /// // Per card, the amount spent within any 10 minutes.
    /// builder
    ///     .stream::<String, i64>("payments")
    ///     .group_by_key()
    ///     .windowed_by(SlidingWindows::of_time_difference_with_no_grace(Duration::from_secs(600)))
    ///     .aggregate(|| 0i64, |_card, cents, total| total + cents)
    ///     .to_stream()
    ///     .to("spent-in-ten-minutes");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
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
        let SlidingWindowedKStream {
            grouped,
            windows,
            updates,
        } = self;
        let what = format!(
            "sliding {kind} (difference {} ms, grace {} ms)",
            windows.difference_ms, windows.grace_ms
        );
        let (graph, node, input, name) = grouped.stateful_node(kind, what);
        let (out, freeze) = Outlet::<Windowed<K>, Change<A>>::new();
        let mut g = graph.borrow_mut();
        g.on_freeze(freeze);
        let late = g.late_route(node, name.clone());
        let children = out.children();
        let (timer_slot, timer_children) = (name.clone(), children.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                on_timer::<K, A>(ctx, &timer_slot, windows, !updates, &timer_children)
            }),
        );
        drop(g);
        let slot = name;
        let step = Arc::new(step);
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
            let t = ctx.timestamp;
            let close_time = ctx
                .watermark
                .unwrap_or(i64::MIN)
                .saturating_sub(windows.grace_ms);
            let d = windows.difference_ms;
            if t < 0 || t.saturating_add(1).saturating_add(d) <= close_time {
                return late.take(ctx, k, v, (t.saturating_sub(d), t));
            }
            let slides = ctx.load::<Slides<K, A>>(&slot)?.unwrap_or_else(|| Slides {
                key: k.clone(),
                windows: BTreeMap::new(),
            });
            let mut pass = Pass {
                windows,
                slides,
                key: k,
                value: v,
                t,
                close_time,
                step: &*step,
                updated: Vec::new(),
            };
            if t < d {
                pass.early(ctx);
            } else {
                pass.in_windows(ctx);
            }
            ctx.store(&slot, Some(&pass.slides))?;
            for (start, _) in &pass.updated {
                ctx.keep_headers(&slot, *start)?;
            }
            if updates {
                pass.emit_updates(ctx, &children)?;
            }
            Ok(())
        }));
        KTable::new(graph, node, out)
    }
}

/// One record's pass over its key's windows (module docs).
struct Pass<'a, K, V, A> {
    windows: SlidingWindows,
    slides: Slides<K, A>,
    key: K,
    value: V,
    /// The record's event time, ms.
    t: i64,
    /// Windows that end before it are closed: the watermark less the grace.
    close_time: i64,
    step: &'a (dyn Fn(&K, V, Option<A>) -> A + Send + Sync),
    /// The windows the record wrote, in the order of their last write, each with its value
    /// before the record: what is emitted when every update is (a window written twice by one
    /// record is emitted once, with its last value, as Kafka Streams' record cache does).
    updated: Vec<(i64, Option<A>)>,
}

impl<K: Data, V: Data, A: Data> Pass<'_, K, V, A> {
    /// A record at `d` or later: the windows that start from `t - 2d` to `t + 1`, latest first,
    /// then the windows it makes.
    fn in_windows(&mut self, ctx: &mut Ctx<'_>) {
        let (t, d) = (self.t, self.windows.difference_ms);
        let mut seen = BTreeSet::new();
        let (mut left, mut right): (Seed<A>, Seed<A>) = (None, None);
        let (mut has_left, mut has_right) = (false, false);
        let mut previous: Option<i64> = None;
        let found = self.found(t.saturating_sub(2 * d).max(0), t + 1, true);
        for (start, agg, at) in found {
            seen.insert(start);
            let end = self.windows.end(start);
            if start == t + 1 {
                has_right = true;
            } else if end > t {
                if right.is_none() {
                    right = Some((agg.clone(), at));
                }
                self.update(ctx, start, Some((agg, at)));
            } else if end == t {
                has_left = true;
                self.update(ctx, start, Some((agg, at)));
                if at >= t {
                    // The record's windows exist already: a record at `t` made them.
                    return;
                }
                previous = Some(at);
            } else {
                left = Some((agg, at));
                previous = Some(at);
                break;
            }
        }
        // The previous record's right window, when the record falls in it.
        if let Some(p) = previous {
            let start = p + 1;
            if !seen.contains(&start) && start + d >= t {
                self.update(ctx, start, None);
            }
        }
        if !has_left {
            let seed = match (previous, left) {
                (Some(p), Some((agg, _))) if t - d <= p => Some((agg, t)),
                _ => None,
            };
            self.update(ctx, t - d, seed);
        }
        if !has_right {
            self.make_right(ctx, right);
        }
    }

    /// A record before `d`: the window `[0, d]` stands for its left window (module docs).
    fn early(&mut self, ctx: &mut Ctx<'_>) {
        let t = self.t;
        let mut seen = BTreeSet::new();
        let mut first: Seed<A> = None;
        let mut right: Seed<A> = None;
        let mut has_right = false;
        let mut previous: Option<i64> = None;
        for (start, agg, at) in self.found(0, t + 1, false) {
            seen.insert(start);
            if start == 0 {
                if at < t {
                    previous = Some(at);
                }
                first = Some((agg, at));
            } else if start <= t {
                right = Some((agg.clone(), at));
                self.update(ctx, start, Some((agg, at)));
            } else {
                has_right = true;
            }
        }
        if right.is_none() {
            right = first.clone().filter(|(_, at)| *at > t);
        }
        if !has_right {
            self.make_right(ctx, right);
        }
        if let Some(p) = previous
            && !seen.contains(&(p + 1))
        {
            self.update(ctx, p + 1, None);
        }
        self.update(ctx, 0, first);
    }

    /// The windows that start in `[from, to]`, each as its aggregate and latest event time:
    /// latest first when `latest_first`.
    fn found(&self, from: i64, to: i64, latest_first: bool) -> Vec<(i64, A, i64)> {
        let range = self.slides.windows.range(from..=to);
        let found = range.map(|(start, s)| (*start, s.agg.clone(), s.at));
        if latest_first {
            found.rev().collect()
        } else {
            found.collect()
        }
    }

    /// Folds the record into the window starting at `start`, from `seed` (its aggregate, or a
    /// new window's), unless the window closed.
    fn update(&mut self, ctx: &mut Ctx<'_>, start: i64, seed: Seed<A>) {
        let end = self.windows.end(start);
        if end < self.close_time {
            return; // closed: left as it was
        }
        let (old, at) = match seed {
            Some((agg, at)) => (Some(agg), at.max(self.t)),
            None => (None, self.t),
        };
        let new = (self.step)(&self.key, self.value.clone(), old.clone());
        self.put(ctx, start, new, at, old);
    }

    /// Makes the record's right window from `right`, the aggregate of the later records, when
    /// it holds any (its latest event time after the record's).
    fn make_right(&mut self, ctx: &mut Ctx<'_>, right: Seed<A>) {
        if let Some((agg, at)) = right.filter(|(_, at)| *at > self.t) {
            self.put(ctx, self.t + 1, agg, at, None);
        }
    }

    /// Stores a window written by the record, `old` its value before; a new one gets its
    /// timers (module docs).
    fn put(&mut self, ctx: &mut Ctx<'_>, start: i64, agg: A, at: i64, old: Option<A>) {
        let slide = Slide {
            agg,
            at,
            closed: false,
        };
        if self.slides.windows.insert(start, slide).is_none() {
            ctx.timers.push(self.windows.closes_at(start));
            ctx.timers.push(self.windows.forgotten_at(start));
        }
        let old = match self.updated.iter().position(|(s, _)| *s == start) {
            Some(i) => self.updated.remove(i).1,
            None => old,
        };
        self.updated.push((start, old));
    }

    /// Emits each window the record wrote, with its value now and its latest event time.
    fn emit_updates(
        &mut self,
        ctx: &mut Ctx<'_>,
        children: &Children<Windowed<K>, Change<A>>,
    ) -> Result<(), Error> {
        for (start, old) in std::mem::take(&mut self.updated) {
            let slide = &self.slides.windows[&start];
            let key = Windowed {
                key: self.key.clone(),
                start,
                end: self.windows.end(start),
            };
            let change = Change {
                old,
                new: Some(slide.agg.clone()),
            };
            let at = slide.at;
            forward_at(children, ctx, at, key, change)?;
        }
        Ok(())
    }
}

/// The timer of the context's key at watermark `ctx.timestamp`: closes every window of slot
/// `slot` whose close is due, in start order — forwarding its final result, with its latest
/// event time, when `finals` — and forgets the windows no record can read any more.
fn on_timer<K: Data, A: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    windows: SlidingWindows,
    finals: bool,
    children: &Children<Windowed<K>, Change<A>>,
) -> Result<(), Error> {
    let Some(mut slides) = ctx.load::<Slides<K, A>>(slot)? else {
        return Ok(());
    };
    let now = ctx.timestamp;
    let mut changed = false;
    let mut results = Vec::new();
    for (start, slide) in slides.windows.iter_mut() {
        if !slide.closed && windows.closes_at(*start) <= now {
            slide.closed = true;
            changed = true;
            if finals {
                results.push((*start, slide.agg.clone(), slide.at));
            }
        }
    }
    let forgotten: Vec<i64> = slides
        .windows
        .keys()
        .copied()
        .filter(|start| windows.forgotten_at(*start) <= now)
        .collect();
    for start in &forgotten {
        slides.windows.remove(start);
    }
    changed |= !forgotten.is_empty();
    // A window's headers are kept until it is forgotten: a record in time may still read it.
    let mut headed = Vec::with_capacity(results.len());
    for (start, agg, at) in results {
        let headers = if forgotten.contains(&start) {
            ctx.take_headers(slot, &start)?
        } else {
            ctx.kept_headers(slot, &start)?
        };
        headed.push((start, agg, at, headers));
    }
    for start in forgotten {
        ctx.take_headers(slot, &start)?;
    }
    for (start, agg, at, headers) in headed {
        let key = Windowed {
            key: slides.key.clone(),
            start,
            end: windows.end(start),
        };
        let change = Change {
            old: None,
            new: Some(agg),
        };
        forward_headed(children, ctx, (at, headers), key, change)?;
    }
    if changed {
        let rest = (!slides.windows.is_empty()).then_some(&slides);
        ctx.store(slot, rest)?;
    }
    Ok(())
}
