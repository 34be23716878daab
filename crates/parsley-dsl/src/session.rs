//! Session windows closed by evidence: per key, records whose event times lie within an
//! inactivity gap of each other form one session, and a session's final result is emitted once
//! the stage's watermark proves no record can extend it any more.
//!
//! A session is `[start, end]`, both inclusive (as in Kafka Streams): the event times of its
//! first and last records, ms since the epoch. A record at `t` joins every open session of its
//! key with `start - gap <= t <= end + gap`, merging them; with none it starts its own. A
//! session can be extended by a record at up to `end + gap`, so it **closes** when the
//! watermark reaches `end + gap + 1 + grace`: then every record that could extend it has been
//! handed over, except records written more than `grace` late.
//!
//! A closed session is final: its result is out and it is never extended. A record at `t`
//! that would extend one (`t <= end + gap`) arrives more than `grace` late and is too late,
//! like a record whose own session would already be closed. Kafka Streams merges such a record
//! into the closed session and gives that session a second result.
//!
//! Every result carries its session's end as its timestamp, as in Kafka Streams.
//!
//! Invariants:
//! - Per key, the operator's slot holds the key, every open session by start, and the end of
//!   the latest closed session while a record in time could still reach it: one not too late
//!   by its own time (until the watermark reaches `end + 2 gap + grace + 1`), or one that joins
//!   an open session of the key — any open session, since records in time that join it can
//!   extend it back, each up to `gap` earlier, until one is within the gap of the closed
//!   session. Open sessions of one key are more than `gap` apart, and more than `gap` after
//!   that end.
//! - A timer is set at a session's closing time whenever its end moves; a timer closes the
//!   sessions that close at or before its time (a session whose end moved since has a later
//!   timer of its own), and forgets the closed session's end when its time comes.
//! - A record that would extend a closed session, or that merges with no open session and
//!   whose own session would already be closed, is too late: counted and routed by the late
//!   policy, never dropped silently.
//!
//! Above `window` (the [`Windowed`] keys and the [`Windowing`] trait), `grouped` and `table`;
//! no operator module imports it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::data::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward_at, forward_headed};
use crate::grouped::KGroupedStream;
use crate::table::KTable;
use crate::window::{Windowed, Windowing};

/// Session windows (Kafka Streams' `SessionWindows`): per key, records within `gap` of each
/// other form a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    gap_ms: i64,
    grace_ms: i64,
}

impl SessionWindows {
    /// Sessions that end after `gap` without a record of their key (no grace).
    ///
    /// # Panics
    /// When `gap` is over `i64::MAX` ms.
    pub fn with_inactivity_gap(gap: Duration) -> Self {
        SessionWindows {
            gap_ms: millis(gap),
            grace_ms: 0,
        }
    }

    /// Keeps each session open `grace` longer, for producers known to write late.
    ///
    /// # Panics
    /// When `grace` is over `i64::MAX` ms.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace_ms = millis(grace);
        self
    }

    /// The inactivity gap, ms.
    pub fn gap_ms(&self) -> i64 {
        self.gap_ms
    }

    /// The grace, ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// When a session ending at `end` closes: `end + gap + 1 + grace`, ms.
    fn closes_at(&self, end: i64) -> i64 {
        end.saturating_add(self.gap_ms)
            .saturating_add(1)
            .saturating_add(self.grace_ms)
    }

    /// When a closed session ending at `end` can no longer be reached by a record that is not
    /// too late by its own time: `end + 2 gap + grace + 1`, ms.
    fn forgotten_at(&self, end: i64) -> i64 {
        self.closes_at(end).saturating_add(self.gap_ms)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("a duration of at most i64::MAX ms")
}

impl<K: Data, V: Data> Windowing<K, V> for SessionWindows {
    type Stream = SessionWindowedKStream<K, V>;

    fn windowed(self, grouped: KGroupedStream<K, V>) -> SessionWindowedKStream<K, V> {
        SessionWindowedKStream {
            grouped,
            windows: self,
            updates: false,
        }
    }
}

/// The sessions of one key (module docs): the open ones, start → (end, aggregate), and the end
/// of the latest closed one while a record in time could still reach it.
#[derive(Serialize, Deserialize)]
struct Open<K, A> {
    key: K,
    sessions: BTreeMap<i64, (i64, A)>,
    closed: Option<i64>,
}

