//! The documented differences between Parsley and Kafka Streams, each a named normalisation
//! in one place, with the section of the book that says what differs and why.
//!
//! A normalisation applies to the scenarios of some operators. It may give Kafka Streams
//! another script to run (the difference lies in what each side makes of some input records),
//! then rewrites the outputs of one side or both so that the documented difference no longer
//! shows. A scenario whose outputs are equal only after normalising is a *documented
//! difference*, and the report names the normalisations that changed something. Every other
//! difference is a bug.
//!
//! Each rewrite is as narrow as the difference: it touches only the records the difference
//! makes (a tombstone for a key that holds nothing, the results of a record without a key, a
//! left join's result for a record that found no partner), so that any other difference still
//! shows.

use std::collections::BTreeMap;

use crate::scenario::{Input, Op, Output, Outputs, Scenario};

/// What a normalisation rewrites: both sides' outputs of one scenario.
pub struct Pair<'a, 'r> {
    /// The scenario as Parsley ran it.
    pub scenario: &'a Scenario,
    /// The scenario as Kafka Streams ran it (its script rewritten by the normalisations that
    /// give it another).
    pub reference: &'a Scenario,
    /// Kafka Streams' outputs.
    pub kafka_streams: &'a mut Outputs,
    /// Parsley's outputs.
    pub parsley: &'a mut Outputs,
    /// Runs another scenario through Kafka Streams.
    pub rerun: &'a mut Rerun<'r>,
}

impl Pair<'_, '_> {
    /// Both sides' outputs, for a rewrite that is the same on each.
    fn both(&mut self) -> [&mut Outputs; 2] {
        [&mut *self.kafka_streams, &mut *self.parsley]
    }
}

/// Runs a scenario through Kafka Streams, for a normalisation that needs another run of the
/// reference: its outputs, `None` when it failed.
pub type Rerun<'a> = dyn FnMut(&Scenario) -> Option<Outputs> + 'a;

/// A rewrite of Kafka Streams' script: the scenario, and the script so far.
pub type ScriptRewrite = fn(&Scenario, Vec<Input>) -> Vec<Input>;

/// Sessions per key, as the rule of closed sessions tracks them: the open ones `(start, end)`
/// and the end of the latest closed one while it can be reached.
type SessionsByKey = BTreeMap<Option<String>, (Vec<(i64, i64)>, Option<i64>)>;

/// One documented difference.
pub struct Normalisation {
    /// Its name, as the report prints it.
    pub name: &'static str,
    /// The book's section that documents it: a file under `book/src/` and a heading's anchor.
    pub book: &'static str,
    /// Whether it applies to a scenario.
    pub applies: fn(&Scenario) -> bool,
    /// The script both sides run instead, when the difference is one of timing that a record
    /// at the end makes good (both run it, their outputs compared then).
    pub script: Option<fn(&Scenario) -> Vec<Input>>,
    /// The script Kafka Streams runs instead (given the script it runs so far), when the
    /// difference lies in what the two make of some input records.
    pub reference_script: Option<ScriptRewrite>,
    /// The operator Kafka Streams runs instead, when a defect of the reference is made good by
    /// another parameter.
    pub reference_op: Option<fn(&Op) -> Op>,
    /// Rewrites the outputs of a scenario it applies to.
    pub apply: fn(&mut Pair<'_, '_>),
}

/// The key a record without one is given in Kafka Streams' script by [`keyless_records`]: no
/// generated key looks like it.
pub const KEYLESS: &str = "~keyless";

/// Every normalisation, in the order they are applied.
pub fn all() -> Vec<Normalisation> {
    vec![
        session_store_defect(),
        join_store_retention(),
        sliding_store_retention(),
        empty_foreign_values(),
        keyless_records(),
        keyless_records_at_a_versioned_join(),
        suppressed_deletions_of_nothing(),
        suppress_evicts_before_later_records(),
        valueless_records(),
        late_join_records(),
        records_extending_closed_sessions(),
        redundant_tombstones(),
        unjoined_results(),
        sessions_closed_together(),
        lost_session_deletions(),
        groups_in_other_partitions(),
        answers_in_other_partitions(),
    ]
}

fn no_rewrite(_: &mut Pair<'_, '_>) {}

/// Records without a key: in Parsley a key type without an absent value makes such a record a
/// bad record (skipped under `BadRecordPolicy::Skip`), and it moves the stage's event time as
/// every record read does. Kafka Streams drops it without moving its operators' stream time —
/// or, in a left or outer join, joins it with nothing at once (KIP-962). Kafka Streams runs
/// the script with those records under a key of their own, [`KEYLESS`] (so they move its
/// stream time and join nothing), and its results for that key are dropped.
fn keyless_records() -> Normalisation {
    Normalisation {
        name: "keyless-records",
        book: "dsl.md#records-without-a-key",
        applies: |s| keyed_by_type(&s.op) && s.inputs.iter().any(|i| i.key.is_none()),
        script: None,
        reference_script: Some(|_, inputs| {
            inputs
                .into_iter()
                .map(|i| Input {
                    key: Some(i.key.unwrap_or_else(|| KEYLESS.to_string())),
                    ..i
                })
                .collect()
        }),
        reference_op: None,
        apply: drop_keyless_results,
    }
}

