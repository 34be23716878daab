//! A scenario — an operator of the catalogue with its parameters, and an input script — and
//! what running it gives: the records of each output topic, rendered as text.
//!
//! Both sides read the same JSON: the Rust side serialises a [`Scenario`] as one line and the
//! Kafka Streams program parses it; the program answers with an [`Outcome`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One scenario: a topology of the catalogue and the records piped into it, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// The operator and its parameters.
    pub op: Op,
    /// Partitions of each input topic on Parsley's side (Kafka Streams' test driver has one
    /// partition per topic). Only operators without event time take more than one.
    #[serde(default = "one")]
    pub partitions: i32,
    /// The records, in the order they are piped.
    pub inputs: Vec<Input>,
}

fn one() -> i32 {
    1
}

/// One input record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    /// `left` or `right`.
    pub topic: String,
    /// The key, UTF-8; `None`: no key.
    pub key: Option<String>,
    /// The value, UTF-8; `None`: a tombstone.
    pub value: Option<String>,
    /// The record timestamp, ms since the epoch (`>= 0`).
    pub ts: i64,
}

/// One output record, rendered as text: a windowed key as `key@start/end`, a count in decimal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The key; `None`: no key.
    pub key: Option<String>,
    /// The value; `None`: a tombstone.
    pub value: Option<String>,
    /// The record timestamp, ms since the epoch.
    pub ts: i64,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "∅".into());
        write!(f, "{}={}@{}", part(&self.key), part(&self.value), self.ts)
    }
}

/// Every output topic's records, in order, by topic name.
pub type Outputs = BTreeMap<String, Vec<Output>>;

/// What running a scenario gave: the outputs, and the error that stopped it, if any (the
/// outputs then hold what was written before it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The records of every output topic; `None` when the topology could not run at all.
    pub outputs: Option<Outputs>,
    /// The error, as text.
    pub error: Option<String>,
}

/// How a grouped stream is keyed before an aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Grouping {
    /// `group_by_key()`: the record's own key.
    ByKey,
    /// `select_key(bucket)` then `group_by_key()`: through a repartition topic.
    SelectKey,
    /// `group_by(bucket)`: through a repartition topic.
    GroupBy,
}

/// Which aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum How {
    /// `count()`.
    Count,
    /// `reduce(plus)`.
    Reduce,
    /// `aggregate(|| "0", plus)` (sessions: merged with `a|b`).
    Aggregate,
}

/// Which join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinKind {
    /// `join`.
    Inner,
    /// `left_join`.
    Left,
    /// `outer_join`.
    Outer,
}

