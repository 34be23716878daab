//! The stage's policy for records whose stamp no truthful sender can produce (DESIGN.md §4):
//! a header that does not decode, a claim on the record's own channel at or beyond itself, a
//! claim beyond the channel's high watermark. [`ImpossiblePolicy`] chooses, per stage:
//! - `Fail`: the stage stops with the typed error; the record's offset is not committed;
//! - `DeliverAndCount`: the record is delivered without its impossible claims (a malformed
//!   header: as unstamped), counted and logged;
//! - `DeadLetter`: the record goes, stamped by the task, to the dead-letter topic in the same
//!   transaction as the input offsets, with headers naming its source coordinate
//!   ([`DLQ_SOURCE_HEADER`]) and the reason ([`DLQ_REASON_HEADER`]), and is counted.
//!
//! Nothing is dropped silently under any policy: every impossible stamp is counted in the
//! stage's and the task's metrics before the policy applies.

use parsley_gate::Resolution;
use parsley_stage::ImpossiblePolicy;
use tracing::warn;

use crate::error::{Error, Result};

/// Header of a dead-lettered record naming where it came from (`topic/partition@offset`).
pub const DLQ_SOURCE_HEADER: &str = "parsley.dlq.source";
/// Header of a dead-lettered record saying why it was dead-lettered.
pub const DLQ_REASON_HEADER: &str = "parsley.dlq.reason";

/// What becomes of a record whose impossible stamp the gate reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Impossible {
    /// Deliver it without its impossible claims.
    Deliver,
    /// Remove it from the gate and send it to the dead-letter topic with this reason.
    DeadLetter(String),
}

impl Impossible {
    /// How the gate resolves the record.
    pub(crate) fn resolution(&self) -> Resolution {
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
pub(crate) fn on_impossible(policy: &ImpossiblePolicy, error: Error) -> Result<Impossible> {
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
pub(crate) fn on_malformed(policy: &ImpossiblePolicy, error: Error) -> Result<Option<Box<str>>> {
    match policy {
        ImpossiblePolicy::Fail => Err(error),
        ImpossiblePolicy::DeliverAndCount => {
            warn!(%error, "delivering a record with a malformed stamp as unstamped");
            Ok(None)
        }
        ImpossiblePolicy::DeadLetter { .. } => Ok(Some(error.to_string().into())),
    }
}

/// The headers of a dead-lettered record besides its stamp: its source coordinate `source`
/// (`topic/partition@offset`) and the reason.
pub(crate) fn dead_letter_headers(source: String, reason: &str) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (DLQ_SOURCE_HEADER, source.into_bytes()),
        (DLQ_REASON_HEADER, reason.as_bytes().to_vec()),
    ]
}