/// Records without a key at a stream–table join with a versioned table: Parsley's stream of
/// the catalogue has a key type without an absent value, so such a record is a bad record,
/// skipped (under `BadRecordPolicy::Skip`), and moves neither the join's nor the table's
/// observed stream time. Kafka Streams' table and inner join drop such a record without moving
/// them either, but its left join joins it with nothing (KIP-962) — with a grace period, after
/// holding it, so it would move the buffer's time. Kafka Streams runs the script without the
/// stream's records that have no key.
fn keyless_records_at_a_versioned_join() -> Normalisation {
    Normalisation {
        name: "keyless-records-at-a-versioned-join",
        book: "dsl.md#records-without-a-key",
        applies: |s| {
            matches!(s.op, Op::VersionedJoin { .. })
                && s.inputs
                    .iter()
                    .any(|i| i.key.is_none() && i.topic == "left")
        },
        script: None,
        reference_script: Some(|_, inputs| {
            inputs
                .into_iter()
                .filter(|i| i.key.is_some() || i.topic != "left")
                .collect()
        }),
        reference_op: None,
        apply: no_rewrite,
    }
}

/// Drops Kafka Streams' results for the key [`KEYLESS`] (windowed or not).
fn drop_keyless_results(pair: &mut Pair<'_, '_>) {
    for records in pair.kafka_streams.values_mut() {
        records.retain(|r| {
            !r.key
                .as_deref()
                .is_some_and(|k| k == KEYLESS || k.starts_with(&format!("{KEYLESS}@")))
        });
    }
}

/// Whether Parsley's side of the catalogue reads the records' own keys with a type that holds
/// no absent key (an operator that needs the key: aggregations by key, joins, windows, tables)
/// and Kafka Streams' results for such a record would be under its own key. A table re-grouped
/// (`TableGroupBy`) is not among them: both sides skip a record without a key and nothing else
/// of theirs depends on it (no event time), so their outputs compare as they are.
fn keyed_by_type(op: &Op) -> bool {
    use crate::scenario::Grouping;
    match op {
        Op::Count { group, .. } | Op::Reduce { group, .. } | Op::Aggregate { group, .. } => {
            *group == Grouping::ByKey
        }
        Op::Join { rekey, .. } => !rekey,
        Op::Process
        | Op::Windowed { .. }
        | Op::Sliding { .. }
        | Op::Session { .. }
        | Op::JoinWindowed { .. }
        | Op::Table { .. }
        | Op::ToTable
        | Op::Cogroup
        | Op::TableFilter { .. }
        | Op::TableMapValues
        | Op::TableMapValuesWithKey
        | Op::TableJoin { .. }
        | Op::Suppress { .. } => true,
        _ => false,
    }
}

/// The watermark each record of a one-partition script arrives at: the highest timestamp
/// before it (`None` for the first).
fn arrival_watermarks(inputs: &[Input]) -> Vec<Option<i64>> {
    let mut high = None::<i64>;
    inputs
        .iter()
        .map(|i| {
            let at = high;
            high = Some(high.map_or(i.ts, |h| h.max(i.ts)));
            at
        })
        .collect()
}

/// A stream–stream join's record too late to join: one that arrives when the watermark has
/// passed its time by more than the difference and the grace (`t + d + grace + 1 <= w`), when
/// every record that could join it in time has been handed over. Parsley counts and routes it
/// as a window's late record; Kafka Streams still looks it up against what its stores keep, and
/// in a left or outer join gives its result with nothing at once. Kafka Streams runs the script
/// without those records (they are below its stream time: they move nothing else).
fn late_join_records() -> Normalisation {
    Normalisation {
        name: "late-join-records",
        book: "dsl.md#stream-stream-joins-records-too-late",
        applies: |s| matches!(s.op, Op::JoinWindowed { .. }),
        script: None,
        reference_script: Some(|s, inputs| {
            let Op::JoinWindowed {
                difference, grace, ..
            } = s.op
            else {
                return inputs;
            };
            // Lateness comes from the script Parsley reads, every record of it.
            let watermarks = arrival_watermarks(&s.inputs);
            let late: Vec<bool> = s
                .inputs
                .iter()
                .zip(watermarks)
                .map(|(i, w)| w.is_some_and(|w| i.ts + difference + grace < w))
                .collect();
            inputs
                .into_iter()
                .zip(late)
                .filter_map(|(i, late)| (!late).then_some(i))
                .collect()
        }),
        reference_op: None,
        apply: no_rewrite,
    }
}

