//! Foreign-key joins of two tables (Kafka Streams' `KTable#join(other, foreignKeyExtractor,
//! joiner)`, KIP-213): each row of the left table `K → V` is joined with the row of the right
//! table `FK → VR` whose key its value names, the two tables not co-partitioned.
//!
//! Kafka Streams' shape, in two stages that call each other through two internal topics:
//! - the left table's stage (keyed by `K`) sends, for each update of a row, **subscriptions**
//!   to `{application}-{name}-subscription-registration`, keyed by foreign key: "`K` now
//!   refers to you" to the new one, "`K` left you" to the old one when it changed, "`K` was
//!   deleted" when the row went;
//! - the right table's stage (keyed by `FK`, co-partitioned with that topic) keeps, per foreign
//!   key, the right row and the left keys subscribed to it. It **answers** each subscription
//!   with the right row to `{application}-{name}-subscription-response`, keyed by `K`, and
//!   answers every subscriber again when the right row changes;
//! - the left table's stage joins each answer with the row's current value and emits the
//!   result.
//!
//! **Which answer counts: versions, not hashes.** An answer can be overtaken: a row that moves
//! from foreign key `a` to `b` subscribes to `b` while an answer from `a` (to the old
//! subscription, or to an update of `a`'s right row) is still on its way, and the two right
//! stages write the response topic independently. Kafka Streams drops an answer whose hash of
//! the left value it was asked for differs from the hash of the current value; a value that
//! returns to an earlier one (or collides) lets a stale answer through. Here each left row has
//! a **version**, counted up at every update and kept in the left stage's state; a subscription
//! carries the version it was sent for, its answers carry it back, and an answer is joined only
//! when its version is the row's current one. So the result of a row always reflects its
//! current foreign key: after a foreign-key change no result from the old key follows one from
//! the new (their versions differ), a deletion gives exactly one tombstone (the answer to the
//! deletion's own version), and no null appears between the old and the new result (the old
//! key is told `DELETE_KEY_NO_PROPAGATE`, which is never answered).
//!
//! **What the stamps add.** The answer to a subscription is stamped by the right stage with a
//! clock that includes the subscription's, which includes the left update that sent it; the
//! left stage's gate delivers it only after that update, so an answer never arrives before the
//! version it answers exists in the left stage's state (a version from the future, which a
//! restore could otherwise make look current). The versions, the subscriptions, the right rows
//! and the answers all commit in the stages' transactions with their input offsets: a restart
//! neither loses nor repeats one.
//!
//! Kafka Streams' instructions, per update of the left row (old value, new value), with `fk` of
//! each (`None`: the extractor found no foreign key):
//! - inner join: a new row subscribes `PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE`; an update keeping
//!   its foreign key the same; one changing it tells the old key `DELETE_KEY_NO_PROPAGATE` and
//!   subscribes to the new one `PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE`; a deletion, or an
//!   update to no foreign key, tells the old key `DELETE_KEY_AND_PROPAGATE`;
//! - left join: the old key is told `DELETE_KEY_NO_PROPAGATE` when the key changed, then the
//!   new one `PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE`; a row with no foreign key (or deleted) is
//!   answered at once in its own stage, with no right row (Kafka Streams sends it through the
//!   topics with a null key and answers it the same way).
//!
//! Where Kafka Streams asks for no answer (a new row subscribing `PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE`,
//! an inner join's row with no foreign key), a result that still stands is corrected: the
//! subscription asks `PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE`, or the row is answered at once
//! with no right row. A result stands there only when the answer that deleted it was overtaken
//! (a row deleted and written again before the deletion's answer came back: that answer's
//! version is stale); processed record by record, as Kafka Streams' test driver does, the two
//! give the same records. Kafka Streams, whose stale hash drops that answer too, keeps the old
//! result.
//!
//! Timestamps as Kafka Streams': an answer to a subscription carries the later of the
//! subscription's and the right row's timestamps; an answer to a right-row update, the
//! update's; the result, its answer's.
//!
//! State: per left key, its version, its current value and its last result (kept after a
//! deletion, so versions never repeat: one small entry per left key ever seen); per foreign
//! key, the right row and its subscribers.
//!
//! Above `table` and `stream`; below `builder`: it imports nothing of the operators beside it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parsley_stage::{Auto, Codec, Error, Part};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::data::{Data, auto_codecs, none_or_one};
use crate::flow::{Change, Children, Ctx, Outlet, forward};
use crate::stream::KStream;
use crate::table::KTable;

