//! Windowed stream–stream joins (Kafka Streams' `join(KStream, ValueJoiner, JoinWindows)`),
//! with buffers that expire by event time.
//!
//! Two records of the same key join when their event times are at most the windows' time
//! difference `d` apart. Each side's records wait in a per-key buffer in the stage's state;
//! each record joins the other side's buffered records at once, in their event-time order
//! (inner results are emitted eagerly, as in Kafka Streams), each result with the later of the
//! two records' timestamps. A record at `t` is **too late** when the watermark has
//! reached `t + d + grace + 1` as it arrives: every record that could still join it in time
//! would already have been handed over. A buffered record is **expired** when the watermark
//! reaches `t + 2d + grace + 1`: no record in time can join it any more. Then it leaves the
//! buffer — so a join's state does not grow forever — and, for a left or outer join, a record
//! that joined nothing gives its result with `None` for the other side, once, at that moment:
//! Kafka's evidence, not a timeout, decides that no partner is coming.
//!
//! Invariants: both inputs are co-partitioned by key (repartitioned first when an operator
//! changed a key); a buffered record is in its key's slot iff it arrived in time and has not
//! expired; a timer is set at each buffered record's expiry.
//!
//! Above `stream`, to which it adds the windowed joins; no operator module imports it.

use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::data::{Data, auto_codecs};
use crate::flow::{Children, Ctx, Outlet, forward_at, forward_headed};
use crate::stream::KStream;

/// The time difference within which two records join (Kafka Streams' `JoinWindows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinWindows {
    difference_ms: i64,
    grace_ms: i64,
}

impl JoinWindows {
    /// Records join when their event times are at most `difference` apart (no grace).
    ///
    /// # Panics
    /// When `difference` is over `i64::MAX` ms.
    pub fn of_time_difference(difference: Duration) -> Self {
        JoinWindows {
            difference_ms: millis(difference),
            grace_ms: 0,
        }
    }

    /// Keeps the windows open `grace` longer, for producers known to write late.
    ///
    /// # Panics
    /// When `grace` is over `i64::MAX` ms.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace_ms = millis(grace);
        self
    }

    /// When a record at `t` is too late to join: `t + d + grace + 1`, ms.
    fn late_at(&self, t: i64) -> i64 {
        t.saturating_add(self.difference_ms)
            .saturating_add(self.grace_ms)
            .saturating_add(1)
    }

    /// When a buffered record at `t` expires: `t + 2d + grace + 1`, ms.
    fn expires_at(&self, t: i64) -> i64 {
        self.late_at(t).saturating_add(self.difference_ms)
    }

    fn joins(&self, a: i64, b: i64) -> bool {
        a.abs_diff(b) <= self.difference_ms.unsigned_abs()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("a duration of at most i64::MAX ms")
}

/// Which results a join gives for records that joined nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inner,
    Left,
    Outer,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Inner => "join",
            Kind::Left => "left-join",
            Kind::Outer => "outer-join",
        }
    }
}

/// One buffered record.
#[derive(Clone, Serialize, Deserialize)]
struct Entry<T> {
    time: i64,
    value: T,
    joined: bool,
}

/// The buffers of one key.
#[derive(Serialize, Deserialize)]
struct Buffers<K, L, R> {
    key: K,
    left: Vec<Entry<L>>,
    right: Vec<Entry<R>>,
}

type Joiner<L, R, O> = Arc<dyn Fn(Option<&L>, Option<&R>) -> O + Send + Sync>;

impl<K: Data, V: Data> KStream<K, V> {
    /// Joins each record with every record of `other` with the same key whose event time is
    /// within `windows` of its own (inner join: only pairs give results, as soon as both are
    /// in). See the module docs of stream–stream joins for when a record is too late and when
    /// buffered records expire. Both streams are repartitioned first when an operator changed
    /// their key.
    pub fn join_windowed<V2: Data, R: Data>(
        &self,
        other: &KStream<K, V2>,
        windows: JoinWindows,
        joiner: impl Fn(&V, &V2) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_stream(other, windows, Kind::Inner, move |l, r| {
            joiner(l.expect("an inner pair"), r.expect("an inner pair"))
        })
    }