/// A defect of the reference: Kafka Streams 4.4's stream–stream join stores keep a record for
/// `2d + grace` ms of their stream time, one less than a record in time can still join it
/// (until `t + 2d + grace + 1`): at the boundary a partner is gone, the pair is missed, and a
/// left or outer join gives a result with nothing instead (with a difference and grace of 0, no
/// record is kept at all). Kafka Streams runs the join with one more ms of grace, which keeps
/// each record exactly as long; whether a record is too late is decided by Parsley's rule
/// ([`late_join_records`]) and the results of records that joined nothing are compared by when
/// each side gives them ([`unjoined_results`]), so the extra grace changes nothing else.
fn join_store_retention() -> Normalisation {
    Normalisation {
        name: "kafka-streams-join-retention",
        book: "dsl.md#defects-of-kafka-streams-the-comparison-found",
        applies: |s| matches!(s.op, Op::JoinWindowed { .. }),
        script: None,
        reference_script: None,
        reference_op: Some(|op| match *op {
            Op::JoinWindowed {
                kind,
                difference,
                grace,
            } => Op::JoinWindowed {
                kind,
                difference,
                grace: grace + 1,
            },
            ref other => other.clone(),
        }),
        apply: no_rewrite,
    }
}

/// A defect of the reference: Kafka Streams 4.4 keeps a sliding window's store for `2d + grace`
/// ms counted from the latest window *start* put into it, and a record's right window starts
/// after the record (`t + 1`). So a window can leave the store before its close is emitted:
/// with only final results (`onWindowClose`), its final result is never forwarded (a key's
/// records at 1 and 2 with a difference of 1 give no result for `[0, 1]`); and a record that is
/// not too late can miss a closed window it should start from. Kafka Streams runs with a
/// retention no scenario reaches; Parsley keeps each window as long as a record in time can
/// read it.
fn sliding_store_retention() -> Normalisation {
    Normalisation {
        name: "kafka-streams-sliding-retention",
        book: "dsl.md#defects-of-kafka-streams-the-comparison-found",
        applies: |s| matches!(s.op, Op::Sliding { .. }),
        script: None,
        reference_script: None,
        reference_op: Some(|op| match op {
            Op::Sliding {
                how,
                difference,
                grace,
                updates,
                ..
            } => Op::Sliding {
                how: *how,
                difference: *difference,
                grace: *grace,
                updates: *updates,
                retention: Some(1_000_000),
            },
            other => other.clone(),
        }),
        apply: no_rewrite,
    }
}

/// The value [`empty_foreign_values`] gives Kafka Streams for a right row whose value is empty:
/// no generated value looks like it.
pub const EMPTY: &str = "~empty";

/// A defect of the reference: Kafka Streams 4.4's foreign-key join sends the right row to the
/// left table's side in a response wrapper whose deserializer reads the value only when bytes
/// are left after the header (`SubscriptionResponseWrapperSerde`), so a right value that
/// serializes to no bytes (an empty string) arrives as no right row: the inner join gives a
/// tombstone, the left join its result with `null`. Kafka Streams runs the script with those
/// right values as [`EMPTY`], and its results that join it are given the empty value back.
fn empty_foreign_values() -> Normalisation {
    Normalisation {
        name: "kafka-streams-empty-foreign-values",
        book: "dsl.md#defects-of-kafka-streams-the-comparison-found",
        applies: |s| {
            matches!(s.op, Op::FkJoin { .. })
                && s.inputs
                    .iter()
                    .any(|i| i.topic == "right" && i.value.as_deref() == Some(""))
        },
        script: None,
        reference_script: Some(|_, inputs| {
            inputs
                .into_iter()
                .map(|i| match i.value.as_deref() {
                    Some("") if i.topic == "right" => Input {
                        value: Some(EMPTY.to_string()),
                        ..i
                    },
                    _ => i,
                })
                .collect()
        }),
        reference_op: None,
        apply: |pair| {
            for records in pair.kafka_streams.values_mut() {
                for r in records.iter_mut() {
                    if let Some(v) = r.value.as_mut()
                        && let Some(joined) = v.strip_suffix(EMPTY)
                    {
                        *v = joined.to_string();
                    }
                }
            }
        },
    }
}

/// The key of the records [`suppressed_deletions_of_nothing`] and
/// [`suppress_evicts_before_later_records`] give Kafka Streams' script to move its stream
/// time: no generated key looks like it.
pub const TICK: &str = "~tick";