/// The operators of the catalogue (the topology each builds is in `catalogue.rs` and in the
/// Kafka Streams program's `Catalogue.java`). Durations are ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum Op {
    /// `filter(even)`, or `filter_not(even)`.
    Filter {
        /// `filter_not`.
        not: bool,
    },
    /// `map_values(tick)`.
    MapValues,
    /// `map_values_with_key(pair)`: `key/value`.
    MapValuesWithKey,
    /// `map`: key and value swapped.
    Map,
    /// `select_key`: the value becomes the key.
    SelectKey,
    /// `flat_map`: the record, then key and value swapped.
    FlatMap,
    /// `flat_map_values`: one record per character.
    FlatMapValues,
    /// `flat_map_values_with_key`: one record `key/character` per character.
    FlatMapValuesWithKey,
    /// `peek`.
    Peek,
    /// `foreach`: each record it is called with, rendered as an output topic `out` (with
    /// timestamp 0: the action sees only the key and value).
    Foreach,
    /// `left` merged with `right`.
    Merge,
    /// `split`: even values, values of one character, and the rest when `default`. Named: the
    /// split named `s-`, its branches as a map — the even values as `Branched::as_("even")`,
    /// the values of one character through `with_function(map_values(tick))`, the rest to a
    /// consumer named `rest` — each branch of the map written to `out-{its name}`.
    Split {
        /// `default_branch` rather than `no_default_branch`.
        default: bool,
        /// Named branches, returned as a map.
        #[serde(default)]
        named: bool,
    },
    /// `repartition()`.
    Repartition,
    /// `count()` of a grouped stream.
    Count {
        /// How the stream is grouped.
        group: Grouping,
        /// Whether the aggregation is named.
        #[serde(default)]
        named: bool,
    },
    /// `reduce(plus)` of a grouped stream.
    Reduce {
        /// How the stream is grouped.
        group: Grouping,
        /// Whether the aggregation is named.
        #[serde(default)]
        named: bool,
    },
    /// `aggregate(|| "0", plus)` of a grouped stream.
    Aggregate {
        /// How the stream is grouped.
        group: Grouping,
        /// Whether the aggregation is named.
        #[serde(default)]
        named: bool,
    },
    /// `process` with a handler counting each key's records.
    Process,
    /// A stream–table join of `left` with the table of `right`.
    Join {
        /// `left_join` rather than `join`.
        left: bool,
        /// The stream re-keyed by `bucket` first (through a repartition topic).
        rekey: bool,
    },
    /// A time-windowed aggregation.
    Windowed {
        /// Which aggregation.
        how: How,
        /// Window size.
        size: i64,
        /// Advance (the size: tumbling).
        advance: i64,
        /// Grace.
        grace: i64,
        /// `emit_updates()` (Kafka Streams' default); else final results only (Kafka Streams'
        /// `EmitStrategy.onWindowClose()`).
        updates: bool,
    },
    /// A sliding-windowed aggregation (`SlidingWindows`), keyed as a time window of size
    /// `difference`.
    Sliding {
        /// Which aggregation.
        how: How,
        /// The time difference.
        difference: i64,
        /// Grace.
        grace: i64,
        /// `emit_updates()` (Kafka Streams' default); else final results only.
        updates: bool,
        /// The retention of Kafka Streams' window store, ms, when not its default (set by a
        /// normalisation; Parsley keeps windows as long as a record can read them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retention: Option<i64>,
    },
    /// A session-windowed aggregation.
    Session {
        /// Which aggregation.
        how: How,
        /// Inactivity gap.
        gap: i64,
        /// Grace.
        grace: i64,
        /// `emit_updates()`; else final results only.
        updates: bool,
    },
    /// A windowed stream–stream join of `left` and `right`.
    JoinWindowed {
        /// Which join.
        kind: JoinKind,
        /// The time difference.
        difference: i64,
        /// Grace.
        grace: i64,
    },
    /// The table of `left`, as a stream.
    Table {
        /// `to_change_stream()` (Kafka Streams' `toStream()`); else `to_stream()` (`toStream()`
        /// without deletions).
        change: bool,
        /// Kafka Streams' table materialized in a store (Parsley's always is).
        #[serde(default)]
        materialized: bool,
    },
    /// `left` and `right` grouped by key and cogrouped: `plus` of each `left` value, `plus` of
    /// each `right` value's `tick`, aggregated from `0`, as a stream.
    Cogroup,
    /// `left` as a stream made a table (`to_table`), as a change stream.
    ToTable,
    /// The table of `left` re-grouped by `bucket` of its value (`KTable::group_by`), then
    /// `count()`, `reduce(plus, minus)` or `aggregate(|| "0", plus, minus)`, as a stream.
    TableGroupBy {
        /// Which aggregation.
        how: How,
    },
    /// The table of `left` filtered by `even`, as a change stream.
    TableFilter {
        /// `filter_not`.
        not: bool,
    },
    /// The table of `left` with values mapped by `tick`, as a change stream.
    TableMapValues,
    /// The table of `left` with values mapped by `pair` of key and value, as a change stream.
    TableMapValuesWithKey,
    /// The tables of `left` and `right` joined, as a change stream.
    TableJoin {
        /// Which join.
        kind: JoinKind,
    },
    /// The table of `left` joined on a foreign key with the table of `right`
    /// (`join_on_foreign_key`): the row of `right` whose key `foreign_key` of a `left` value
    /// names, joined by `pair`, as a change stream.
    FkJoin {
        /// `left_join_on_foreign_key` rather than `join_on_foreign_key`.
        left: bool,
    },
    /// The stream of `left` joined with the global table of `right` (`join_global`) on the
    /// key `foreign_key` of its value names (none: no row), by `pair`.
    GlobalJoin {
        /// `left_join_global` rather than `join_global`.
        left: bool,
    },
    /// The stream of `left` joined with the versioned table of `right` (`Consumed::versioned`,
    /// Kafka Streams' `persistentVersionedKeyValueStore`) as of each record's timestamp, by
    /// `pair`: `join_with`/`left_join_with`, held for a grace period when it has one
    /// (`Joined::with_grace_period`).
    VersionedJoin {
        /// `left_join_with` rather than `join_with`.
        left: bool,
        /// The table's history retention.
        retention: i64,
        /// The join's grace period.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace: Option<i64>,
    },
    /// The table of `left` suppressed until a time limit (`suppress(Suppressed::
    /// until_time_limit(limit_ms))`, Kafka Streams' `untilTimeLimit` with an unbounded
    /// buffer), as a change stream.
    Suppress {
        /// The limit, ms of event time.
        limit_ms: i64,
    },
}

