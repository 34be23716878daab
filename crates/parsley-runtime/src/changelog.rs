//! The changelog of a stage, on the wire: every task's fold state and Parsley's own state,
//! written in the stage's transaction and read back on assignment (the book's specification,
//! §7, "exact restore"). The records themselves — the key layout, each record's encoding, and
//! the fold of one partition's records ([`Restored`]) — are `parsley_stage::changelog`'s; this
//! module creates the topic ([`ensure_topic`]) and reads a partition ([`restore`]).
//!
//! The first record of each transaction on a partition carries a `parsley.txn` header: the
//! transactional id of the producer that wrote it, so a restore held by an open transaction —
//! which reads that record — names whose it is (`open_transaction`). Later records of the
//! transaction carry no header (a header per record cost a counting stage over unique keys
//! 2–13 % of its time in hand runs).
//!
//! Invariants:
//! - the runtime writes the changelog only inside the stage's transaction, after every output
//!   of the transaction is acknowledged (so the clock has no in-flight claims), together with
//!   the input offsets: a committed changelog prefix and the group's committed offsets describe
//!   the same moment;
//! - restore reads a partition `read_committed` from its start (or from the checkpoint of the
//!   task's trusted copy in the state store, `state_store`) up to the high watermark taken
//!   when the restore starts (`READ_UNCOMMITTED` `ListOffsets`), so it waits for the markers of
//!   a transaction still completing and never stops at an older commit;
//! - a snapshot is used only when its input offsets equal the group's committed offsets; fetch
//!   evidence (queues, positions, high watermarks) is never restored, it is fetched again.

use std::time::{Duration, Instant};

use parsley_stage::changelog::Restored;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::{Admin, TopicSpec};
use crate::clients::ClientRole;
use crate::open_transaction::OpenTransactionWatch;
use crate::security::Endpoint;
use parsley_clock::TopicId;
use parsley_task::error::{Error, Result};
use parsley_task::error::{KafkaError, Operation, ProcessingError, SetupError};
use parsley_task::state_store::{Checkpoint, TaskStore, now_ms};
use parsley_task::topic::TopicInfo;
use tracing::warn;

pub use parsley_stage::changelog_topic;

/// The topic configs of a changelog the runtime creates, before the user's
/// ([`RuntimeConfig::changelog_property`](crate::RuntimeConfig::changelog_property)):
///
/// - `cleanup.policy=compact`: a restore needs the last value of each key only;
/// - `segment.ms=300000` (5 min) and `segment.bytes=67108864` (64 MiB): the log cleaner never
///   touches a partition's active segment, and the broker's default segment (1 GiB, 7 days)
///   would keep a busy changelog uncompacted for hours, every record ever written read again by
///   each restore without a state directory (in a one-hour run with a fault every three
///   minutes, restores grew from 1.1×10⁵ to 1.3×10⁶ records per partition). With segments
///   that roll, a restore reads about the live keys plus the segments the cleaner has not
///   reached yet (at most as many dirty records as clean ones, under the broker's
///   `min.cleanable.dirty.ratio` of 0.5).
pub const CHANGELOG_DEFAULTS: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "300000"),
    ("segment.bytes", "67108864"),
];

/// Describes the changelog topic, creating it (`partitions` partitions, with
/// [`CHANGELOG_DEFAULTS`] and then the user's topic configs `configs`, the later of two settings
/// of one key winning) when it does not exist.
///
/// # Errors
/// [`SetupError::ChangelogPartitions`] when it exists with another partition count; admin errors.
pub(crate) fn ensure_topic(
    admin: &Admin,
    name: &str,
    partitions: i32,
    configs: &[(String, String)],
) -> Result<TopicInfo> {
    let existing = match admin.describe_topics(&[name]) {
        Ok(mut t) => Some(t.remove(0)),
        Err(Error::Setup(SetupError::UnknownTopic { .. })) => None,
        Err(e) => return Err(e),
    };
    let info = match existing {
        Some(t) => t,
        // Another instance of the stage may create it at the same moment.
        None => admin.create_topic_if_absent(&creation(name, partitions, configs))?,
    };
    if info.partitions != partitions {
        return Err(Error::Setup(SetupError::ChangelogPartitions {
            topic: name.to_string(),
            partitions: info.partitions,
            expected: partitions,
        }));
    }
    Ok(info)
}

/// The creation request of changelog `name`: [`CHANGELOG_DEFAULTS`] overridden key by key by
/// `configs`, each key once.
fn creation(name: &str, partitions: i32, configs: &[(String, String)]) -> TopicSpec {
    let mut merged: Vec<(String, String)> = CHANGELOG_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (key, value) in configs {
        match merged.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.clone(),
            None => merged.push((key.clone(), value.clone())),
        }
    }
    merged
        .into_iter()
        .fold(TopicSpec::new(name, partitions), |spec, (k, v)| {
            spec.config(k, v)
        })
}