/// A suppressed table's deletion of a key that holds nothing (or of no key): Parsley's source
/// table forwards nothing for it, but it moves the stage's watermark as every record read
/// does, and so the suppression's timers. Kafka Streams' source table forwards nothing either,
/// and its suppression's stream time does not move. Kafka Streams runs the script with each
/// such deletion as a record at its time under the key [`TICK`] (it moves stream time and
/// opens a buffer of its own), and its results for that key are dropped.
fn suppressed_deletions_of_nothing() -> Normalisation {
    Normalisation {
        name: "deletions-of-nothing-move-event-time",
        book: "dsl.md#deletions-of-nothing-move-event-time",
        applies: |s| {
            matches!(s.op, Op::Suppress { .. }) && s.inputs.iter().any(|i| i.value.is_none())
        },
        script: None,
        reference_script: Some(|s, inputs| {
            if inputs.len() != s.inputs.len() {
                return inputs;
            }
            let mut holds: BTreeMap<&str, bool> = BTreeMap::new();
            s.inputs
                .iter()
                .zip(inputs)
                .map(|(parsley, input)| {
                    // A deletion without a key holds nothing either.
                    let held = parsley.key.as_deref().is_some_and(|key| {
                        holds.insert(key, parsley.value.is_some()).unwrap_or(false)
                    });
                    if parsley.value.is_none() && !held {
                        Input {
                            key: Some(TICK.to_string()),
                            value: Some("0".to_string()),
                            ..input
                        }
                    } else {
                        input
                    }
                })
                .collect()
        }),
        reference_op: None,
        apply: drop_tick_results,
    }
}

/// Drops Kafka Streams' results for the key [`TICK`].
fn drop_tick_results(pair: &mut Pair<'_, '_>) {
    for records in pair.kafka_streams.values_mut() {
        records.retain(|r| r.key.as_deref() != Some(TICK));
    }
}

/// A suppressed table's record later than its key's buffer time plus the limit: Parsley's
/// timers fire by the stage's watermark, which passes `t - 1` before the record at `t` is
/// handed over, so the buffer is emitted with the value it holds and the record opens a new
/// buffer; Kafka Streams buffers the record first (moving its stream time to `t`), then emits
/// the buffer once, with the record's value and timestamp. Before each such record, Kafka
/// Streams' script gets one record at `t - 1` under the key [`TICK`], which moves its stream
/// time there first, as Parsley's watermark; the buffers it evicts are the ones Parsley's
/// timers emit, in the same (time, key) order, and its results for that key are dropped. Which
/// records need it follows from the script by Parsley's rule (per key, the time its buffer
/// opened; a deletion of a key that holds nothing opens none). A record at exactly the buffer
/// time plus the limit, or out of order, needs none: both update the buffer, then emit.
fn suppress_evicts_before_later_records() -> Normalisation {
    Normalisation {
        name: "suppress-evicts-before-later-records",
        book: "dsl.md#suppressed-updates-past-the-limit",
        applies: |s| matches!(s.op, Op::Suppress { .. }),
        script: None,
        reference_script: Some(|s, inputs| {
            let Op::Suppress { limit_ms } = s.op else {
                return inputs;
            };
            if inputs.len() != s.inputs.len() {
                return inputs;
            }
            // Per key: whether the table holds a value, and the time its open buffer opened.
            let mut keys: BTreeMap<String, (bool, Option<i64>)> = BTreeMap::new();
            let mut watermark = None::<i64>;
            let mut out = Vec::with_capacity(inputs.len());
            for (parsley, input) in s.inputs.iter().zip(inputs) {
                let t = parsley.ts;
                let before = t - 1;
                if watermark.is_none_or(|w| before > w) {
                    let w = watermark;
                    let evicts_own = parsley.key.as_ref().is_some_and(|k| {
                        keys.get(k)
                            .and_then(|(_, since)| *since)
                            .is_some_and(|since| {
                                let due = since + limit_ms;
                                due <= before && w.is_none_or(|w| due > w)
                            })
                    });
                    if evicts_own {
                        out.push(Input {
                            topic: input.topic.clone(),
                            key: Some(TICK.to_string()),
                            value: Some("0".to_string()),
                            ts: before,
                        });
                    }
                    for (_, since) in keys.values_mut() {
                        if since.is_some_and(|since| since + limit_ms <= before) {
                            *since = None;
                        }
                    }
                }
                let w = watermark.map_or(t, |w| w.max(t));
                watermark = Some(w);
                if let Some(k) = &parsley.key {
                    let (holds, since) = keys.entry(k.clone()).or_default();
                    // A deletion of a key that holds nothing is not forwarded.
                    if parsley.value.is_some() || *holds {
                        *holds = parsley.value.is_some();
                        let opened = *since.get_or_insert(t);
                        if opened + limit_ms <= w {
                            *since = None;
                        }
                    }
                }
                for (_, since) in keys.values_mut() {
                    if since.is_some_and(|since| since + limit_ms <= w) {
                        *since = None;
                    }
                }
                out.push(input);
            }
            out
        }),
        reference_op: None,
        apply: drop_tick_results,
    }
}

