//! What the runtime's clients say about librdkafka: its log lines, forwarded to `tracing`
//! (target `librdkafka`) with the harmless start-up warnings demoted, and the waits of
//! initialising transactions, said once at INFO.
//!
//! librdkafka logs through the client's main queue (rdkafka sets `log.queue`), so a line is
//! emitted only when the thread that owns the client serves that queue — for a stage's
//! producer, after a blocking call such as `init_transactions` has returned, often well after
//! what it reports. A wait is therefore said by the caller that waits, from the error a
//! time-sliced call returns ([`init_wait`]), and librdkafka's late line about the same thing
//! is demoted to DEBUG ([`forward`]).

use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, error, info, warn};

/// librdkafka's warnings that a normal start can show and that say nothing is wrong: its
/// facility, a part of its message, and why it is harmless. Each is forwarded at DEBUG.
const HARMLESS: &[(&str, &str, &str)] = &[(
    // The producer's `InitProducerId` met a transaction coordinator that is still loading
    // its state (the first transactional client of a new cluster creates
    // `__transaction_state`; a broker restart or a coordinator move reloads it). librdkafka
    // retries every 500 ms; the wait itself is said at INFO by `init_wait`, when it happens,
    // and a coordinator that never loads ends the start with the init's error.
    "GETPID",
    "Coordinator load in progress",
    "the transaction coordinator is loading; retried",
)];

/// Forwards one librdkafka log line to `tracing` as rdkafka's default `ClientContext::log`
/// does (target `librdkafka`), except the [`HARMLESS`] warnings, which go at DEBUG.
pub(crate) fn forward(level: RDKafkaLogLevel, fac: &str, message: &str) {
    if let Some((_, _, why)) = harmless(level, fac, message) {
        debug!(target: "librdkafka", harmless = why, "librdkafka: {fac} {message}");
        return;
    }
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        RDKafkaLogLevel::Warning => warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            info!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        RDKafkaLogLevel::Debug => debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
    }
}

/// The [`HARMLESS`] entry a warning matches, if any.
fn harmless(
    level: RDKafkaLogLevel,
    fac: &str,
    message: &str,
) -> Option<&'static (&'static str, &'static str, &'static str)> {
    if !matches!(level, RDKafkaLogLevel::Warning) {
        return None;
    }
    HARMLESS
        .iter()
        .find(|(f, part, _)| *f == fac && message.contains(part))
}

/// The topic of a transactional producer's partition that the broker refused to add to the
/// transaction for want of an ACL, from librdkafka's line saying so (facility `ADDPARTS`:
/// `Failed to add partition "TOPIC" [P] to transaction: Broker: Topic authorization failed`).
///
/// librdkafka reports that refusal only in this line: the transaction becomes abortable, and
/// every record queued for it fails with `_PURGE_QUEUE`, which names no cause. The producer's
/// context keeps the topics named here, so that such a purge is reported as the refusal it
/// follows (module `outbox`).
pub(crate) fn refused_partition<'a>(fac: &str, message: &'a str) -> Option<&'a str> {
    if fac != "ADDPARTS" || !message.contains("Topic authorization failed") {
        return None;
    }
    let (_, rest) = message.split_once("Failed to add partition \"")?;
    rest.split_once('"').map(|(topic, _)| topic)
}

/// How long one slice of `init_transactions` may block before the caller looks at why it
/// waits: a start that waits for nothing initialises in well under a second.
pub(crate) const INIT_SLICE: Duration = Duration::from_secs(1);

/// What initialising transactions waits for, when a slice of it ends with retriable error
/// `code` (librdkafka reports the last error of its own retries): `None` for a plain timeout.
/// `timeout` is the longest the whole init may take.
pub(crate) fn init_wait(code: RDKafkaErrorCode, timeout: Duration) -> Option<String> {
    let what = match code {
        RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut => return None,
        RDKafkaErrorCode::CoordinatorLoadInProgress => {
            "the transaction coordinator is still loading its state (COORDINATOR_LOAD_IN_PROGRESS: \
             a new cluster's first transactional client, a broker restart or a coordinator move)"
                .to_string()
        }
        RDKafkaErrorCode::ConcurrentTransactions => {
            "the transaction coordinator is still completing this transactional id's previous \
             transaction (CONCURRENT_TRANSACTIONS: the commit or abort markers of the process \
             this one replaces)"
                .to_string()
        }
        RDKafkaErrorCode::CoordinatorNotAvailable | RDKafkaErrorCode::NotCoordinator => {
            format!("the transaction coordinator is not available yet ({code:?})")
        }
        other => format!("its last attempt failed with {other:?}"),
    };
    Some(format!(
        "initialising transactions waits: {what}; librdkafka retries until it can, at most \
         {timeout:?} (the runtime's timeout)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_warnings_are_demoted() {
        let seen = "[thrd:main]: Failed to acquire transactional PID from broker \
                    TxnCoordinator/1: Broker: Coordinator load in progress: retrying";
        assert!(harmless(RDKafkaLogLevel::Warning, "GETPID", seen).is_some());
        assert!(harmless(RDKafkaLogLevel::Error, "GETPID", seen).is_none());
        let other = "[thrd:main]: Failed to acquire transactional PID from broker \
                     TxnCoordinator/1: Broker: Transactional Id authorization failed";
        assert!(harmless(RDKafkaLogLevel::Warning, "GETPID", other).is_none());
    }

    #[test]
    fn a_partition_refused_for_want_of_an_acl_names_its_topic() {
        let line = "[thrd:sasl_ssl://127.0.0.1:36491/bootstrap]: sasl_ssl://127.0.0.1:36491/1: \
                    Failed to add partition \"app-route-repartition\" [0] to transaction: \
                    Broker: Topic authorization failed";
        assert_eq!(
            refused_partition("ADDPARTS", line),
            Some("app-route-repartition")
        );
        assert_eq!(refused_partition("TXNERR", line), None);
        let other = "Failed to add partition \"t\" [0] to transaction: Broker: Not leader";
        assert_eq!(refused_partition("ADDPARTS", other), None);
    }

    #[test]
    fn an_init_wait_names_what_it_waits_for_and_the_longest_it_can_take() {
        let loading = init_wait(
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(
            loading.contains("COORDINATOR_LOAD_IN_PROGRESS"),
            "{loading}"
        );
        assert!(loading.contains("at most 30s"), "{loading}");
        assert!(
            init_wait(
                RDKafkaErrorCode::ConcurrentTransactions,
                Duration::from_secs(30)
            )
            .unwrap()
            .contains("previous transaction")
        );
        assert_eq!(
            init_wait(RDKafkaErrorCode::OperationTimedOut, Duration::from_secs(30)),
            None
        );
    }
}
