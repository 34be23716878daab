//! What a stage does with records it cannot take as they are: records whose stamp no truthful
//! sender can produce, and bad records.
//!
//! **Impossible stamps** (the book's specification, §4: a header that does not decode, a claim on
//! the record's own channel at or beyond itself, a claim beyond the channel's high watermark):
//! [`ImpossiblePolicy`] chooses, per stage:
//! - `Fail`: the stage stops with the typed error; the record's offset is not committed;
//! - `DeliverAndCount`: the record is delivered without its impossible claims (a malformed
//!   header: as unstamped), counted and logged;
//! - `DeadLetter`: the record goes to the dead-letter topic and is counted.
//!
//! **Bad records** (a key or value that does not decode or is missing where the stage needs
//! it, a handler error, an output refused for good: `RecordError::OutputRefused`):
//! [`BadRecordPolicy`] chooses `Fail`, `Skip` (counted per kind) or `DeadLetter`. An output
//! refused for good is found only after the record was handled, so the policy takes the input
//! record on the redo of its aborted transaction (the runtime's `Tasks::refused_input`), none
//! of its outputs written; the dead letter of a record whose output's timestamp was refused
//! gets the producer's clock. A skipped or dead-lettered record counts as processed: its offset commits
//! with the transaction, the node clock has observed it, records that claim it are delivered
//! after it, and it changes no fold state.
//!
//! **Dead letters.** A dead-lettered record is written in the same transaction as the input
//! offsets (nothing lost, nothing written twice), stamped by the task (it causally follows the
//! record it carries), with the original key and value, the original headers (the original
//! stamp renamed [`DLQ_STAMP_HEADER`]; a record of an event-time stage that was parked keeps
//! its user headers only, not its stamp: the coordinate headers name where to read it), and
//! these headers:
//!
//! | header | value |
//! |---|---|
//! | [`DLQ_SOURCE_HEADER`] | `topic/partition@offset` |
//! | [`DLQ_STAGE_HEADER`] | the stage |
//! | [`DLQ_TOPIC_HEADER`], [`DLQ_PARTITION_HEADER`], [`DLQ_OFFSET_HEADER`] | the source coordinate (decimal numbers) |
//! | [`DLQ_KIND_HEADER`] | `impossible-stamp`, or a [`BadRecordKind`] name |
//! | [`DLQ_REASON_HEADER`] | the error, rendered |
//!
//! Nothing is dropped silently under any policy: every impossible stamp and bad record is
//! counted in the stage's metrics before the policy applies.

use std::borrow::Cow;

use parsley_gate::Resolution;
use parsley_stage::{BadRecordKind, BadRecordPolicy, ImpossiblePolicy};
use tracing::warn;

use super::output::Header;
use crate::error::{Error, Result};

/// Header of a dead-lettered record naming where it came from (`topic/partition@offset`).
pub const DLQ_SOURCE_HEADER: &str = "parsley.dlq.source";
/// Header of a dead-lettered record saying why it was dead-lettered (the error, rendered).
pub const DLQ_REASON_HEADER: &str = "parsley.dlq.reason";
/// Header of a dead-lettered record naming the stage that sent it there.
pub const DLQ_STAGE_HEADER: &str = "parsley.dlq.stage";
/// Header of a dead-lettered record naming its source topic.
pub const DLQ_TOPIC_HEADER: &str = "parsley.dlq.topic";
/// Header of a dead-lettered record giving its source partition (decimal).
pub const DLQ_PARTITION_HEADER: &str = "parsley.dlq.partition";
/// Header of a dead-lettered record giving its source offset (decimal).
pub const DLQ_OFFSET_HEADER: &str = "parsley.dlq.offset";
/// Header of a dead-lettered record naming the kind of failure: `impossible-stamp`, or the
/// name of a [`BadRecordKind`].
pub const DLQ_KIND_HEADER: &str = "parsley.dlq.kind";
/// Header of a dead-lettered record holding the stamp header it carried (its own stamp header
/// is the stamp of the task that dead-lettered it).
pub const DLQ_STAMP_HEADER: &str = "parsley.dlq.stamp";
/// The kind header's value for an impossible stamp.
pub const IMPOSSIBLE_STAMP_KIND: &str = "impossible-stamp";

/// What becomes of a record whose impossible stamp the gate reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Impossible {
    /// Deliver it without its impossible claims.
    Deliver,
    /// Remove it from the gate and send it to the dead-letter topic with this reason.
    DeadLetter(String),
}

