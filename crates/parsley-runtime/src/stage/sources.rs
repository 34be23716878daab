//! The identity of a stage's sources, checked while the stage runs.
//!
//! A source topic that is deleted and created again under its name is a new channel (a new topic
//! id, offsets from zero): the stage's committed offsets, gate frontiers and claims name the old
//! one. A recreated topic can also leave the consumer waiting without an error: after a broker
//! restart the old partitions' leader epochs are above zero, and the new topic's start again at
//! zero, which a client may take for stale metadata. So, besides the checks at an assignment and
//! when the consumer reports a source unknown, the stream thread describes its sources every
//! [`CHECK_EVERY`] and ends the stage with [`RecordError::SourceChanged`] (naming the old and new
//! topic ids) or [`RecordError::SourceDeleted`] as soon as one changed — never a silent stall. A
//! restart then starts the new channel at its log start (case C11). While the stage's consumer
//! reports a node unreachable the checks pause ([`AFTER_TRANSPORT_FAILURE`] after the last such
//! report): a description waits on the admin client's controller, which may be the node that
//! died, and would hold the stream thread — and the watch on a commit in flight — to its bound.
//!
//! Invariant: a stage runs only while every source has the id and partition count it had when
//! the stage started.

use std::time::{Duration, Instant};

use tracing::warn;

use crate::admin::Admin;
use parsley_task::context::TaskContext;
use parsley_task::error::{Error, Result};
use parsley_task::error::{RecordError, SetupError};
use parsley_task::topic::TopicInfo;

/// How often a running stage describes its sources (as often as its consumer refreshes its
/// metadata: `topic.metadata.refresh.interval.ms=5000`).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest a periodic check waits for the cluster's answer: a check that cannot be made
/// now is made at the next interval, and the stream thread is not held longer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the checks pause after the stage's consumer reported a node unreachable.
const AFTER_TRANSPORT_FAILURE: Duration = Duration::from_secs(30);

/// Checks that every source of `sources` (as resolved when the stage started) has the same id
/// and partition count in `now` (the same topics, described again, in the same order).
///
/// # Errors
/// [`RecordError::SourceChanged`] for the first source that changed.
pub(crate) fn compare(stage: &str, sources: &[TopicInfo], now: &[TopicInfo]) -> Result<()> {
    for (before, now) in sources.iter().zip(now) {
        if before.partitions != now.partitions || before.id != now.id {
            return Err(Error::Record(RecordError::SourceChanged {
                stage: stage.to_string(),
                topic: before.name.clone(),
                partitions: (before.partitions, now.partitions),
                recreated: before.id != now.id,
                ids: (before.id, now.id),
            }));
        }
    }
    Ok(())
}

/// When the sources were last described.
#[derive(Debug)]
pub(crate) struct SourceCheck {
    last: Instant,
}

impl SourceCheck {
    /// Checked just now (at startup).
    pub(crate) fn new() -> Self {
        SourceCheck {
            last: Instant::now(),
        }
    }
}

impl SourceCheck {
    /// The consumer reported a node unreachable: the next check waits [`AFTER_TRANSPORT_FAILURE`]
    /// from now (a description waits on the admin client's controller, which may be that node,
    /// holding the stream thread up to its bound).
    pub(crate) fn transport_failed(&mut self) {
        self.last = Instant::now() + AFTER_TRANSPORT_FAILURE - CHECK_EVERY;
    }

    /// Describes the sources of `ctx` with `admin` when [`CHECK_EVERY`] has passed since the
    /// last time (module docs), within `timeout` at most. A description that fails (the
    /// cluster unreachable, a broker restarting) proves nothing: it is logged and tried again
    /// at the next interval.
    ///
    /// # Errors
    /// [`RecordError::SourceChanged`], [`RecordError::SourceDeleted`].
    pub(crate) fn check(
        &mut self,
        admin: &Admin,
        ctx: &TaskContext,
        timeout: Duration,
    ) -> Result<()> {
        if self.last.elapsed() < CHECK_EVERY {
            return Ok(());
        }
        self.last = Instant::now();
        match source_change(admin, ctx, CHECK_TIMEOUT.min(timeout)) {
            Ok(Some(change)) => Err(change),
            Ok(None) => Ok(()),
            Err(e) => {
                warn!(error = %e, "cannot describe the sources now; checking again in {CHECK_EVERY:?}");
                Ok(())
            }
        }
    }
}

/// What changed in the sources of `ctx` since the stage started, described now with `admin` within
/// `timeout`: [`RecordError::SourceChanged`] or [`RecordError::SourceDeleted`], or `None` when
/// nothing did.
///
/// # Errors
/// The admin client's, when the sources cannot be described.
pub(crate) fn source_change(
    admin: &Admin,
    ctx: &TaskContext,
    timeout: Duration,
) -> Result<Option<Error>> {
    let names: Vec<&str> = ctx.sources.iter().map(|t| t.name.as_str()).collect();
    match admin.describe_topics_within(&names, timeout) {
        Ok(now) => Ok(compare(&ctx.stage, &ctx.sources, &now).err()),
        Err(Error::Setup(SetupError::UnknownTopic { topic })) => {
            Ok(Some(Error::Record(RecordError::SourceDeleted {
                stage: ctx.stage.clone(),
                topic,
            })))
        }
        Err(other) => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::TopicId;

    use super::*;

    #[test]
    fn a_recreated_or_repartitioned_source_is_named_with_its_old_and_new_ids() {
        let t = |id: u8, partitions| TopicInfo {
            name: "in".into(),
            id: TopicId::from_bytes([id; 16]),
            partitions,
        };
        assert!(compare("s", &[t(1, 2)], &[t(1, 2)]).is_ok());
        let err = compare("s", &[t(1, 2)], &[t(2, 2)]).unwrap_err();
        assert!(
            matches!(&err, Error::Record(RecordError::SourceChanged { topic, partitions: (2, 2), recreated: true, ids, .. })
                if topic == "in" && *ids == (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]))),
            "{err}"
        );
        assert!(err.to_string().contains("topic id"), "{err}");
        let err = compare("s", &[t(1, 2)], &[t(1, 3)]).unwrap_err();
        assert!(matches!(
            err,
            Error::Record(RecordError::SourceChanged {
                partitions: (2, 3),
                recreated: false,
                ..
            })
        ));
    }
}