/// Records that would extend a closed session: a session closes when the watermark passes its
/// end plus the gap and the grace, its final result is out, and Parsley never extends it; a
/// record that arrives later within the gap of it is too late (counted and routed). Kafka
/// Streams merges the record into the closed session and gives it a second result. Kafka
/// Streams runs the script without those records: which they are follows from the script
/// alone (sessions per key, the watermark the highest timestamp read before each record), as
/// Parsley's rule states it.
fn records_extending_closed_sessions() -> Normalisation {
    Normalisation {
        name: "records-extending-closed-sessions",
        book: "dsl.md#records-that-would-extend-a-closed-session",
        applies: |s| matches!(s.op, Op::Session { .. }),
        script: None,
        reference_script: Some(|s, inputs| {
            let Op::Session { gap, grace, .. } = s.op else {
                return inputs;
            };
            let closes_at = |end: i64| end + gap + 1 + grace;
            let forgotten_at = |end: i64| closes_at(end) + gap;
            // Per key: open sessions (start, end) and the end of the latest closed one.
            let mut keys = SessionsByKey::new();
            let mut watermark = None::<i64>;
            let mut kept = Vec::new();
            for input in inputs {
                let t = input.ts;
                if let Some(w) = watermark {
                    for (open, closed) in keys.values_mut() {
                        open.retain(|&(_, end)| {
                            if closes_at(end) > w {
                                return true;
                            }
                            *closed = Some(closed.map_or(end, |c| c.max(end)));
                            false
                        });
                        // Forgotten once no record in time can reach it: none that is not too
                        // late by its own time, none that joins an open session (records in
                        // time extend one back towards it).
                        if let Some(end) = *closed
                            && forgotten_at(end) <= w
                            && open.is_empty()
                        {
                            *closed = None;
                        }
                    }
                }
                let (open, closed) = keys.entry(input.key.clone()).or_default();
                let joined: Vec<(i64, i64)> = open
                    .iter()
                    .copied()
                    .filter(|&(start, end)| start - gap <= t && t <= end + gap)
                    .collect();
                let late = closed.is_some_and(|c| t - gap <= c)
                    || (joined.is_empty() && watermark.is_some_and(|w| closes_at(t) <= w));
                if !late {
                    open.retain(|session| !joined.contains(session));
                    let start = joined.iter().map(|j| j.0).chain([t]).min().unwrap_or(t);
                    let end = joined.iter().map(|j| j.1).chain([t]).max().unwrap_or(t);
                    open.push((start, end));
                    kept.push(input.clone());
                } else if !closed.is_some_and(|c| t - gap <= c) {
                    // Too late by its own time: Kafka Streams drops it too.
                    kept.push(input.clone());
                }
                watermark = Some(watermark.map_or(t, |w| w.max(t)));
            }
            kept
        }),
        reference_op: None,
        apply: no_rewrite,
    }
}

/// Tombstones for keys that hold nothing: a Parsley table forwards a deletion only for a key
/// that had a value (it always keeps the old value). Kafka Streams forwards one for every
/// record that leaves a key without a value — a tombstone read, a value its filter drops —
/// when the table is not materialized or its join has no old value to compare with. On both
/// sides, a tombstone for a key whose last record in the topic was a tombstone, or that had
/// none, is dropped.
fn redundant_tombstones() -> Normalisation {
    Normalisation {
        name: "redundant-tombstones",
        book: "dsl.md#deletions-of-keys-that-hold-nothing",
        applies: |s| {
            matches!(
                s.op,
                Op::Table { .. }
                    | Op::ToTable
                    | Op::TableFilter { .. }
                    | Op::TableMapValues
                    | Op::TableMapValuesWithKey
                    | Op::TableJoin { .. }
                    | Op::Suppress { .. }
            )
        },
        script: None,
        reference_script: None,
        reference_op: None,
        apply: drop_redundant_tombstones,
    }
}

/// Drops every tombstone for a key whose last record in its topic was a tombstone, or that had
/// none.
fn drop_redundant_tombstones(pair: &mut Pair<'_, '_>) {
    for outputs in pair.both() {
        for records in outputs.values_mut() {
            let mut holds: BTreeMap<Option<String>, bool> = BTreeMap::new();
            records.retain(|r| {
                let held = holds
                    .insert(r.key.clone(), r.value.is_some())
                    .unwrap_or(false);
                r.value.is_some() || held
            });
        }
    }
}

/// Results of one table update for two groups: a row that moves from one group to another
/// sends a retraction to the old group and an addition to the new one, which can lie in
/// different partitions of the repartition topic. Kafka orders records only within a
/// partition; Kafka Streams' test driver processes the two in the order they were written,
/// Parsley's driver partition by partition, so the groups' results interleave differently.
/// With more than one partition, both sides' outputs are put in key order, each key's results
/// kept in their order: every key's sequence of values and timestamps is still compared.
fn groups_in_other_partitions() -> Normalisation {
    Normalisation {
        name: "groups-in-other-partitions",
        book: "dsl.md#results-for-groups-in-other-partitions",
        applies: |s| matches!(s.op, Op::TableGroupBy { .. }) && s.partitions > 1,
        script: None,
        reference_script: None,
        reference_op: None,
        apply: in_key_order,
    }
}

