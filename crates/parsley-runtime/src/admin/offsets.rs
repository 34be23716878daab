//! Offsets through the admin: high watermarks, last stable offsets and log start offsets, each
//! from one batched `ListOffsets` request answered by the partition leaders, asked again while
//! a leader moves or restarts (and, for a topic just created, until its leaders know it).

use std::time::{Duration, Instant};

use rdkafka::types::RDKafkaErrorCode;
use tracing::debug;

use super::Admin;
use crate::librdkafka::admin::{AdminCall, Isolation, OffsetQuery, OffsetSpec};
use parsley_task::error::{Error, Result};
use parsley_task::error::{KafkaError, Operation};

impl Admin {
    /// The high watermark (log end offset, open transactions included) of each partition, from
    /// one batched `ListOffsets(LATEST)` request with `READ_UNCOMMITTED` isolation, answered by
    /// the partition leaders.
    ///
    /// This is the end-offset evidence of the book's specification, §4. Two obvious calls give
    /// other values: a watermark query on a `read_committed` consumer returns the LSO, and the
    /// cached watermarks come from a partition's last fetch response, which can predate the record
    /// being judged.
    ///
    /// # Errors
    /// [`KafkaError::Admin`] for a failed request or a partition that reports an error (named).
    pub fn high_watermarks(&self, partitions: &[(&str, i32)]) -> Result<Vec<i64>> {
        self.list_offsets(partitions, OffsetSpec::Latest, Isolation::ReadUncommitted)
    }

    /// The last stable offset (LSO: the first offset of the oldest open transaction, or the
    /// high watermark when none is open) of each partition, from one batched
    /// `ListOffsets(LATEST)` request with `READ_COMMITTED` isolation, answered by the partition
    /// leaders.
    ///
    /// The live-head evidence of event-time ordering (the book's specification, §5). librdkafka
    /// keeps the LSO of each fetch response (`rktp_ls_offset`) but exposes it only in its
    /// statistics JSON; `rd_kafka_get_watermark_offsets` returns the fetch response's high
    /// watermark. A reading taken after a poll is at or above the LSO of the responses that poll
    /// returned, so a channel judged at its head by it is at least as far as by the fetch
    /// response's.
    ///
    /// # Errors
    /// [`KafkaError::Admin`] for a failed request or a partition that reports an error (named).
    pub fn last_stable_offsets(&self, partitions: &[(&str, i32)]) -> Result<Vec<i64>> {
        self.list_offsets(partitions, OffsetSpec::Latest, Isolation::ReadCommitted)
    }

    /// The log start offset of each of `partitions` (in order): one batched
    /// `ListOffsets(EARLIEST)` request, asked again with fresh metadata while a leader is
    /// moving or restarting (within the admin's timeout).
    ///
    /// # Errors
    /// [`KafkaError::Admin`] for a failed request or a partition that reports an error (named).
    pub fn log_start_offsets(&self, partitions: &[(&str, i32)]) -> Result<Vec<i64>> {
        self.list_offsets(partitions, OffsetSpec::Earliest, Isolation::ReadUncommitted)
    }

    fn list_offsets(
        &self,
        partitions: &[(&str, i32)],
        spec: OffsetSpec,
        isolation: Isolation,
    ) -> Result<Vec<i64>> {
        self.list_retrying(partitions, spec, isolation, false)
    }

    /// [`Admin::list_offsets`]; with `fresh`, partitions of a topic just created, whose
    /// leaders may not know it yet (`UNKNOWN_TOPIC_OR_PARTITION` until the metadata reaches
    /// them, on a cluster of several brokers): asked again too.
    pub(super) fn list_retrying(
        &self,
        partitions: &[(&str, i32)],
        spec: OffsetSpec,
        isolation: Isolation,
        fresh: bool,
    ) -> Result<Vec<i64>> {
        let deadline = Instant::now() + self.timeout;
        // Attempts grow from 1 s to 5 s: a leader that died answers no attempt, and a short
        // first one lets the metadata refresh below find its successor within a second; a
        // slow but live broker gets the longer ones.
        let mut attempt = Duration::from_secs(1);
        loop {
            match self.list_once(partitions, spec, isolation, fresh, attempt) {
                Ok(offsets) => return Ok(offsets),
                // A leader that just moved or restarted (stale leader epoch, not the leader
                // yet): librdkafka refreshes its metadata; ask again.
                Err((true, e)) if Instant::now() < deadline => {
                    // The client's cached leader epochs are stale (a broker restarted): a
                    // metadata request for the topics refreshes them before asking again.
                    // One request for all topics, short: while the broker is away this must
                    // not eat the deadline (one 5 s wait per partition did).
                    debug!(error = %e, "listing offsets: retriable, refreshing metadata");
                    let _ = self
                        .client
                        .inner()
                        .fetch_metadata(None, Duration::from_secs(1));
                    std::thread::sleep(Duration::from_millis(50));
                    attempt = (attempt * 2).min(Duration::from_secs(5));
                }
                Err((_, e)) => return Err(e),
            }
        }
    }

