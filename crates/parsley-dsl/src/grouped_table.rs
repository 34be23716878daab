//! [`KGroupedTable`]: a table re-grouped by a new key (Kafka Streams' `KTable#groupBy`), and
//! its aggregations, which retract as well as add.
//!
//! A table's row can change or disappear, so an aggregation over a table must take its old
//! value back out of the group it was in before it adds the new one. `group_by` maps each
//! update's old and new rows to `(group, value)` pairs and sends the pairs through a
//! repartition topic, `{application}-{name}-repartition`, keyed by group:
//! - both rows in the same group: one record carrying both values (the aggregation calls the
//!   subtractor, then the adder, and emits once — KIP-904);
//! - otherwise a retraction of the old value to the old group, then the new value to the new
//!   group: two records, written in this order in the same transaction.
//!
//! The aggregation keeps one value per group in its stage's state with the latest timestamp of
//! what it folded. Per record: the subtractor takes the old value out of the aggregate when
//! both exist; then the adder folds the new value into what is left (or into the initial
//! aggregate); the result is stored and emitted, with the later of the record's and the
//! aggregate's timestamps (Kafka Streams' `KTableAggregate` and `KTableReduce`). A group whose
//! last row left keeps the aggregate the subtractor left (a count of `0`), as in Kafka
//! Streams.
//!
//! Exactly once: the retraction and the addition leave the re-grouping stage in one transaction
//! with its input offsets, and each is folded by the aggregating stage in a transaction with
//! its own, so a restart neither loses nor repeats one.
//!
//! Above `grouped` (its aggregations share the keyed input of a grouped stream) and `table`;
//! below `window`, `session` and `builder`: it imports nothing of theirs.

use std::sync::Arc;

use parsley_stage::store::StoreSpec;
use serde::{Deserialize, Serialize};

use crate::data::{Data, none_or_one};
use crate::flow::{Change, Ctx, Outlet, forward, forward_at};
use crate::grouped::KGroupedStream;
use crate::state::slot_reader;
use crate::stream::KStream;
use crate::table::KTable;

/// What crosses the repartition topic of a re-grouped table for one group: the value leaving
/// it and the value joining it (at least one present). Each is written as a list of none or
/// one value, so a value that is itself JSON `null` (a `()`, a `None`) stays apart from an
/// absent one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(bound = "V: Serialize + serde::de::DeserializeOwned")]
pub(crate) struct Regrouped<V> {
    #[serde(with = "none_or_one")]
    old: Option<V>,
    #[serde(with = "none_or_one")]
    new: Option<V>,
}

/// A table re-grouped by a new key (Kafka Streams' `KGroupedTable`), from [`KTable::group_by`]:
/// aggregate it with [`count`](KGroupedTable::count), [`reduce`](KGroupedTable::reduce) or
/// [`aggregate`](KGroupedTable::aggregate), each given how to take a value back out.
pub struct KGroupedTable<K, V> {
    grouped: KGroupedStream<K, Regrouped<V>>,
}

// A table's re-grouping: here, so that `table` knows nothing of grouped tables.
impl<K: Data, V: Data> KTable<K, V> {
    /// Re-groups the table's rows by the key `selector` gives, with the value it gives (Kafka
    /// Streams' `KTable#groupBy(KeyValueMapper)`), for an aggregation that adds each row's
    /// value to its group and takes it back out when the row changes or is deleted. Always
    /// repartitioned, through `{application}-{name}-repartition` (name it with
    /// [`KGroupedTable::named`], else the aggregation's name is used); its records are JSON.
    ///
    /// `KTable<K, V>` → `KGroupedTable<K2, V2>`. `selector` is called on the old and the new
    /// row of each update (module docs).
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("shop");
    /// // customer → city; customers per city, moving when a customer moves.
    /// builder
    ///     .table::<String, String>("customer-city")
    ///     .group_by(|_customer, city| (city.clone(), 1i64))
    ///     .named("customers-per-city")
    ///     .count()
    ///     .to_stream()
    ///     .to("city-sizes");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn group_by<K2: Data + PartialEq, V2: Data>(
        &self,
        selector: impl Fn(&K, &V) -> (K2, V2) + Send + Sync + 'static,
    ) -> KGroupedTable<K2, V2> {
        let mut g = self.graph.borrow_mut();
        let name = g.name("table-group-by", self.next_name().cloned());
        let node = g.add(name, "group by (table)".into(), &[self.node], false, true);
        let (out, freeze) = Outlet::<K2, Regrouped<V2>>::new();
        g.on_freeze(freeze);
        drop(g);
        let children = out.children();
        self.out
            .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, c: Change<V>| {
                let old = c.old.map(|v| selector(&k, &v));
                let new = c.new.map(|v| selector(&k, &v));
                match (old, new) {
                    (Some((from, old)), Some((to, new))) if from == to => forward(
                        &children,
                        ctx,
                        to,
                        Regrouped {
                            old: Some(old),
                            new: Some(new),
                        },
                    ),
                    (old, new) => {
                        if let Some((from, old)) = old {
                            let leaving = Regrouped {
                                old: Some(old),
                                new: None,
                            };
                            forward(&children, ctx, from, leaving)?;
                        }
                        if let Some((to, new)) = new {
                            let joining = Regrouped {
                                old: None,
                                new: Some(new),
                            };
                            forward(&children, ctx, to, joining)?;
                        }
                        Ok(())
                    }
                }
            }));
        let stream = KStream::new(self.graph.clone(), node, out, true);
        KGroupedTable {
            grouped: stream.group_by_key(),
        }
    }
}