/// Puts both sides' outputs in key order, each key's records kept in their order.
fn in_key_order(pair: &mut Pair<'_, '_>) {
    for outputs in pair.both() {
        for records in outputs.values_mut() {
            records.sort_by(|a, b| a.key.cmp(&b.key));
        }
    }
}

/// Answers of a foreign-key join for left keys in other partitions: an update of a right row
/// is answered to every left key subscribed to it, and the answers, keyed by left key, can lie
/// in different partitions of the response topic. Kafka orders records only within a
/// partition; Kafka Streams' test driver processes the answers in the order they were written
/// (its subscribers' order), Parsley's driver partition by partition, so the left keys'
/// results interleave differently. With more than one partition, both sides' outputs are put
/// in key order, each key's results kept in their order: every left key's sequence of values,
/// tombstones and timestamps is still compared.
fn answers_in_other_partitions() -> Normalisation {
    Normalisation {
        name: "answers-in-other-partitions",
        book: "dsl.md#foreign-key-join-results-in-other-partitions",
        applies: |s| matches!(s.op, Op::FkJoin { .. }) && s.partitions > 1,
        script: None,
        reference_script: None,
        reference_op: None,
        apply: in_key_order,
    }
}

/// Records without a value reaching a windowed `reduce`: Kafka Streams folds them in (a null
/// aggregate taking the first value as it is: its store holds no null, so a window of nulls
/// alone does not exist); Parsley's reducer over a value type without an absent value has none
/// to take, so such a record is a bad record, skipped under `BadRecordPolicy::Skip`, moving
/// event time as every record read does. A sliding aggregation in Kafka Streams skips them
/// without moving its stream time (`count` and `aggregate` too), and the catalogue reads its
/// values as a plain type, so Parsley skips them as bad records. Kafka Streams runs the script
/// with those records under the key [`KEYLESS`] (so they move its stream time and fold into
/// nothing compared), and its results for that key are dropped.
fn valueless_records() -> Normalisation {
    Normalisation {
        name: "valueless-records",
        book: "dsl.md#records-without-a-value",
        applies: |s| {
            matches!(
                s.op,
                Op::Windowed {
                    how: crate::scenario::How::Reduce,
                    ..
                } | Op::Sliding { .. }
                    | Op::Session {
                        how: crate::scenario::How::Reduce,
                        ..
                    }
            ) && s.inputs.iter().any(|i| i.value.is_none())
        },
        script: None,
        reference_script: Some(|_, inputs| {
            inputs
                .into_iter()
                .map(|i| match i.value {
                    Some(_) => i,
                    None => Input {
                        key: Some(KEYLESS.to_string()),
                        value: Some("0".to_string()),
                        ..i
                    },
                })
                .collect()
        }),
        reference_op: None,
        apply: drop_keyless_results,
    }
}

/// Whether a join's result (`left/right`) is a record's that joined nothing.
fn unjoined(r: &Output) -> bool {
    r.value
        .as_deref()
        .is_some_and(|v| v.starts_with("null/") || v.ends_with("/null"))
}

/// The key of the record [`unjoined_results`] adds at the end of a join's script.
pub const FLUSH: &str = "~flush";

/// The results of a left or outer stream–stream join for records that joined nothing. Parsley
/// gives such a result once, when its offsets prove no partner can come any more: when the
/// watermark — moved by every record read — reaches `t + 2d + grace + 1`. Kafka Streams gives
/// it when a record it joins moves its stream time past `t + d + grace` (and, as it keeps the
/// earliest time it waits for, sometimes later) — earlier, so a partner may still come and then
/// both results are out. Both sides run the script with a last record (key [`FLUSH`]) late
/// enough to close every window; the joined results must agree, in order, and the results of
/// records that joined nothing are compared as a set, after them, Kafka Streams' without those
/// for records that found a partner after all. The last record's own results are dropped.
fn unjoined_results() -> Normalisation {
    Normalisation {
        name: "unjoined-results-when-no-partner-can-come",
        book: "dsl.md#stream-stream-joins-results-of-records-that-joined-nothing",
        applies: |s| {
            matches!(
                s.op,
                Op::JoinWindowed {
                    kind: crate::scenario::JoinKind::Left | crate::scenario::JoinKind::Outer,
                    ..
                }
            )
        },
        script: Some(|s| {
            let Op::JoinWindowed {
                difference, grace, ..
            } = s.op
            else {
                return s.inputs.clone();
            };
            let end = s.inputs.iter().map(|i| i.ts).max().unwrap_or(0);
            let mut inputs = s.inputs.clone();
            inputs.push(Input {
                topic: "left".into(),
                key: Some(FLUSH.into()),
                value: Some("0".into()),
                // Past every window, with the reference's extra ms of grace.
                ts: end + 2 * difference + grace + 3,
            });
            inputs
        }),
        reference_script: None,
        reference_op: None,
        apply: |pair| {
            let Op::JoinWindowed { difference, .. } = pair.scenario.op else {
                return;
            };
            let sides = [
                (true, &mut *pair.kafka_streams),
                (false, &mut *pair.parsley),
            ];
            for (reference, outputs) in sides {
                for records in outputs.values_mut() {
                    records.retain(|r| r.key.as_deref() != Some(FLUSH));
                    let (mut alone, joined): (Vec<Output>, Vec<Output>) =
                        std::mem::take(records).into_iter().partition(unjoined);
                    alone.retain(|r| !(reference && found_partner(r, &joined, difference)));
                    alone.sort_by(|a, b| (&a.key, &a.value, a.ts).cmp(&(&b.key, &b.value, b.ts)));
                    *records = joined;
                    records.extend(alone);
                }
            }
        },
    }
}