    /// [`KStream::join_windowed`], and each record of this stream that joined nothing gives
    /// `joiner(value, None)` once it expires (Kafka Streams' `leftJoin` with `JoinWindows`).
    pub fn left_join_windowed<V2: Data, R: Data>(
        &self,
        other: &KStream<K, V2>,
        windows: JoinWindows,
        joiner: impl Fn(&V, Option<&V2>) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_stream(other, windows, Kind::Left, move |l, r| {
            joiner(l.expect("a left record"), r)
        })
    }

    /// [`KStream::join_windowed`], and each record of either stream that joined nothing gives
    /// its result with `None` for the other side once it expires (`outerJoin`).
    pub fn outer_join_windowed<V2: Data, R: Data>(
        &self,
        other: &KStream<K, V2>,
        windows: JoinWindows,
        joiner: impl Fn(Option<&V>, Option<&V2>) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_stream(other, windows, Kind::Outer, joiner)
    }

    fn join_stream<V2: Data, R: Data>(
        &self,
        other: &KStream<K, V2>,
        windows: JoinWindows,
        kind: Kind,
        joiner: impl Fn(Option<&V>, Option<&V2>) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        let name = self
            .graph
            .borrow()
            .name(kind.name(), self.next_name.clone());
        let left = self.keyed_beside(&format!("{name}-left"), auto_codecs(), &[other.node]);
        let right = other.keyed_beside(&format!("{name}-right"), auto_codecs(), &[self.node]);
        let mut g = self.graph.borrow_mut();
        let what = format!(
            "{} streams within {} ms, grace {} ms",
            kind.name(),
            windows.difference_ms,
            windows.grace_ms
        );
        let node = g.add(name.clone(), what, &[left.node, right.node], true, true);
        let (out, freeze) = Outlet::<K, R>::new();
        g.on_freeze(freeze);
        let late_left = g.late_route::<K, V>(node, name.clone());
        let late_right = g.late_route::<K, V2>(node, name.clone());
        let joiner: Joiner<V, V2, R> = Arc::new(joiner);
        let children = out.children();
        let (slot, timer_children, timer_joiner) = (name.clone(), children.clone(), joiner.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                expire::<K, V, V2, R>(ctx, &slot, windows, kind, &timer_joiner, &timer_children)
            }),
        );
        drop(g);
        let (slot, left_children, left_joiner) = (name.clone(), children.clone(), joiner.clone());
        left.out
            .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
                let t = ctx.timestamp;
                if windows.late_at(t) <= ctx.watermark.unwrap_or(i64::MIN) {
                    let d = windows.difference_ms;
                    return late_left.take(ctx, k, v, (t.saturating_sub(d), t.saturating_add(d)));
                }
                let mut b = load::<K, V, V2>(ctx, &slot, &k)?;
                let mut joined = false;
                for r in by_time(&mut b.right, |r| windows.joins(t, r.time)) {
                    r.joined = true;
                    joined = true;
                    forward_at(
                        &left_children,
                        ctx,
                        t.max(r.time),
                        k.clone(),
                        left_joiner(Some(&v), Some(&r.value)),
                    )?;
                }
                if kind != Kind::Inner {
                    // Its result with nothing, if it comes to that, carries its headers.
                    let n = b.left.iter().filter(|e| e.time == t).count();
                    ctx.keep_headers(&slot, (0u8, t, n))?;
                }
                b.left.push(Entry {
                    time: t,
                    value: v,
                    joined,
                });
                ctx.timers.push(windows.expires_at(t));
                ctx.store(&slot, Some(&b))
            }));
        let slot = name;
        right
            .out
            .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V2| {
                let t = ctx.timestamp;
                if windows.late_at(t) <= ctx.watermark.unwrap_or(i64::MIN) {
                    let d = windows.difference_ms;
                    return late_right.take(ctx, k, v, (t.saturating_sub(d), t.saturating_add(d)));
                }
                let mut b = load::<K, V, V2>(ctx, &slot, &k)?;
                let mut joined = false;
                for l in by_time(&mut b.left, |l| windows.joins(t, l.time)) {
                    l.joined = true;
                    joined = true;
                    let (at, value) = (t.max(l.time), joiner(Some(&l.value), Some(&v)));
                    forward_at(&children, ctx, at, k.clone(), value)?;
                }
                if kind == Kind::Outer {
                    let n = b.right.iter().filter(|e| e.time == t).count();
                    ctx.keep_headers(&slot, (1u8, t, n))?;
                }
                b.right.push(Entry {
                    time: t,
                    value: v,
                    joined,
                });
                ctx.timers.push(windows.expires_at(t));
                ctx.store(&slot, Some(&b))
            }));
        KStream::new(self.graph.clone(), node, out, false)
    }
}