/// What a subscription asks of the right stage (Kafka Streams' `SubscriptionWrapper.Instruction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Instruction {
    /// Forget the subscription; answer nothing (the row moved to another foreign key).
    DeleteKeyNoPropagate,
    /// Forget the subscription; answer with no right row (the row was deleted, or has no
    /// foreign key any more in an inner join).
    DeleteKeyAndPropagate,
    /// Subscribe; answer with the right row, or with none.
    PropagateNullIfNoFkValAvailable,
    /// Subscribe; answer only when there is a right row.
    PropagateOnlyIfFkValAvailable,
}

/// A record of the subscription topic, keyed by the foreign key (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "K: Serialize + DeserializeOwned")]
struct Subscription<K> {
    /// The left row's key.
    key: K,
    /// The left row's version it was sent for.
    version: u64,
    instruction: Instruction,
}

/// A record of the response topic, keyed by the left row's key (JSON): the version answered
/// and the right row (a list of none or one value, so a right value that is JSON `null`
/// stays apart from none).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "VR: Serialize + DeserializeOwned")]
struct Response<VR> {
    version: u64,
    #[serde(with = "none_or_one")]
    value: Option<VR>,
}

/// The left stage's state of one left key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "V: Serialize + DeserializeOwned, VO: Serialize + DeserializeOwned")]
struct Primary<V, VO> {
    /// Counted up at every update of the row.
    version: u64,
    /// The row's current value.
    row: Option<V>,
    /// The join's last result for the key.
    result: Option<VO>,
}

/// The right stage's state of one foreign key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "VR: Serialize + DeserializeOwned")]
struct Foreign<VR> {
    /// The right row and its timestamp, ms since the epoch.
    row: Option<(VR, i64)>,
    /// The subscribed left keys (as their repartition codec encodes them, so in Kafka Streams'
    /// prefix-scan order for string keys) and the version each subscribed with.
    subscribers: BTreeMap<Vec<u8>, u64>,
}

impl<VR> Default for Foreign<VR> {
    fn default() -> Self {
        Foreign {
            row: None,
            subscribers: BTreeMap::new(),
        }
    }
}

/// How a result is made from the left row and the right row (none when absent): `None` is a
/// tombstone.
type Joiner<V, VR, VO> = Arc<dyn Fn(&V, Option<&VR>) -> Option<VO> + Send + Sync>;

/// The foreign key a left value names, if any.
type Extractor<V, FK> = Arc<dyn Fn(&V) -> Option<FK> + Send + Sync>;

/// A foreign key's bytes, to compare keys as Kafka Streams does (serialized).
fn key_bytes<T: Data>(ctx: &Ctx<'_>, key: &T) -> Result<Vec<u8>, Error> {
    Codec::<T>::encode(&Auto, key).map_err(|e| ctx.encode_error("foreign-key join key", e))
}

/// Sends `value` keyed by `key` to `topic` with record timestamp `timestamp`.
fn send_at<K: Data, V: Data>(
    ctx: &mut Ctx<'_>,
    topic: &Arc<str>,
    timestamp: i64,
    key: K,
    value: V,
) -> Result<(), Error> {
    let before = std::mem::replace(&mut ctx.timestamp, timestamp);
    let sent = ctx.send_keyed(topic, &auto_codecs(), key, value);
    ctx.timestamp = before;
    sent
}