/// Whether the record of `alone` (a result `v/null` or `null/v` at the record's time) appears
/// in a joined result: same key, its value on its side, within the difference.
fn found_partner(alone: &Output, joined: &[Output], difference: i64) -> bool {
    let Some(value) = alone.value.as_deref() else {
        return false;
    };
    let (left, part) = match value.strip_suffix("/null") {
        Some(v) => (true, v),
        None => (false, value.strip_prefix("null/").unwrap_or(value)),
    };
    joined.iter().any(|j| {
        j.key == alone.key
            && j.ts >= alone.ts
            && j.ts <= alone.ts + difference
            && j.value.as_deref().is_some_and(|v| {
                if left {
                    v.strip_prefix(part).is_some_and(|r| r.starts_with('/'))
                } else {
                    v.strip_suffix(part).is_some_and(|l| l.ends_with('/'))
                }
            })
    })
}

/// A defect of the reference: in Kafka Streams 4.4 a session aggregation that emits on window
/// close (its time-ordered session store) does not always find the open sessions a record
/// joins — with a gap of 0 never one at the record's own time, and after another key's record
/// has moved stream time not the session a gap behind — so it starts a new session where the
/// record extends one, and gives final results for sessions that are not whole. The same
/// aggregation emitting every update (its plain session store) finds them. Kafka Streams' final
/// results are rebuilt from that run: the last update of each session that its stream time has
/// closed, in the order it closes sessions (by end, start, key).
fn session_store_defect() -> Normalisation {
    Normalisation {
        name: "kafka-streams-sessions-on-close",
        book: "dsl.md#defects-of-kafka-streams-the-comparison-found",
        applies: |s| matches!(s.op, Op::Session { updates: false, .. }),
        script: None,
        reference_script: None,
        reference_op: None,
        apply: |pair| {
            let s = pair.reference;
            let Op::Session {
                how, gap, grace, ..
            } = s.op
            else {
                return;
            };
            let updates = Scenario {
                op: Op::Session {
                    how,
                    gap,
                    grace,
                    updates: true,
                },
                ..s.clone()
            };
            let Some(updated) = (pair.rerun)(&updates) else {
                return;
            };
            let stream_time = s.inputs.iter().map(|i| i.ts).max().unwrap_or(i64::MIN);
            for (topic, records) in pair.kafka_streams.iter_mut() {
                let mut last: BTreeMap<(i64, i64, String), Output> = BTreeMap::new();
                for r in updated.get(topic).into_iter().flatten() {
                    let Some((key, start, end)) = r.key.as_deref().and_then(session_of) else {
                        continue;
                    };
                    if r.value.is_some() {
                        // A session a merge replaced is gone, its deletion given or not.
                        last.retain(|(e, s, k), _| {
                            !(*k == key && start <= *s && *e <= end && (*s, *e) != (start, end))
                        });
                        last.insert((end, start, key), r.clone());
                    } else {
                        last.remove(&(end, start, key));
                    }
                }
                *records = last
                    .into_iter()
                    .filter(|((end, _, _), _)| end + gap + grace < stream_time)
                    .map(|(_, r)| r)
                    .collect();
            }
        },
    }
}

/// Sessions that close at the same moment: Parsley's timers fire in key order, so the final
/// results of sessions with the same end (of different keys) leave in key order; Kafka
/// Streams' time-ordered session store gives them by start, then key. Within each run of final
/// results with the same end, both sides are put in (start, key) order.
fn sessions_closed_together() -> Normalisation {
    Normalisation {
        name: "sessions-closed-together",
        book: "dsl.md#sessions-that-close-together",
        applies: |s| matches!(s.op, Op::Session { updates: false, .. }),
        script: None,
        reference_script: None,
        reference_op: None,
        apply: |pair| {
            for outputs in pair.both() {
                for records in outputs.values_mut() {
                    let end_of = |r: &Output| r.key.as_deref().and_then(session_of).map(|w| w.2);
                    for run in records.chunk_by_mut(|a, b| end_of(a) == end_of(b)) {
                        run.sort_by_key(|r| {
                            r.key
                                .as_deref()
                                .and_then(session_of)
                                .map(|(k, s, _)| (s, k))
                        });
                    }
                }
            }
        },
    }
}