impl Op {
    /// The operator as the report names it (Parsley's method).
    pub fn row(&self) -> &'static str {
        match self {
            Op::Filter { not: false } => "filter",
            Op::Filter { not: true } => "filter_not",
            Op::MapValues => "map_values",
            Op::MapValuesWithKey => "map_values_with_key",
            Op::Map => "map",
            Op::SelectKey => "select_key",
            Op::FlatMap => "flat_map",
            Op::FlatMapValues => "flat_map_values",
            Op::FlatMapValuesWithKey => "flat_map_values_with_key",
            Op::Peek => "peek",
            Op::Foreach => "foreach",
            Op::Merge => "merge",
            Op::Split { named: false, .. } => "split",
            Op::Split { named: true, .. } => "split (named)",
            Op::Repartition => "repartition",
            Op::Count { .. } => "count",
            Op::Reduce { .. } => "reduce",
            Op::Aggregate { .. } => "aggregate",
            Op::Process => "process",
            Op::Join { left: false, .. } => "join (stream-table)",
            Op::Join { left: true, .. } => "left_join (stream-table)",
            Op::Windowed {
                how: How::Count, ..
            } => "windowed count",
            Op::Windowed {
                how: How::Reduce, ..
            } => "windowed reduce",
            Op::Windowed {
                how: How::Aggregate,
                ..
            } => "windowed aggregate",
            Op::Sliding {
                how: How::Count, ..
            } => "sliding count",
            Op::Sliding {
                how: How::Reduce, ..
            } => "sliding reduce",
            Op::Sliding {
                how: How::Aggregate,
                ..
            } => "sliding aggregate",
            Op::Session {
                how: How::Count, ..
            } => "session count",
            Op::Session {
                how: How::Reduce, ..
            } => "session reduce",
            Op::Session {
                how: How::Aggregate,
                ..
            } => "session aggregate",
            Op::JoinWindowed {
                kind: JoinKind::Inner,
                ..
            } => "join_windowed",
            Op::JoinWindowed {
                kind: JoinKind::Left,
                ..
            } => "left_join_windowed",
            Op::JoinWindowed {
                kind: JoinKind::Outer,
                ..
            } => "outer_join_windowed",
            Op::Table { .. } => "table",
            Op::ToTable => "to_table",
            Op::TableGroupBy { how: How::Count } => "table group_by count",
            Op::TableGroupBy { how: How::Reduce } => "table group_by reduce",
            Op::TableGroupBy {
                how: How::Aggregate,
            } => "table group_by aggregate",
            Op::Cogroup => "cogroup",
            Op::TableFilter { not: false } => "table filter",
            Op::TableFilter { not: true } => "table filter_not",
            Op::TableMapValues => "table map_values",
            Op::TableMapValuesWithKey => "table map_values_with_key",
            Op::TableJoin {
                kind: JoinKind::Inner,
            } => "table join",
            Op::TableJoin {
                kind: JoinKind::Left,
            } => "table left_join",
            Op::TableJoin {
                kind: JoinKind::Outer,
            } => "table outer_join",
            Op::FkJoin { left: false } => "table join_on_foreign_key",
            Op::FkJoin { left: true } => "table left_join_on_foreign_key",
            Op::Suppress { .. } => "table suppress",
            Op::GlobalJoin { left: false } => "join_global",
            Op::GlobalJoin { left: true } => "left_join_global",
            Op::VersionedJoin {
                left: false,
                grace: None,
                ..
            } => "join (versioned table)",
            Op::VersionedJoin {
                left: true,
                grace: None,
                ..
            } => "left_join (versioned table)",
            Op::VersionedJoin {
                left: false,
                grace: Some(_),
                ..
            } => "join_with (versioned table, grace)",
            Op::VersionedJoin {
                left: true,
                grace: Some(_),
                ..
            } => "left_join_with (versioned table, grace)",
        }
    }

    /// Whether the operator reads `right` too.
    pub fn reads_right(&self) -> bool {
        matches!(
            self,
            Op::Merge
                | Op::Cogroup
                | Op::Join { .. }
                | Op::JoinWindowed { .. }
                | Op::TableJoin { .. }
                | Op::FkJoin { .. }
                | Op::GlobalJoin { .. }
                | Op::VersionedJoin { .. }
        )
    }

    /// Whether the operator orders by event time (its scenarios keep one partition: Kafka
    /// Streams' test driver has one task, whose stream time spans every key, where a real
    /// application has one per partition).
    pub fn event_time(&self) -> bool {
        matches!(
            self,
            Op::Windowed { .. }
                | Op::Sliding { .. }
                | Op::Session { .. }
                | Op::JoinWindowed { .. }
                | Op::Suppress { .. }
        )
    }

    /// Whether the operator's scenarios keep one partition: it orders by event time, or it
    /// keeps a time observed over all of a task's records (a versioned table's, a grace
    /// buffer's) — Kafka Streams' test driver has one task, where Parsley would have one per
    /// partition.
    pub fn one_task(&self) -> bool {
        self.event_time() || matches!(self, Op::VersionedJoin { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_is_the_json_the_kafka_streams_program_reads() {
        let s = Scenario {
            op: Op::Windowed {
                how: How::Count,
                size: 10,
                advance: 5,
                grace: 0,
                updates: false,
            },
            partitions: 1,
            inputs: vec![Input {
                topic: "left".into(),
                key: Some("a".into()),
                value: None,
                ts: 3,
            }],
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"op":{"name":"windowed","how":"count","size":10,"advance":5,"grace":0,"updates":false},"partitions":1,"inputs":[{"topic":"left","key":"a","value":null,"ts":3}]}"#
        );
        assert_eq!(serde_json::from_str::<Scenario>(&json).unwrap(), s);
        let unit: Scenario =
            serde_json::from_str(r#"{"op":{"name":"map-values"},"inputs":[]}"#).unwrap();
        assert_eq!((unit.op, unit.partitions), (Op::MapValues, 1));
    }
}
