//! Records too late for every window they belong to: what a windowed operator does with them
//! ([`LatePolicy`]), the record it writes ([`LateRecord`]) and the route that counts and writes
//! them (`LateRoute`), shared by time windows, session windows and windowed stream–stream
//! joins.
//!
//! Above `data` and `flow`; below `graph`, which keeps the late policy of operators added from
//! now on, and every windowed operator: it imports nothing of theirs.

use std::sync::Arc;

use parsley_stage::Error;
use serde::{Deserialize, Serialize};

use crate::data::{Codecs, Data, auto_codecs};
use crate::flow::Ctx;

/// What a windowed operator does with a record that arrives after every window it belongs to
/// has closed (set with `StreamsBuilder::on_late_record`). Either way it is counted
/// (`MetricsSnapshot::too_late`); nothing is dropped silently.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LatePolicy {
    /// Count it.
    #[default]
    Count,
    /// Count it and write it to `topic` as a [`LateRecord`], keyed by its key.
    ToTopic(String),
}

/// A record too late for its windows, as [`LatePolicy::ToTopic`] writes it (JSON with the
/// default codecs); times in ms since the epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LateRecord<V> {
    /// The record's value.
    pub value: V,
    /// Its event time.
    pub timestamp: i64,
    /// The operator it was late for.
    pub operator: String,
    /// The latest window it belongs to: its start…
    pub window_start: i64,
    /// …and its end.
    pub window_end: i64,
    /// The task's watermark when it arrived.
    pub watermark: i64,
}

/// Where a windowed operator's records too late for every window go (its [`LatePolicy`]).
pub(crate) struct LateRoute<K, V> {
    operator: String,
    topic: Option<LateTopic<K, V>>,
}

/// The late topic and its codecs.
type LateTopic<K, V> = (Arc<str>, Codecs<K, LateRecord<V>>);

impl<K: Data, V: Data> LateRoute<K, V> {
    /// The route of the operator named `operator` under `policy`. Its topic, if any, must be a
    /// sink of the operator's stage: `Graph::late_route` makes it one.
    pub(crate) fn new(policy: &LatePolicy, operator: String) -> Self {
        let topic = match policy {
            LatePolicy::Count => None,
            LatePolicy::ToTopic(topic) => Some((
                Arc::<str>::from(topic.as_str()),
                auto_codecs::<K, LateRecord<V>>(),
            )),
        };
        LateRoute { operator, topic }
    }

    /// The topic the route writes to, if any.
    pub(crate) fn topic(&self) -> Option<&str> {
        self.topic.as_ref().map(|(topic, _)| &**topic)
    }

    /// Counts the context's record `(key, value)`, too late for its latest window
    /// `(start, end)`, and writes it to the late topic if there is one.
    ///
    /// # Errors
    /// When the late record does not encode.
    pub(crate) fn take(
        &self,
        ctx: &mut Ctx<'_>,
        key: K,
        value: V,
        (window_start, window_end): (i64, i64),
    ) -> Result<(), Error> {
        ctx.too_late += 1;
        if let Some((topic, codecs)) = &self.topic {
            let record = LateRecord {
                value,
                timestamp: ctx.timestamp,
                operator: self.operator.clone(),
                window_start,
                window_end,
                watermark: ctx.watermark.unwrap_or(i64::MIN),
            };
            ctx.send(topic, codecs, key, record)?;
        }
        Ok(())
    }
}
