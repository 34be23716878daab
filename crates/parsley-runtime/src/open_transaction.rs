//! A changelog restore held by an open transaction: found out, said once, and named in the
//! error when the restore gives up.
//!
//! A restore reads its changelog partition `read_committed` up to the high watermark taken when
//! it starts (`changelog::restore`). While another producer's transaction is open on the
//! partition, the partition's last stable offset (LSO) — the first offset of the oldest open
//! transaction — stays below the high watermark, and a `read_committed` consumer reads nothing
//! past it: the restore's position stands at the LSO until the transaction ends. No client
//! error says so. [`OpenTransactionWatch`] asks the partition's LSO (`ListOffsets` with
//! `READ_COMMITTED`) once the position has stood still for [`CHECK_AFTER`], at most once per
//! [`CHECK_EVERY`], and when the position stands at an LSO below the high watermark it logs
//! once, at INFO, what the restore waits for and the longest it can take: the transaction ends
//! when its producer commits or aborts it, or when the coordinator aborts it after that
//! producer's `transaction.timeout.ms`. If the restore then times out, its error is
//! [`ProcessingError::RestoreBlocked`], naming the partition and both offsets.
//!
//! The producer holding the transaction is named by the transactional id that Parsley's
//! producers write on the first changelog record of each transaction on a partition (header
//! `parsley.txn`): the restore reads the record at the LSO — the open transaction's first —
//! `read_uncommitted`, once per LSO found.
//! A producer that is not a Parsley stage writes no such header and is not named
//! (`DescribeProducers`, KIP-664, would name any producer; librdkafka 2.12 does not offer it).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, info};

use crate::admin::Admin;
use crate::outbox::TXN_HEADER;
use parsley_task::error::Error;
use parsley_task::error::ProcessingError;

/// How long reading the open transaction's first record may take.
const READ_WRITER: Duration = Duration::from_secs(2);

/// How long a restore's position stands still before its LSO is asked.
pub(crate) const CHECK_AFTER: Duration = Duration::from_secs(1);
/// Least time between two LSO requests of one restore.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Watches one restore for an open transaction holding its position.
#[derive(Debug)]
pub(crate) struct OpenTransactionWatch {
    topic: String,
    partition: i32,
    /// The high watermark the restore reads up to.
    end: i64,
    /// This stage's producers' `transaction.timeout.ms`.
    transaction_timeout: Duration,
    /// When the LSO was last asked.
    checked: Option<Instant>,
    /// The LSO that holds the position, as last found; `None` when none does.
    held_at: Option<i64>,
    /// The LSO the INFO line was logged for.
    said: Option<i64>,
    /// The restore's consumer configuration, to read the open transaction's first record.
    client: ClientConfig,
    /// The transactional id that record names, once read.
    producer: Option<String>,
}

impl OpenTransactionWatch {
    /// A watch for the restore of `topic`/`partition` up to `end`, read with consumers of
    /// `client`.
    pub(crate) fn new(
        topic: &str,
        partition: i32,
        end: i64,
        transaction_timeout: Duration,
        client: &ClientConfig,
    ) -> Self {
        OpenTransactionWatch {
            topic: topic.to_string(),
            partition,
            end,
            transaction_timeout,
            checked: None,
            held_at: None,
            said: None,
            client: client.clone(),
            producer: None,
        }
    }