/// The open sessions of one key as version 1 of the state encoding kept them.
#[derive(Serialize, Deserialize)]
struct OpenV1<K, A> {
    key: K,
    sessions: BTreeMap<i64, (i64, A)>,
}

/// The sessions in slot `slot` of the context's key.
fn load_open<K: Data, A: Data>(ctx: &mut Ctx<'_>, slot: &str) -> Result<Option<Open<K, A>>, Error> {
    ctx.load_upgraded(slot, |old: OpenV1<K, A>| Open {
        key: old.key,
        sessions: old.sessions,
        closed: None,
    })
}

impl<K, A> Open<K, A> {
    /// The state to store: none when no session is open and no closed one is remembered.
    fn kept(&self) -> Option<&Self> {
        (!self.sessions.is_empty() || self.closed.is_some()).then_some(self)
    }
}

/// A grouped stream in session windows (Kafka Streams' `SessionWindowedKStream`), from
/// [`KGroupedStream::windowed_by`] with [`SessionWindows`].
pub struct SessionWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SessionWindows,
    updates: bool,
}

impl<K: Data, V: Data> SessionWindowedKStream<K, V> {
    /// Emits each session's new value after every record, and a deletion (`new: None`) for
    /// each session merged into another, instead of final results (Kafka Streams' default,
    /// `EmitStrategy.onWindowUpdate`): nothing more is emitted when a session closes. Without
    /// it only final results are emitted, once per session (`EmitStrategy.onWindowClose`).
    pub fn emit_updates(mut self) -> Self {
        self.updates = true;
        self
    }

    /// The number of records per key and session.
    pub fn count(self) -> KTable<Windowed<K>, i64> {
        self.fold(
            "count",
            Some(Arc::new(|| 0)),
            |_k: &K, _v, n: Option<i64>| n.unwrap_or(0) + 1,
            |_k: &K, a, b| a + b,
        )
    }

    /// Per key and session, the records' values combined by `reducer`: the first value as it
    /// is; a record that joins sessions combines their values, the earlier first, then its
    /// own (Kafka Streams' `reduce`).
    pub fn reduce(
        self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, V> {
        let reducer = Arc::new(reducer);
        let merge = reducer.clone();
        self.fold(
            "reduce",
            None,
            move |_k, v, agg: Option<V>| match agg {
                Some(agg) => reducer(agg, v),
                None => v,
            },
            move |_k, a, b| merge(a, b),
        )
    }

    /// Per key and session, `initializer()` folded with `aggregator` over the records'
    /// values. As in Kafka Streams, a record starts from `initializer()`, merges every session
    /// it joins into it with `merger` (the earlier first), then is aggregated: with sessions
    /// `s1` and `s2` joined, `aggregator(v, merger(merger(initializer(), s1), s2))`.
    pub fn aggregate<A: Data>(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        merger: impl Fn(&K, A, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        let initializer = Arc::new(initializer);
        let first = initializer.clone();
        self.fold(
            "aggregate",
            Some(first),
            move |k, v, agg: Option<A>| aggregator(k, v, agg.unwrap_or_else(|| initializer())),
            merger,
        )
    }

    /// The session aggregation: `init` (none for `reduce`) is what merged sessions are merged
    /// into, `step` aggregates a record into what it joined (`None`: nothing, or nothing to
    /// start from), `merge` merges a session into the aggregate so far.
    fn fold<A: Data>(
        self,
        kind: &str,
        init: Option<Arc<dyn Fn() -> A + Send + Sync>>,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
        merge: impl Fn(&K, A, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        let SessionWindowedKStream {
            grouped,
            windows,
            updates,
        } = self;
        let what = format!(
            "session {kind} (gap {} ms, grace {} ms)",
            windows.gap_ms, windows.grace_ms
        );
        let (graph, node, input, name) = grouped.stateful_node(kind, what);
        let (out, freeze) = Outlet::<Windowed<K>, Change<A>>::new();
        let mut g = graph.borrow_mut();
        g.on_freeze(freeze);
        let late = g.late_route::<K, V>(node, name.clone());
        let children = out.children();
        let (timer_children, timer_slot) = (children.clone(), name.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                close(ctx, &timer_slot, windows, !updates, &timer_children)
            }),
        );
        drop(g);
        let slot = name;
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
            let t = ctx.timestamp;
            let watermark = ctx.watermark.unwrap_or(i64::MIN);
            let mut open: Open<K, A> = load_open(ctx, &slot)?.unwrap_or_else(|| Open {
                key: k.clone(),
                sessions: BTreeMap::new(),
                closed: None,
            });
            let joined: Vec<i64> = open
                .sessions
                .range(..=t.saturating_add(windows.gap_ms))
                .filter(|(_, (end, _))| end.saturating_add(windows.gap_ms) >= t)
                .map(|(start, _)| *start)
                .collect();
            let extends_closed = open
                .closed
                .is_some_and(|end| t.saturating_sub(windows.gap_ms) <= end);
            if extends_closed || (joined.is_empty() && windows.closes_at(t) <= watermark) {
                return late.take(ctx, k, v, (t, t));
            }
            // The merged session's aggregate: the joined sessions merged, the earlier first,
            // into the initial aggregate, then the record.
            let (mut start, mut end) = (t, t);
            let mut agg: Option<A> = if joined.is_empty() {
                None
            } else {
                init.as_ref().map(|init| init())
            };
            let mut removed = Vec::new();
            for s in joined {
                let (e, a) = open.sessions.remove(&s).expect("a joined session");
                agg = Some(match agg {
                    Some(acc) => merge(&k, acc, a.clone()),
                    None => a.clone(),
                });
                removed.push((s, e, a));
                (start, end) = (start.min(s), end.max(e));
            }
            let agg = step(&k, v, agg);
            open.sessions.insert(start, (end, agg.clone()));
            // The merged session's headers are the record's: forget the joined ones'.
            for (s, ..) in &removed {
                ctx.take_headers(&slot, s)?;
            }
            ctx.keep_headers(&slot, start)?;
            ctx.timers.push(windows.closes_at(end));
            if updates {
                // Each result carries its session's end as its timestamp (Kafka Streams').
                let mut same = None;
                for (s, e, a) in removed {
                    if (s, e) == (start, end) {
                        same = Some(a);
                        continue;
                    }
                    let gone = Windowed {
                        key: k.clone(),
                        start: s,
                        end: e,
                    };
                    forward_at(
                        &children,
                        ctx,
                        e,
                        gone,
                        Change {
                            old: Some(a),
                            new: None,
                        },
                    )?;
                }
                let key = Windowed {
                    key: k.clone(),
                    start,
                    end,
                };
                forward_at(
                    &children,
                    ctx,
                    end,
                    key,
                    Change {
                        old: same,
                        new: Some(agg),
                    },
                )?;
            }
            ctx.store(&slot, open.kept())
        }));
        KTable::new(graph, node, out)
    }
}