/// How long a restore may read nothing (no record, no position move) before its consumer is
/// replaced by a new one at the next offset to read. A consumer created while the broker
/// restarts can stay without a fetch session after the broker is back (fault-injection run,
/// seed 20); a new client is the evidence-neutral way out: it resumes exactly where the old one
/// stopped.
pub(crate) const RESTORE_STALL: Duration = Duration::from_secs(10);

/// Reads partition `partition` of the changelog `topic` (see the module docs) from offset
/// `from` (0, or the checkpoint of the task's copy in the state store) with consumers made from
/// `client` (a complete `read_committed` consumer configuration), folding its records in offset
/// order into `restored` ([`Restored::apply`]). With `store` (the task's keyspace and the
/// changelog topic's id), every record read also goes to the store, in batches, each with the
/// checkpoint after it, and the end read becomes the checkpoint. Returns the fold and the number of consumers replaced
/// after reading nothing for [`RESTORE_STALL`]. `progress` is
/// called with `(position, end)` — the next offset to read and the high watermark the restore
/// reads up to (offsets, i64) — when the restore starts and after every record.
///
/// A transaction open on the partition holds the position at the last stable offset: that is
/// found out and said once ([`OpenTransactionWatch`]); `transaction_timeout` is this stage's
/// producers' `transaction.timeout.ms`, named as the longest such a wait can take. `held` is
/// called with what the restore waits for whenever that changes (an open transaction found,
/// or gone: `None`), and with `None` when the restore ends.
///
/// # Errors
/// [`ProcessingError::Changelog`] for a record that does not decode (topic, partition, offset
/// named); [`ProcessingError::RestoreBlocked`] when an open transaction holds the position below
/// the high watermark until `timeout`; [`KafkaError::Timeout`] when the position does not reach the
/// high watermark within `timeout` for another reason; client errors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore(
    client: &ClientConfig,
    admin: &Admin,
    (topic, partition): (&str, i32),
    (from, restored, store): (i64, Restored, Option<(&TaskStore, TopicId)>),
    (timeout, transaction_timeout): (Duration, Duration),
    progress: &mut dyn FnMut(i64, i64),
    held: &mut dyn FnMut(Option<parsley_task::explain::RestoreWait>),
) -> Result<(Restored, u64)> {
    let mut said = None;
    let result = read_changelog(
        client,
        admin,
        (topic, partition),
        (from, restored, store),
        (timeout, transaction_timeout),
        progress,
        &mut |wait| {
            if wait != said {
                said = wait.clone();
                held(wait);
            }
        },
    );
    if said.is_some() {
        held(None);
    }
    result
}