impl<K: Data, V: Data> KGroupedTable<K, V> {
    /// Names the aggregation (Kafka Streams' `Grouped.as` and `Materialized.as` in one): its
    /// state slot, its repartition topic `{application}-{name}-repartition` and its line in
    /// `describe`.
    pub fn named(self, name: impl Into<String>) -> Self {
        KGroupedTable {
            grouped: self.grouped.named(name),
        }
    }

    /// The number of rows per group (Kafka Streams' `KGroupedTable#count`): a row joining
    /// adds one, a row leaving takes one away; a group left empty counts `0`.
    ///
    /// `KGroupedTable<K, V>` → `KTable<K, i64>`.
    pub fn count(self) -> KTable<K, i64> {
        self.aggregate(|| 0i64, |_, _, n| n + 1, |_, _, n| n - 1)
    }

    /// Per group, the rows' values combined by `adder(aggregate, value)`, a leaving value taken
    /// out by `subtractor(aggregate, value)` (Kafka Streams' `KGroupedTable#reduce`). A group's
    /// first value is its aggregate as it is.
    ///
    /// `KGroupedTable<K, V>` → `KTable<K, V>`.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("bank");
    /// // account → (branch, balance); the total balance per branch.
    /// builder
    ///     .table::<String, (String, i64)>("accounts")
    ///     .group_by(|_account, (branch, cents)| (branch.clone(), *cents))
    ///     .reduce(|total, cents| total + cents, |total, cents| total - cents)
    ///     .to_stream()
    ///     .to("branch-totals");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn reduce(
        self,
        adder: impl Fn(V, V) -> V + Send + Sync + 'static,
        subtractor: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> KTable<K, V> {
        self.fold("table-reduce", "reduce (table)", move |_k, agg, change| {
            let left = match (agg, change.old) {
                (Some(agg), Some(old)) => Some(subtractor(agg, old)),
                (agg, _) => agg,
            };
            match (left, change.new) {
                (Some(left), Some(new)) => Some(adder(left, new)),
                (None, Some(new)) => Some(new),
                (left, None) => left,
            }
        })
    }

    /// Per group, `initializer()` with each row's value folded in by `adder(group, value,
    /// aggregate)` and each leaving value taken out by `subtractor(group, value, aggregate)`
    /// (Kafka Streams' `KGroupedTable#aggregate`).
    ///
    /// `KGroupedTable<K, V>` → `KTable<K, A>`.
    pub fn aggregate<A: Data>(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        subtractor: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> KTable<K, A> {
        self.fold(
            "table-aggregate",
            "aggregate (table)",
            move |k, agg, change| {
                let left = match (agg, change.old) {
                    (Some(agg), Some(old)) => Some(subtractor(k, old, agg)),
                    (agg, _) => agg,
                };
                match change.new {
                    Some(new) => Some(adder(k, new, left.unwrap_or_else(&initializer))),
                    None => left,
                }
            },
        )
    }

    /// The aggregation's operator: `step` gives the new aggregate from the stored one and a
    /// record; it is stored and emitted with Kafka Streams' timestamp (module docs).
    fn fold<A: Data>(
        self,
        kind: &str,
        what: &str,
        step: impl Fn(&K, Option<A>, Regrouped<V>) -> Option<A> + Send + Sync + 'static,
    ) -> KTable<K, A> {
        let key_codec = self.grouped.key_codec();
        let (graph, node, input, slot) = self.grouped.stateful_node(kind, what.to_string());
        let (out, freeze) = Outlet::<K, Change<A>>::new();
        graph.borrow_mut().on_freeze(freeze);
        graph.borrow_mut().materialised(node);
        graph.borrow_mut().queryable(
            node,
            StoreSpec::new::<K, A>(slot.clone(), key_codec, slot_reader(slot.clone())),
        );
        let children = out.children();
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k, change| {
            let (old, at): (Option<A>, Option<i64>) = match ctx.load_timestamped(&slot)? {
                Some((old, at)) => (Some(old), at),
                None => (None, None),
            };
            // The record's timestamp, or the aggregate's when later and the record changed it.
            let t = at.map_or(ctx.timestamp, |at| at.max(ctx.timestamp));
            let new = step(&k, old.clone(), change);
            match &new {
                Some(new) => ctx.store_timestamped(&slot, Some(new), t)?,
                None => ctx.store::<A>(&slot, None)?,
            }
            if old.is_none() && new.is_none() {
                return Ok(());
            }
            forward_at(&children, ctx, t, k, Change { old, new })
        }));
        KTable::new(graph, node, out)
    }
}

#[cfg(test)]
mod tests {
    use super::Regrouped;

    #[test]
    fn a_value_that_is_json_null_crosses_the_repartition_apart_from_an_absent_one() {
        let joining: Regrouped<()> = Regrouped {
            old: None,
            new: Some(()),
        };
        let json = serde_json::to_string(&joining).unwrap();
        assert_eq!(json, r#"{"old":[],"new":[null]}"#);
        assert_eq!(
            serde_json::from_str::<Regrouped<()>>(&json).unwrap(),
            joining
        );
        let two = serde_json::from_str::<Regrouped<i64>>(r#"{"old":[1,2],"new":[]}"#);
        assert!(
            two.unwrap_err().to_string().contains("none or one value"),
            "more than one value is refused"
        );
    }
}