/// A defect of the reference: when a record extends a session whose end is exactly its stream
/// time minus the gap and the grace, Kafka Streams 4.4 merges it, but its session store, which
/// keeps sessions for the gap plus the grace, has let the old one expire: the deletion of the
/// session merged away is neither stored nor forwarded. With updates on, a Parsley deletion
/// that Kafka Streams does not give is dropped when a later update of the same key is a
/// session that holds it — the merge the deletion stands for; any other is still a difference.
fn lost_session_deletions() -> Normalisation {
    Normalisation {
        name: "kafka-streams-lost-session-deletions",
        book: "dsl.md#defects-of-kafka-streams-the-comparison-found",
        applies: |s| matches!(s.op, Op::Session { updates: true, .. }),
        script: None,
        reference_script: None,
        reference_op: None,
        apply: |pair| {
            for (topic, records) in pair.parsley.iter_mut() {
                let given = pair.kafka_streams.get(topic);
                let kept: Vec<bool> = records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        if r.value.is_some() || given.is_some_and(|g| g.contains(r)) {
                            return true;
                        }
                        let Some((key, start, end)) = r.key.as_deref().and_then(session_of) else {
                            return true;
                        };
                        // Kept unless a later update of the key is a session that holds it.
                        !records[i + 1..].iter().any(|later| {
                            later.value.is_some()
                                && later
                                    .key
                                    .as_deref()
                                    .and_then(session_of)
                                    .is_some_and(|(k, s, e)| k == key && s <= start && end <= e)
                        })
                    })
                    .collect();
                let mut flags = kept.into_iter();
                records.retain(|_| flags.next().unwrap_or(true));
            }
        },
    }
}

/// A session's rendered key `key@start/end`: key, start, end.
fn session_of(rendered: &str) -> Option<(String, i64, i64)> {
    let (key, window) = rendered.rsplit_once('@')?;
    let (start, end) = window.split_once('/')?;
    Some((key.to_string(), start.parse().ok()?, end.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(key: &str, value: Option<&str>, ts: i64) -> Output {
        Output {
            key: Some(key.into()),
            value: value.map(Into::into),
            ts,
        }
    }

    #[test]
    fn only_tombstones_of_keys_that_hold_nothing_are_redundant() {
        let n = redundant_tombstones();
        let mut outputs = Outputs::from([(
            "out".to_string(),
            vec![
                out("a", None, 1),
                out("a", Some("1"), 2),
                out("a", None, 3),
                out("a", None, 4),
                out("b", None, 5),
            ],
        )]);
        let s = Scenario {
            op: Op::TableMapValues,
            partitions: 1,
            inputs: vec![],
        };
        let mut reference = outputs.clone();
        (n.apply)(&mut Pair {
            scenario: &s,
            reference: &s,
            kafka_streams: &mut reference,
            parsley: &mut outputs,
            rerun: &mut |_| None,
        });
        assert_eq!(reference, outputs);
        assert_eq!(outputs["out"], [out("a", Some("1"), 2), out("a", None, 3)]);
    }

    #[test]
    fn an_unjoined_result_is_spurious_only_for_a_record_that_joined() {
        let joined = [out("a", Some("1/2"), 5)];
        assert!(found_partner(&out("a", Some("1/null"), 4), &joined, 1));
        assert!(!found_partner(&out("a", Some("1/null"), 3), &joined, 1));
        assert!(!found_partner(&out("a", Some("11/null"), 4), &joined, 1));
        assert!(found_partner(&out("a", Some("null/2"), 5), &joined, 1));
        assert!(!found_partner(&out("b", Some("null/2"), 5), &joined, 1));
    }

    #[test]
    fn every_normalisation_names_a_section_of_the_book() {
        let book = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src");
        for n in all() {
            let (file, anchor) = n.book.split_once('#').expect("a file and an anchor");
            let text = std::fs::read_to_string(book.join(file)).unwrap();
            let found = text.lines().any(|l| {
                l.starts_with('#') && anchor_of(l.trim_start_matches('#').trim()) == anchor
            });
            assert!(
                found,
                "{}: no heading for #{anchor} in book/src/{file}",
                n.name
            );
        }
    }

    /// mdBook's anchor of a heading: lower case, spaces as dashes, other punctuation dropped.
    fn anchor_of(heading: &str) -> String {
        heading
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect()
    }
}
