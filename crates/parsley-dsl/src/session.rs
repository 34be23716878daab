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
//! Invariants:
//! - Per key, the operator's slot holds the key and every open session by start; open sessions
//!   of one key are more than `gap` apart.
//! - A timer is set at a session's closing time whenever its end moves; a timer closes the
//!   sessions that close at or before its time (a session whose end moved since has a later
//!   timer of its own).
//! - A record that merges with no open session and whose own session would already be closed
//!   is too late: counted and routed by the late policy, never dropped silently.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::builder::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward};
use crate::grouped::KGroupedStream;
use crate::table::KTable;
use crate::window::{LateRoute, Windowed, Windowing};

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

/// The open sessions of one key: start → (end, aggregate).
#[derive(Serialize, Deserialize)]
struct Open<K, A> {
    key: K,
    sessions: BTreeMap<i64, (i64, A)>,
}

/// A grouped stream in session windows (Kafka Streams' `SessionWindowedKStream`), from
/// [`KGroupedStream::windowed_by`] with [`SessionWindows`].
pub struct SessionWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SessionWindows,
    updates: bool,
}

impl<K: Data, V: Data> SessionWindowedKStream<K, V> {
    /// Also emits each session's new value after every record, and a deletion (`new: None`)
    /// for each session merged into another, before the final results. Without it only final
    /// results are emitted, once per session.
    pub fn emit_updates(mut self) -> Self {
        self.updates = true;
        self
    }

    /// The number of records per key and session.
    pub fn count(self) -> KTable<Windowed<K>, i64> {
        self.fold(
            "count",
            |_k: &K, _v, n: Option<i64>| n.unwrap_or(0) + 1,
            |_k: &K, a, b| a + b,
        )
    }

    /// Per key and session, the records' values combined by `reducer` (sessions merged by
    /// it too, the earlier first).
    pub fn reduce(
        self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, V> {
        let reducer = Arc::new(reducer);
        let merge = reducer.clone();
        self.fold(
            "reduce",
            move |_k, v, agg: Option<V>| match agg {
                Some(agg) => reducer(agg, v),
                None => v,
            },
            move |_k, a, b| merge(a, b),
        )
    }

    /// Per key and session, `initializer()` folded with `aggregator` over the records'
    /// values; two sessions a record joins are combined by `merger` (the earlier first).
    pub fn aggregate<A: Data>(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        merger: impl Fn(&K, A, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        self.fold(
            "aggregate",
            move |k, v, agg: Option<A>| aggregator(k, v, agg.unwrap_or_else(&initializer)),
            merger,
        )
    }

    fn fold<A: Data>(
        self,
        kind: &str,
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
        let late = LateRoute::<K, V>::new(&mut g, node, name.clone());
        let children = out.children();
        let (timer_children, timer_slot) = (children.clone(), name.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| close(ctx, &timer_slot, windows, &timer_children)),
        );
        drop(g);
        let slot = name;
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
            let t = ctx.timestamp;
            let watermark = ctx.watermark.unwrap_or(i64::MIN);
            let mut open: Open<K, A> = ctx.load(&slot)?.unwrap_or_else(|| Open {
                key: k.clone(),
                sessions: BTreeMap::new(),
            });
            let joined: Vec<i64> = open
                .sessions
                .range(..=t.saturating_add(windows.gap_ms))
                .filter(|(_, (end, _))| end.saturating_add(windows.gap_ms) >= t)
                .map(|(start, _)| *start)
                .collect();
            if joined.is_empty() && windows.closes_at(t) <= watermark {
                return late.take(ctx, k, v, (t, t));
            }
            // The merged session's aggregate, in time order: the sessions before the record,
            // the record, the sessions after it.
            let (mut start, mut end, mut agg, mut value) = (t, t, None::<A>, Some(v));
            let mut removed = Vec::new();
            for s in joined {
                let (e, a) = open.sessions.remove(&s).expect("a joined session");
                if s > t
                    && let Some(v) = value.take()
                {
                    agg = Some(step(&k, v, agg));
                }
                agg = Some(match agg {
                    Some(acc) => merge(&k, acc, a.clone()),
                    None => a.clone(),
                });
                removed.push((s, e, a));
                (start, end) = (start.min(s), end.max(e));
            }
            if let Some(v) = value {
                agg = Some(step(&k, v, agg));
            }
            let agg = agg.expect("a session has an aggregate");
            open.sessions.insert(start, (end, agg.clone()));
            ctx.timers.push(windows.closes_at(end));
            if updates {
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
                    forward(
                        &children,
                        ctx,
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
                forward(
                    &children,
                    ctx,
                    key,
                    Change {
                        old: same,
                        new: Some(agg),
                    },
                )?;
            }
            ctx.store(&slot, Some(&open))
        }));
        KTable::new(graph, node, out)
    }
}

/// The timer of the context's key at time `ctx.timestamp`: closes every session in slot
/// `slot` that closes at or before it, in start order — forwards its final result and drops
/// it.
fn close<K: Data, A: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    windows: SessionWindows,
    children: &Children<Windowed<K>, Change<A>>,
) -> Result<(), Error> {
    let Some(mut open) = ctx.load::<Open<K, A>>(slot)? else {
        return Ok(());
    };
    let now = ctx.timestamp;
    let due: Vec<i64> = open
        .sessions
        .iter()
        .filter(|(_, (end, _))| windows.closes_at(*end) <= now)
        .map(|(start, _)| *start)
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    for start in due {
        let (end, value) = open.sessions.remove(&start).expect("a due session");
        let key = Windowed {
            key: open.key.clone(),
            start,
            end,
        };
        forward(
            children,
            ctx,
            key,
            Change {
                old: None,
                new: Some(value),
            },
        )?;
    }
    let rest = (!open.sessions.is_empty()).then_some(&open);
    ctx.store(slot, rest)
}