/// The timer of the context's key at time `ctx.timestamp`: closes every session in slot
/// `slot` that closes at or before it, in start order — forwards its final result with the
/// session's end as its timestamp when `finals` (not when every update was emitted already),
/// and drops it.
fn close<K: Data, A: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    windows: SessionWindows,
    finals: bool,
    children: &Children<Windowed<K>, Change<A>>,
) -> Result<(), Error> {
    let Some(mut open) = load_open::<K, A>(ctx, slot)? else {
        return Ok(());
    };
    let now = ctx.timestamp;
    let due: Vec<i64> = open
        .sessions
        .iter()
        .filter(|(_, (end, _))| windows.closes_at(*end) <= now)
        .map(|(start, _)| *start)
        .collect();
    if due.is_empty() && open.closed.is_none() {
        return Ok(());
    }
    let remembered = open.closed;
    for &start in &due {
        let end = open.sessions[&start].0;
        open.closed = Some(open.closed.map_or(end, |c| c.max(end)));
    }
    // Remembered while a record in time could still reach it (module docs): one not too late
    // by its own time, or one that joins an open session, which records in time can extend
    // back towards it.
    if let Some(end) = open.closed {
        let reachable = windows.forgotten_at(end) > now
            || open.sessions.keys().any(|start| !due.contains(start));
        if !reachable {
            open.closed = None;
        } else if open.closed != remembered && windows.forgotten_at(end) > now {
            ctx.timers.push(windows.forgotten_at(end));
        }
    }
    if due.is_empty() && open.closed == remembered {
        return Ok(());
    }
    for start in due {
        let (end, value) = open.sessions.remove(&start).expect("a due session");
        let headers = ctx.take_headers(slot, &start)?;
        if !finals {
            continue;
        }
        let key = Windowed {
            key: open.key.clone(),
            start,
            end,
        };
        forward_headed(
            children,
            ctx,
            (end, headers),
            key,
            Change {
                old: None,
                new: Some(value),
            },
        )?;
    }
    ctx.store(slot, open.kept())
}