/// The buffered records of one side that `joins` takes, in event-time order (ties in arrival
/// order), as Kafka Streams' window store gives a record's partners.
fn by_time<T>(side: &mut [Entry<T>], joins: impl Fn(&Entry<T>) -> bool) -> Vec<&mut Entry<T>> {
    let mut partners: Vec<&mut Entry<T>> = side.iter_mut().filter(|e| joins(e)).collect();
    partners.sort_by_key(|e| e.time);
    partners
}

fn load<K: Data, L: Data, R: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    key: &K,
) -> Result<Buffers<K, L, R>, Error> {
    Ok(ctx.load(slot)?.unwrap_or_else(|| Buffers {
        key: key.clone(),
        left: Vec::new(),
        right: Vec::new(),
    }))
}

/// Each entry with its arrival number among the entries of its time: the part its headers
/// are kept under. Entries of one time are buffered in arrival order and expire together.
fn numbered<T>(entries: &[Entry<T>]) -> impl Iterator<Item = (&Entry<T>, usize)> {
    let mut seen: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    entries.iter().map(move |e| {
        let n = seen.entry(e.time).or_insert(0);
        *n += 1;
        (e, *n - 1)
    })
}

/// The timer of the context's key at `ctx.timestamp`: drops every buffered record that
/// expires at or before it, giving the results of those that joined nothing (left: the left
/// side's; outer: both sides'), in event-time order, left before right.
fn expire<K: Data, L: Data, R: Data, O: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    windows: JoinWindows,
    kind: Kind,
    joiner: &Joiner<L, R, O>,
    children: &Children<K, O>,
) -> Result<(), Error> {
    let Some(mut b) = ctx.load::<Buffers<K, L, R>>(slot)? else {
        return Ok(());
    };
    let now = ctx.timestamp;
    let (expired_left, left): (Vec<_>, Vec<_>) = std::mem::take(&mut b.left)
        .into_iter()
        .partition(|e| windows.expires_at(e.time) <= now);
    let (expired_right, right): (Vec<_>, Vec<_>) = std::mem::take(&mut b.right)
        .into_iter()
        .partition(|e| windows.expires_at(e.time) <= now);
    b.left = left;
    b.right = right;
    if kind != Kind::Inner {
        for (e, n) in numbered(&expired_left) {
            let headers = ctx.take_headers(slot, &(0u8, e.time, n))?;
            if !e.joined {
                let value = joiner(Some(&e.value), None);
                forward_headed(children, ctx, (e.time, headers), b.key.clone(), value)?;
            }
        }
    }
    if kind == Kind::Outer {
        for (e, n) in numbered(&expired_right) {
            let headers = ctx.take_headers(slot, &(1u8, e.time, n))?;
            if !e.joined {
                let value = joiner(None, Some(&e.value));
                forward_headed(children, ctx, (e.time, headers), b.key.clone(), value)?;
            }
        }
    }
    if expired_left.is_empty() && expired_right.is_empty() {
        return Ok(());
    }
    let rest = (!b.left.is_empty() || !b.right.is_empty()).then_some(&b);
    ctx.store(slot, rest)
}