    /// One `ListOffsets` request; the error says whether asking again may succeed.
    // `(bool, Error)` is 128 bytes, at clippy's bound; it is returned once per request.
    #[allow(clippy::result_large_err)]
    fn list_once(
        &self,
        partitions: &[(&str, i32)],
        spec: OffsetSpec,
        isolation: Isolation,
        fresh: bool,
        attempt: Duration,
    ) -> std::result::Result<Vec<i64>, (bool, Error)> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let query = OffsetQuery::new(partitions, spec).map_err(|e| {
            (
                false,
                Error::admin(
                    Operation::ListOffsets,
                    format!(
                        "topic name {:?} contains a NUL byte",
                        String::from_utf8_lossy(&e.into_vec())
                    ),
                ),
            )
        })?;
        let event = self
            .request(
                Operation::ListOffsets,
                None,
                // Short attempts: while leaders are unknown librdkafka waits out the whole
                // request timeout; the caller retries with fresh metadata instead.
                self.timeout.min(attempt),
                AdminCall::ListOffsets(&query),
                Some(isolation),
            )
            // No answer, a timeout, a transport failure: the broker may be restarting.
            // Asked again until the caller's deadline.
            .map_err(|e| (true, e))?;
        let mut found = std::collections::HashMap::new();
        for listed in event.listed_offsets() {
            let (topic, partition) = (listed.topic, listed.partition);
            if let Some(code) = listed.error {
                let retriable = matches!(
                    code,
                    RDKafkaErrorCode::FencedLeaderEpoch
                        | RDKafkaErrorCode::UnknownLeaderEpoch
                        | RDKafkaErrorCode::NotLeaderForPartition
                        | RDKafkaErrorCode::LeaderNotAvailable
                        | RDKafkaErrorCode::OffsetNotAvailable
                        | RDKafkaErrorCode::RequestTimedOut
                        | RDKafkaErrorCode::NetworkException
                        // The client's metadata predates the partition (just added).
                        | RDKafkaErrorCode::UnknownPartition
                ) || (fresh && code == RDKafkaErrorCode::UnknownTopicOrPartition);
                if let Some(refused) = crate::authorization::refused(
                    Operation::ListPartitionOffsets,
                    code,
                    Some(&topic),
                    crate::clients::ClientRole::Admin,
                    code,
                ) {
                    return Err((false, refused));
                }
                return Err((
                    retriable,
                    Error::from(
                        KafkaError::admin(Operation::ListPartitionOffsets, code.to_string())
                            .with_partition(topic, partition),
                    ),
                ));
            }
            if listed.offset < 0 {
                // An answer without an error but without an offset either (librdkafka's
                // "invalid", -1001): seen during a broker restart in fault injection (seed
                // 31), where it reached the gate as a high watermark and made a valid claim
                // look impossible. An offset asked for here is never negative: ask again.
                return Err((
                    true,
                    Error::from(
                        KafkaError::admin(
                            Operation::ListPartitionOffsets,
                            format!("offset {} in an answer without an error", listed.offset),
                        )
                        .with_partition(topic, partition),
                    ),
                ));
            }
            found.insert((topic, partition), listed.offset);
        }
        partitions
            .iter()
            .map(|(t, p)| {
                found.get(&(t.to_string(), *p)).copied().ok_or_else(|| {
                    (
                        false,
                        Error::from(
                            KafkaError::admin(
                                Operation::ListPartitionOffsets,
                                "not in the answer".into(),
                            )
                            .with_partition(t, *p),
                        ),
                    )
                })
            })
            .collect()
    }
}