impl Impossible {
    /// How the gate resolves the record.
    pub fn resolution(&self) -> Resolution {
        match self {
            Impossible::Deliver => Resolution::Deliver,
            Impossible::DeadLetter(_) => Resolution::Discard,
        }
    }
}

/// Applies `policy` to an impossible stamp the gate found (`error` names it).
///
/// # Errors
/// `error` itself under [`ImpossiblePolicy::Fail`].
pub fn on_impossible(policy: &ImpossiblePolicy, error: Error) -> Result<Impossible> {
    match policy {
        ImpossiblePolicy::Fail => Err(error),
        ImpossiblePolicy::DeliverAndCount => {
            warn!(%error, "delivering without its impossible claims");
            Ok(Impossible::Deliver)
        }
        ImpossiblePolicy::DeadLetter { .. } => Ok(Impossible::DeadLetter(error.to_string())),
    }
}

/// Applies `policy` to a record whose stamp header does not decode (`error` names it): the
/// record is then offered to the gate unstamped; `Some(reason)` when it goes to the
/// dead-letter topic on delivery instead of the handler.
///
/// # Errors
/// `error` itself under [`ImpossiblePolicy::Fail`].
pub fn on_malformed(policy: &ImpossiblePolicy, error: Error) -> Result<Option<Box<str>>> {
    match policy {
        ImpossiblePolicy::Fail => Err(error),
        ImpossiblePolicy::DeliverAndCount => {
            warn!(%error, "delivering a record with a malformed stamp as unstamped");
            Ok(None)
        }
        ImpossiblePolicy::DeadLetter { .. } => Ok(Some(error.to_string().into())),
    }
}

/// Where a dead-lettered record came from, and why.
pub struct DeadLetterCause<'a> {
    /// The stage.
    pub stage: &'a str,
    /// The source topic.
    pub topic: &'a str,
    /// The source partition.
    pub partition: i32,
    /// The source offset.
    pub offset: i64,
    /// `impossible-stamp`, or a [`BadRecordKind`] name.
    pub kind: &'a str,
    /// The error, rendered.
    pub reason: &'a str,
}

impl DeadLetterCause<'_> {
    /// `topic/partition@offset`.
    pub fn source(&self) -> String {
        format!("{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// The headers of a dead-lettered record besides its own stamp (module docs): the original
/// headers, its original stamp renamed, then the cause.
pub fn dead_letter_headers(cause: &DeadLetterCause<'_>, original: &[Header]) -> Vec<Header> {
    let mut headers: Vec<Header> = original
        .iter()
        .map(|(name, value)| {
            if parsley_clock::is_stamp_header(name) {
                (Cow::Borrowed(DLQ_STAMP_HEADER), value.clone())
            } else {
                (name.clone(), value.clone())
            }
        })
        .collect();
    let own = [
        (DLQ_SOURCE_HEADER, cause.source()),
        (DLQ_STAGE_HEADER, cause.stage.to_string()),
        (DLQ_TOPIC_HEADER, cause.topic.to_string()),
        (DLQ_PARTITION_HEADER, cause.partition.to_string()),
        (DLQ_OFFSET_HEADER, cause.offset.to_string()),
        (DLQ_KIND_HEADER, cause.kind.to_string()),
        (DLQ_REASON_HEADER, cause.reason.to_string()),
    ];
    headers.extend(
        own.into_iter()
            .map(|(name, value)| (Cow::Borrowed(name), Some(value.into_bytes()))),
    );
    headers
}

/// What becomes of a bad record of `kind` (`error` names it) under `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// Count it and go on.
    Skip,
    /// Send it to the dead-letter topic with this reason.
    DeadLetter(String),
}

/// Applies `policy` to a bad record of `kind`; `error` names it.
///
/// # Errors
/// `error` itself under [`BadRecordPolicy::Fail`].
pub fn on_bad_record(policy: &BadRecordPolicy, kind: BadRecordKind, error: Error) -> Result<Bad> {
    match policy {
        BadRecordPolicy::Fail => Err(error),
        BadRecordPolicy::Skip => {
            warn!(%error, kind = kind.name(), "bad record skipped");
            Ok(Bad::Skip)
        }
        BadRecordPolicy::DeadLetter { .. } => Ok(Bad::DeadLetter(error.to_string())),
    }
}
