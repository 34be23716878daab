//! [`KTable::suppress`]: a table's updates rate-limited by event time (Kafka Streams'
//! `KTable#suppress(Suppressed.untilTimeLimit(..))`).
//!
//! Per key, the first update after an emission opens a buffer at its timestamp `t` (ms since
//! the epoch); later updates replace the buffered value and keep `t`. The buffered update is
//! emitted once when the stage's event-time watermark reaches `t + limit` — as a change from
//! the value before the buffer opened to the latest one, with the latest update's timestamp
//! — and the buffer is emptied. A deletion is buffered like any update and emitted as one.
//!
//! Kafka Streams measures the limit in its processor's stream time (the largest timestamp it
//! has seen) and evicts after buffering the record that moved it; Parsley measures it in the
//! stage's watermark, which passes a time only once Kafka's evidence shows every record before
//! it was handed over — on a quiet input, the built-in clock of the stage's `EventTimeOrder`
//! moves it — and a timer fires before the records after its time are delivered. So where one
//! record both moves time past a buffer's limit and updates that key, Kafka Streams emits the
//! new value once and Parsley emits the buffered one, then buffers the new one.
//!
//! Invariants: a key's slot holds its open buffer, or nothing; a key with an open buffer has a
//! timer at `t + limit` or an emission at once (a limit the watermark has passed already). A
//! limit at the watermark is left to the timer, which fires after the records at that time:
//! buffers due together are emitted in (time, key) order, as Kafka Streams evicts them.
//!
//! The buffer is the stage's state, in its changelog: it is unbounded (Kafka Streams'
//! `BufferConfig.unbounded()`); a restart emits what was buffered at the same watermark.
//!
//! Above `table`; below `builder`: it imports nothing of the operators beside it.

use std::sync::Arc;
use std::time::Duration;

use parsley_stage::Error;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::data::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward_headed};
use crate::table::KTable;

/// How [`KTable::suppress`] holds a table's updates back (Kafka Streams' `Suppressed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppressed {
    limit_ms: i64,
}

impl Suppressed {
    /// Each key's updates held until the watermark is `limit` past the first of them, then
    /// the latest emitted (Kafka Streams' `Suppressed.untilTimeLimit(limit,
    /// BufferConfig.unbounded())`).
    ///
    /// # Panics
    /// When `limit` is over `i64::MAX` ms.
    pub fn until_time_limit(limit: Duration) -> Self {
        Suppressed {
            limit_ms: i64::try_from(limit.as_millis()).expect("a limit of at most i64::MAX ms"),
        }
    }
}

/// A key's open buffer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "K: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned")]
struct Buffered<K, V> {
    key: K,
    /// The timestamp of the update that opened it, ms since the epoch.
    since: i64,
    /// The value before it opened.
    prior: Option<V>,
    /// The latest value.
    latest: Option<V>,
    /// The latest update's timestamp, ms since the epoch.
    at: i64,
}

/// Emits the buffer in `slot` of the context's key and empties it.
fn emit<K: Data, V: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    buffered: Buffered<K, V>,
    children: &Children<K, Change<V>>,
) -> Result<(), Error> {
    ctx.store::<Buffered<K, V>>(slot, None)?;
    let headers = ctx.take_headers(slot, &())?;
    let change = Change {
        old: buffered.prior,
        new: buffered.latest,
    };
    forward_headed(children, ctx, (buffered.at, headers), buffered.key, change)
}

impl<K: Data, V: Data> KTable<K, V> {
    /// The table with each key's updates held back and emitted as `suppressed` says (Kafka
    /// Streams' `KTable#suppress`; module docs): a rate limit on the changes a table sends
    /// on, measured in event time. The stage orders by event time.
    ///
    /// `KTable<K, V>` → `KTable<K, V>`.
    ///
    /// ```
    /// # use parsley_dsl::{StreamsBuilder, Suppressed};
    /// # use std::time::Duration;
    /// let builder = StreamsBuilder::new("shop");
    /// // At most one stock level per item every minute of event time.
    /// builder
    ///     .table::<String, i64>("stock")
    ///     .suppress(Suppressed::until_time_limit(Duration::from_secs(60)))
    ///     .to_change_stream()
    ///     .to("stock-per-minute");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn suppress(&self, suppressed: Suppressed) -> KTable<K, V> {
        let limit = suppressed.limit_ms;
        let mut g = self.graph.borrow_mut();
        let name = g.name("suppress", self.next_name().cloned());
        let what = format!("suppress updates until {limit} ms of event time");
        let node = g.add(name.clone(), what, &[self.node], true, true);
        let (out, freeze) = Outlet::<K, Change<V>>::new();
        g.on_freeze(freeze);
        let children = out.children();
        let (timer_children, timer_slot) = (children.clone(), name.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                let Some(buffered) = ctx.load::<Buffered<K, V>>(&timer_slot)? else {
                    return Ok(());
                };
                if buffered.since.saturating_add(limit) > ctx.timestamp {
                    return Ok(()); // another key's timer, or one set before an emission
                }
                emit(ctx, &timer_slot, buffered, &timer_children)
            }),
        );
        drop(g);
        let slot = name;
        self.out
            .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, c: Change<V>| {
                let at = ctx.timestamp;
                let (buffered, opened) = match ctx.load::<Buffered<K, V>>(&slot)? {
                    Some(open) => (
                        Buffered {
                            latest: c.new,
                            at,
                            ..open
                        },
                        false,
                    ),
                    None => (
                        Buffered {
                            key: k,
                            since: at,
                            prior: c.old,
                            latest: c.new,
                            at,
                        },
                        true,
                    ),
                };
                // The buffer's headers are its latest update's.
                ctx.keep_headers(&slot, ())?;
                let due = buffered.since.saturating_add(limit);
                if ctx.watermark.is_some_and(|w| due < w) {
                    // The watermark has passed the limit already: its timers have fired.
                    return emit(ctx, &slot, buffered, &children);
                }
                // A limit at the watermark: the key's timer (set now, or still pending) fires
                // after the records at that time, with the other keys' in key order.
                ctx.store(&slot, Some(&buffered))?;
                if opened {
                    ctx.timers.push(due);
                }
                Ok(())
            }));
        KTable::new(self.graph.clone(), node, out)
    }
}