/// [`restore`], `held` called with what the restore waits for after every look.
fn read_changelog(
    client: &ClientConfig,
    admin: &Admin,
    (topic, partition): (&str, i32),
    (from, mut restored, store): (i64, Restored, Option<(&TaskStore, TopicId)>),
    (timeout, transaction_timeout): (Duration, Duration),
    progress: &mut dyn FnMut(i64, i64),
    held: &mut dyn FnMut(Option<parsley_task::explain::RestoreWait>),
) -> Result<(Restored, u64)> {
    let end = admin.high_watermarks(&[(topic, partition)])?[0];
    let mut watch = OpenTransactionWatch::new(topic, partition, end, transaction_timeout, client);
    // Records read and not in the store yet, with the store to write them to.
    let mut copy = store.map(|s| StoreCopy {
        store: s.0,
        topic: s.1,
        batch: Vec::new(),
    });
    // Consumers replaced after reading nothing for `RESTORE_STALL`.
    let mut replaced = 0u64;
    progress(from, end);
    if from >= end {
        if let Some(c) = &mut copy {
            c.write(from)?;
        }
        return Ok((restored, replaced));
    }
    let open = |from: Offset| -> Result<BaseConsumer> {
        let consumer: BaseConsumer = client
            .create()
            .map_err(|e| crate::client_error::kafka(Operation::CreateRestoreConsumer, e))?;
        // A new consumer assigned before it knows the partition's leader queries the start
        // offset only when librdkafka's offset-query timer fires, 500 ms later, on every
        // restore; with the topic's metadata in hand it queries at once. Best effort: without
        // it (a broker restarting) the consumer finds the leader itself, as before.
        if let Err(e) = consumer.fetch_metadata(Some(topic), timeout.min(RESTORE_STALL)) {
            tracing::debug!(topic, error = %e, "the restore consumer has no metadata yet");
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, from)
            .map_err(|e| crate::client_error::kafka(Operation::BuildRestoreAssignment, e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| crate::client_error::kafka(Operation::AssignChangelogPartition, e))?;
        Ok(consumer)
    };
    let (mut consumer, mut next) = if from > 0 {
        (open(Offset::Offset(from))?, Some(from))
    } else {
        (open(Offset::Beginning)?, None)
    };
    let started = Instant::now();
    // `next`: the next offset to read, once known (a record read or a position reported).
    let mut moved = Instant::now();
    // Records read since the last look at the position, the clocks and the watch: a look costs
    // far more than a record, so it is taken when a poll returns nothing, and every
    // `LOOK_EVERY` records.
    let mut unlooked = 0u32;
    loop {
        if unlooked > 0 && unlooked < LOOK_EVERY {
            if next.is_some_and(|n| n >= end) {
                unlooked = LOOK_EVERY;
                continue;
            }
        } else {
            unlooked = 0;
            if let Some(n) = next {
                progress(n, end);
            }
            let position = consumer
                .position()
                .map_err(|e| crate::client_error::kafka(Operation::ReadRestorePosition, e))?
                .find_partition(topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            if let Some(p) = position
                && next.is_none_or(|n| p > n)
            {
                next = Some(p);
                moved = Instant::now();
                progress(p, end);
            }
            let at = next.unwrap_or(0);
            if at >= end {
                if let Some(c) = &mut copy {
                    c.write(at)?;
                }
                return Ok((restored, replaced));
            }
            watch.observe(admin, at, moved.elapsed());
            held(watch.wait());
            if started.elapsed() >= timeout {
                if let Some(blocked) = watch.timed_out(admin, at, timeout) {
                    return Err(blocked);
                }
                return Err(Error::Kafka(KafkaError::Timeout {
                    what: parsley_task::error::Awaited::Restore {
                        topic: topic.to_string(),
                        partition,
                        position: at,
                        high_watermark: end,
                        replaced,
                        stall: RESTORE_STALL,
                    },
                    timeout,
                }));
            }
            // A position held by an open transaction is no stalled client: a new one would stop
            // at the same offset.
            if moved.elapsed() >= RESTORE_STALL && !watch.held() {
                warn!(
                    topic,
                    partition,
                    position = at,
                    end,
                    "the restore read nothing for {}s; replacing its consumer",
                    RESTORE_STALL.as_secs()
                );
                drop(consumer);
                consumer = open(next.map_or(Offset::Beginning, Offset::Offset))?;
                replaced += 1;
                moved = Instant::now();
                continue;
            }
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            unlooked = 0;
            continue;
        };
        let m = match m {
            Ok(m) => m,
            Err(e)
                if e.rdkafka_error_code()
                    .is_some_and(crate::security::is_security_failure) =>
            {
                let code = e.rdkafka_error_code().expect("a code");
                return Err(Endpoint::of(client, ClientRole::Restore).error(code, e.to_string()));
            }
            // librdkafka reconnects by itself (a broker restarting).
            Err(e) if crate::client_error::transient(&e) => continue,
            Err(e) => {
                return Err(Error::from(
                    crate::client_error::client(Operation::ReadChangelog, e)
                        .with_partition(topic, partition),
                ));
            }
        };
        // Records arrive in offset order; one below `next` cannot come from this assignment.
        if next.is_some_and(|n| m.offset() < n) {
            continue;
        }
        next = Some(m.offset() + 1);
        moved = Instant::now();
        unlooked += 1;
        restored
            .apply(m.key().unwrap_or_default(), m.payload())
            .map_err(|message| {
                Error::Processing(ProcessingError::Changelog {
                    topic: topic.to_string(),
                    partition,
                    offset: m.offset(),
                    message,
                })
            })?;
        if let Some(c) = &mut copy {
            c.batch.push((
                m.key().unwrap_or_default().to_vec(),
                m.payload().map(<[u8]>::to_vec),
            ));
            if c.batch.len() >= STORE_BATCH {
                c.write(m.offset() + 1)?;
            }
        }
    }
}

/// Records a restore reads between two looks at its position and progress.
const LOOK_EVERY: u32 = 1_000;

/// Records a restore writes to the state store in one batch: what it keeps in memory for a
/// changelog read whole.
const STORE_BATCH: usize = 10_000;

/// The records a restore read and has not written to the state store yet.
struct StoreCopy<'a> {
    store: &'a TaskStore,
    topic: TopicId,
    batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl StoreCopy<'_> {
    /// Writes the batch with checkpoint `next`: every record below it is read.
    fn write(&mut self, next: i64) -> Result<()> {
        self.store.write(
            self.batch.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
            Checkpoint {
                topic: self.topic,
                offset: next,
                written_ms: now_ms(),
            },
        )?;
        self.batch.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_configs_override_the_defaults_key_by_key() {
        let spec = creation(
            "app.count.changelog",
            3,
            &[
                ("segment.ms".into(), "100".into()),
                ("min.cleanable.dirty.ratio".into(), "0.01".into()),
            ],
        );
        assert_eq!(spec.partitions, 3);
        let configs: Vec<(&str, &str)> = spec
            .config
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            configs,
            [
                ("cleanup.policy", "compact"),
                ("segment.ms", "100"),
                ("segment.bytes", "67108864"),
                ("min.cleanable.dirty.ratio", "0.01"),
            ]
        );
    }
}