    /// Looks at the restore: its next offset to read `at`, unmoved for `still`. Asks the LSO
    /// when the position has stood still long enough (module docs).
    pub(crate) fn observe(&mut self, admin: &Admin, at: i64, still: Duration) {
        if still < CHECK_AFTER {
            self.held_at = None;
            return;
        }
        if self.checked.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
            return;
        }
        self.check(admin, at);
    }

    /// What the restore waits for, as the last look found it: the open transaction pinning
    /// the last stable offset ([`RestoreWait`](crate::RestoreWait)); `None` when none holds it.
    pub(crate) fn wait(&self) -> Option<parsley_task::explain::RestoreWait> {
        self.held_at.map(|lso| parsley_task::explain::RestoreWait {
            changelog: self.topic.clone(),
            partition: self.partition,
            last_stable_offset: lso,
            high_watermark: self.end,
            producer: self.producer.clone(),
        })
    }

    /// `true` when the last look found the position held by an open transaction: the restore
    /// waits for it, and a new consumer would not read further.
    pub(crate) fn held(&self) -> bool {
        self.held_at.is_some()
    }

    /// The error of a restore that timed out at `at` after `timeout`: asks the LSO once more,
    /// and returns [`ProcessingError::RestoreBlocked`] when an open transaction holds the position,
    /// else `None` (the caller's own timeout error).
    pub(crate) fn timed_out(&mut self, admin: &Admin, at: i64, timeout: Duration) -> Option<Error> {
        self.check(admin, at);
        self.held_at.map(|lso| {
            Error::Processing(ProcessingError::RestoreBlocked {
                topic: self.topic.clone(),
                partition: self.partition,
                last_stable_offset: lso,
                high_watermark: self.end,
                timeout,
                transaction_timeout: self.transaction_timeout,
                producer: self.producer.clone(),
            })
        })
    }

    fn check(&mut self, admin: &Admin, at: i64) {
        self.checked = Some(Instant::now());
        let lso = match admin.last_stable_offsets(&[(self.topic.as_str(), self.partition)]) {
            Ok(lso) => lso[0],
            Err(e) => {
                debug!(topic = %self.topic, partition = self.partition, error = %e, "cannot read the changelog's last stable offset");
                return;
            }
        };
        self.held_at = held_by(at, lso, self.end);
        if let Some(lso) = self.held_at
            && self.said != Some(lso)
        {
            self.said = Some(lso);
            self.producer = writer_at(&self.client, &self.topic, self.partition, lso);
            info!(
                topic = %self.topic,
                partition = self.partition,
                last_stable_offset = lso,
                high_watermark = self.end,
                transaction_timeout_ms = self.transaction_timeout.as_millis() as u64,
                producer = self.producer.as_deref().unwrap_or(""),
                "{}",
                notice(
                    &self.topic,
                    self.partition,
                    lso,
                    self.end,
                    self.transaction_timeout,
                    self.producer.as_deref()
                )
            );
        }
    }
}

/// The transactional id named on the record at `offset` of `topic`/`partition` (the open
/// transaction's first), read `read_uncommitted` with a consumer of `client`; `None` when it
/// names none, or when it cannot be read within [`READ_WRITER`].
fn writer_at(client: &ClientConfig, topic: &str, partition: i32, offset: i64) -> Option<String> {
    let mut config = client.clone();
    config.set("isolation.level", "read_uncommitted");
    let consumer: BaseConsumer = config.create().ok()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .ok()?;
    consumer.assign(&tpl).ok()?;
    let deadline = Instant::now() + READ_WRITER;
    while Instant::now() < deadline {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        if m.offset() != offset {
            return None;
        }
        return m
            .headers()?
            .iter()
            .find(|h| h.key == TXN_HEADER)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned());
    }
    None
}

/// The LSO that holds a restore at next offset `at` reading up to `end`: `Some(lso)` when the
/// position stands at an LSO below `end`.
fn held_by(at: i64, lso: i64, end: i64) -> Option<i64> {
    (lso < end && at >= lso).then_some(lso)
}

/// The INFO line of a restore held by an open transaction.
fn notice(
    topic: &str,
    partition: i32,
    lso: i64,
    end: i64,
    transaction_timeout: Duration,
    producer: Option<&str>,
) -> String {
    let by = producer.map_or(String::new(), |p| {
        format!(" by the producer with transactional id {p}")
    });
    format!(
        "the restore of {topic}/{partition} waits for a transaction open on the partition{by}: \
         read_committed stops at the last stable offset {lso}, below the high watermark {end}, \
         until the transaction ends — when its producer commits or aborts it, or at most that \
         producer's transaction.timeout.ms after it began, when the coordinator aborts it (this \
         stage's producers: {} ms)",
        transaction_timeout.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_at_an_lso_below_the_end_is_held() {
        assert_eq!(held_by(4, 4, 5), Some(4));
        // Still reading below the LSO: not held yet.
        assert_eq!(held_by(3, 4, 5), None);
        // No open transaction: the LSO is the high watermark.
        assert_eq!(held_by(5, 5, 5), None);
        // A transaction opened after the restore took its end: the LSO is past the end.
        assert_eq!(held_by(5, 7, 5), None);
    }

    #[test]
    fn the_notice_names_the_partition_the_offsets_and_the_longest_wait() {
        let n = notice("app.s.changelog", 2, 4, 5, Duration::from_secs(60), None);
        assert!(n.contains("app.s.changelog/2"), "{n}");
        assert!(
            n.contains("last stable offset 4, below the high watermark 5"),
            "{n}"
        );
        assert!(n.contains("(this stage's producers: 60000 ms)"), "{n}");
        let n = notice(
            "app.s.changelog",
            2,
            4,
            5,
            Duration::from_secs(60),
            Some("app.s-a-0"),
        );
        assert!(
            n.contains("open on the partition by the producer with transactional id app.s-a-0:"),
            "{n}"
        );
    }
}