/// Joins an answer for `key` in the left stage: when `version` is the row's current one, the
/// result of the row and `right` is stored and emitted; a stale answer is dropped.
fn answer<K: Data, V: Data, VR: Data, VO: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    joiner: &Joiner<V, VR, VO>,
    out: &Children<K, Change<VO>>,
    key: K,
    version: u64,
    right: Option<VR>,
) -> Result<(), Error> {
    let Some(mut primary) = ctx.load::<Primary<V, VO>>(slot)? else {
        return Ok(());
    };
    if primary.version != version {
        return Ok(());
    }
    let result = primary
        .row
        .as_ref()
        .and_then(|row| joiner(row, right.as_ref()));
    let old = std::mem::replace(&mut primary.result, result.clone());
    ctx.store(slot, Some(&primary))?;
    forward(out, ctx, key, Change { old, new: result })
}

impl<K: Data, V: Data> KTable<K, V> {
    /// The inner join with `other` on a foreign key (Kafka Streams' `KTable#join(other,
    /// foreignKeyExtractor, joiner)`, KIP-213): for each row `K → V` whose `foreign_key(V)`
    /// names a row of `other`, `joiner(V, VR)`. The tables need not be co-partitioned: the
    /// join goes through two internal topics (module docs). A row whose foreign key is `None`
    /// has no result.
    ///
    /// `KTable<K, V>` × `KTable<FK, VR>` → `KTable<K, VO>`. Name it with [`KTable::named`]:
    /// the name names its state and its topics `{application}-{name}-subscription-registration`
    /// and `{application}-{name}-subscription-response`.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("shop");
    /// // order id → (customer id, amount); customer id → name.
    /// let orders = builder.table::<String, (String, i64)>("orders");
    /// let customers = builder.table::<String, String>("customers");
    /// orders
    ///     .named("order-customer")
    ///     .join_on_foreign_key(
    ///         &customers,
    ///         |(customer, _)| Some(customer.clone()),
    ///         |(_, amount), name| format!("{name}: {amount}"),
    ///     )
    ///     .to_change_stream()
    ///     .to("orders-with-names");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn join_on_foreign_key<FK: Data, VR: Data, VO: Data>(
        &self,
        other: &KTable<FK, VR>,
        foreign_key: impl Fn(&V) -> Option<FK> + Send + Sync + 'static,
        joiner: impl Fn(&V, &VR) -> VO + Send + Sync + 'static,
    ) -> KTable<K, VO> {
        let joiner: Joiner<V, VR, VO> = Arc::new(move |v, r| r.map(|r| joiner(v, r)));
        self.foreign_key_join(other, Arc::new(foreign_key), joiner, false)
    }

    /// The left join with `other` on a foreign key (Kafka Streams' `KTable#leftJoin(other,
    /// foreignKeyExtractor, joiner)`): a result for every row, `joiner(V, None)` when its
    /// foreign key is `None` or names no row of `other`. As
    /// [`join_on_foreign_key`](KTable::join_on_foreign_key) otherwise.
    ///
    /// `KTable<K, V>` × `KTable<FK, VR>` → `KTable<K, VO>`.
    pub fn left_join_on_foreign_key<FK: Data, VR: Data, VO: Data>(
        &self,
        other: &KTable<FK, VR>,
        foreign_key: impl Fn(&V) -> Option<FK> + Send + Sync + 'static,
        joiner: impl Fn(&V, Option<&VR>) -> VO + Send + Sync + 'static,
    ) -> KTable<K, VO> {
        let joiner: Joiner<V, VR, VO> = Arc::new(move |v, r| Some(joiner(v, r)));
        self.foreign_key_join(other, Arc::new(foreign_key), joiner, true)
    }

    fn foreign_key_join<FK: Data, VR: Data, VO: Data>(
        &self,
        other: &KTable<FK, VR>,
        foreign_key: Extractor<V, FK>,
        joiner: Joiner<V, VR, VO>,
        left: bool,
    ) -> KTable<K, VO> {
        let kind = if left { "fk-left-join" } else { "fk-join" };
        let g = self.graph.borrow();
        let name = g.name(kind, self.next_name().cloned());
        let app = g.app().to_string();
        let what = format!(
            "{kind} of {} with {} (foreign key)",
            g.node(self.node).name,
            g.node(other.node).name
        );
        let (left_name, right_name) = (
            g.node(self.node).name.clone(),
            g.node(other.node).name.clone(),
        );
        drop(g);
        let registration: Arc<str> = format!("{app}-{name}-subscription-registration").into();
        let response: Arc<str> = format!("{app}-{name}-subscription-response").into();
        let primary_slot: Arc<str> = name.clone().into();
        let foreign_slot: Arc<str> = format!("{name}-foreign").into();

        // The left stage: the subscribing operator, the response source beside it, the result.
        let mut g = self.graph.borrow_mut();
        let subscribe = g.add(
            format!("{name}-subscribe"),
            format!("foreign-key subscriptions to {registration}"),
            &[self.node],
            false,
            true,
        );
        g.add_sink(registration.to_string(), subscribe);
        drop(g);
        let answers = KStream::<K, Response<VR>>::source(
            &self.graph,
            response.to_string(),
            auto_codecs(),
            Some(format!("{name}-subscription-response")),
            Some(format!("{name}-subscription-response")),
        );
        let mut g = self.graph.borrow_mut();
        g.fuse(answers.node, self.node);
        let result = g.add(name.clone(), what, &[answers.node], true, true);
        let (out, freeze) = Outlet::<K, Change<VO>>::new();
        g.on_freeze(freeze);
        drop(g);
        let children = out.children();
        {
            let (slot, joiner, children) = (primary_slot.clone(), joiner.clone(), children.clone());
            answers
                .out
                .attach(Arc::new(move |ctx, key, r: Response<VR>| {
                    answer(ctx, &slot, &joiner, &children, key, r.version, r.value)
                }));
        }
        {
            let (slot, topic) = (primary_slot.clone(), registration.clone());
            self.out.attach(Arc::new(move |ctx, key: K, c: Change<V>| {
                if c.old.is_none() && c.new.is_none() {
                    return Ok(());
                }
                let mut primary = ctx.load::<Primary<V, VO>>(&slot)?.unwrap_or(Primary {
                    version: 0,
                    row: None,
                    result: None,
                });
                let had_result = primary.result.is_some();
                primary.version += 1;
                primary.row.clone_from(&c.new);
                let version = primary.version;
                ctx.store(&slot, Some(&primary))?;
                let old_fk = c.old.as_ref().and_then(|v| foreign_key(v));
                let new_fk = c.new.as_ref().and_then(|v| foreign_key(v));
                let changed = match (&old_fk, &new_fk) {
                    (Some(o), Some(n)) => key_bytes(ctx, o)? != key_bytes(ctx, n)?,
                    (None, None) => false,
                    _ => true,
                };
                let send = |ctx: &mut Ctx<'_>, fk: FK, instruction| {
                    let subscription = Subscription {
                        key: key.clone(),
                        version,
                        instruction,
                    };
                    ctx.send_keyed(&topic, &auto_codecs(), fk, subscription)
                };
                use Instruction::*;
                if left {
                    if let Some(o) = old_fk.filter(|_| changed) {
                        send(ctx, o, DeleteKeyNoPropagate)?;
                    }
                    match new_fk {
                        Some(n) => send(ctx, n, PropagateNullIfNoFkValAvailable),
                        // No foreign key: answered here, with no right row.
                        None => answer(ctx, &slot, &joiner, &children, key.clone(), version, None),
                    }
                } else {
                    // A foreign key of the new row implies a new row. Where Kafka Streams
                    // asks for no answer, a result still standing (its deletion's answer is
                    // overtaken by this update, whose version drops it) is corrected: answered
                    // with none, or asked to be (module docs).
                    match (old_fk, new_fk) {
                        (Some(o), Some(n)) if changed => {
                            send(ctx, o, DeleteKeyNoPropagate)?;
                            send(ctx, n, PropagateNullIfNoFkValAvailable)
                        }
                        (_, Some(n)) if had_result => send(ctx, n, PropagateNullIfNoFkValAvailable),
                        (_, Some(n)) => send(ctx, n, PropagateOnlyIfFkValAvailable),
                        (Some(o), None) => send(ctx, o, DeleteKeyAndPropagate),
                        (None, None) if had_result => {
                            answer(ctx, &slot, &joiner, &children, key.clone(), version, None)
                        }
                        (None, None) => Ok(()),
                    }
                }
            }));
        }

        // The right stage: the right rows with their subscribers, and the subscription source.
        let subscriptions = KStream::<FK, Subscription<K>>::source(
            &self.graph,
            registration.to_string(),
            auto_codecs(),
            Some(format!("{name}-subscription-registration")),
            Some(format!("{name}-subscription-registration")),
        );
        let mut g = self.graph.borrow_mut();
        g.fuse(subscriptions.node, other.node);
        let foreign = g.add(
            foreign_slot.to_string(),
            format!("subscribers of {right_name} for {left_name} --> {response}"),
            &[other.node, subscriptions.node],
            true,
            true,
        );
        g.add_sink(response.to_string(), foreign);
        g.add_internal(registration.to_string(), subscribe, subscriptions.node);
        g.add_internal(response.to_string(), foreign, answers.node);
        drop(g);
        {
            let (slot, topic) = (foreign_slot.clone(), response.clone());
            subscriptions
                .out
                .attach(Arc::new(move |ctx, _fk: FK, s: Subscription<K>| {
                    let mut foreign = ctx.load::<Foreign<VR>>(&slot)?.unwrap_or_default();
                    let subscriber = key_bytes(ctx, &s.key)?;
                    use Instruction::*;
                    match s.instruction {
                        DeleteKeyNoPropagate | DeleteKeyAndPropagate => {
                            foreign.subscribers.remove(&subscriber);
                        }
                        PropagateNullIfNoFkValAvailable | PropagateOnlyIfFkValAvailable => {
                            foreign.subscribers.insert(subscriber, s.version);
                        }
                    }
                    let keep = foreign.row.is_some() || !foreign.subscribers.is_empty();
                    ctx.store(&slot, keep.then_some(&foreign))?;
                    let at = foreign
                        .row
                        .as_ref()
                        .map_or(ctx.timestamp, |(_, at)| ctx.timestamp.max(*at));
                    let right = foreign.row.map(|(v, _)| v);
                    let value = match s.instruction {
                        DeleteKeyNoPropagate => return Ok(()),
                        DeleteKeyAndPropagate => None,
                        PropagateNullIfNoFkValAvailable => right,
                        PropagateOnlyIfFkValAvailable if right.is_none() => return Ok(()),
                        PropagateOnlyIfFkValAvailable => right,
                    };
                    let response = Response {
                        version: s.version,
                        value,
                    };
                    send_at(ctx, &topic, at, s.key, response)
                }));
        }
        {
            let (slot, topic) = (foreign_slot, response);
            other
                .out
                .attach(Arc::new(move |ctx, _fk: FK, c: Change<VR>| {
                    let mut foreign = ctx.load::<Foreign<VR>>(&slot)?.unwrap_or_default();
                    foreign.row = c.new.clone().map(|v| (v, ctx.timestamp));
                    let keep = foreign.row.is_some() || !foreign.subscribers.is_empty();
                    ctx.store(&slot, keep.then_some(&foreign))?;
                    let at = ctx.timestamp;
                    for (subscriber, version) in &foreign.subscribers {
                        let key: K = Codec::<K>::decode(&Auto, subscriber)
                            .map_err(|e| ctx.decode_error(Part::State, e))?;
                        let response = Response {
                            version: *version,
                            value: c.new.clone(),
                        };
                        send_at(ctx, &topic, at, key, response)?;
                    }
                    Ok(())
                }));
        }
        KTable::new(self.graph.clone(), result, out)
    }
}
