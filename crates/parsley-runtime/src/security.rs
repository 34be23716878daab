//! Failures to authenticate to the cluster or to set up TLS with it, as librdkafka reports
//! them.
//!
//! librdkafka does not fail a request to a broker it cannot authenticate to: the request waits
//! until its own timeout and then fails with a transport error. The cause arrives on its own, as an
//! error event — `_AUTHENTICATION` after a failed SASL exchange (about 0.3 s for a wrong SCRAM
//! password on the project's broker), `_SSL` after a failed handshake (an untrusted or mismatched
//! certificate, within milliseconds). So every client context of the runtime keeps a
//! [`SecurityWatch`] that records the first such event, and a call that waits on the cluster looks
//! at it between short waits: it fails with
//! [`KafkaError::Security`](parsley_task::error::KafkaError::Security) naming the listener, the
//! security protocol and the SASL mechanism as soon as the event arrives, and never later than its
//! own timeout.
//!
//! Invariant: a watch holds the first security failure its client reported, and only such a
//! failure (transport errors of a broker restarting are not recorded).

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::error;

use crate::clients::ClientRole;
use parsley_task::error;
use parsley_task::error::Error;

/// How long a wait on the cluster blocks before it looks at its client's watch again.
pub(crate) const WATCH_STEP: Duration = Duration::from_millis(50);

/// Whether `code` says authentication or TLS failed (not a transient state of the connection).
pub(crate) fn is_security_failure(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::UnsupportedSASLMechanism
            | RDKafkaErrorCode::IllegalSASLState
    )
}

/// What a client connects to and with, for
/// [`KafkaError::Security`](parsley_task::error::KafkaError::Security).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The client's role.
    pub role: ClientRole,
    /// `bootstrap.servers`.
    pub listener: String,
    /// `security.protocol` (librdkafka's default: `plaintext`).
    pub protocol: String,
    /// `sasl.mechanisms`, when the protocol uses SASL.
    pub mechanism: Option<String>,
}

impl Endpoint {
    /// The endpoint a client made from `config` connects to.
    pub(crate) fn of(config: &ClientConfig, role: ClientRole) -> Self {
        let protocol = config
            .get("security.protocol")
            .unwrap_or("plaintext")
            .to_string();
        let mechanism = protocol.to_ascii_lowercase().starts_with("sasl").then(|| {
            config
                .get("sasl.mechanisms")
                .unwrap_or("GSSAPI")
                .to_string()
        });
        Endpoint {
            role,
            listener: config
                .get("bootstrap.servers")
                .unwrap_or_default()
                .to_string(),
            protocol,
            mechanism,
        }
    }

    /// The typed error for a security failure `code` (`message`: librdkafka's words).
    pub(crate) fn error(&self, code: RDKafkaErrorCode, message: String) -> Error {
        Error::Kafka(error::KafkaError::Security {
            listener: self.listener.as_str().into(),
            protocol: self.protocol.as_str().into(),
            mechanism: self.mechanism.as_deref().map(Into::into),
            client: self.role.name(),
            code: crate::client_error::code(code),
            message: message.into(),
        })
    }
}

/// The first security failure a client reported (module docs).
#[derive(Debug)]
pub(crate) struct SecurityWatch {
    endpoint: Endpoint,
    failure: Mutex<Option<(RDKafkaErrorCode, String)>>,
}

impl SecurityWatch {
    /// A watch for a client connecting to `endpoint`.
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        SecurityWatch {
            endpoint,
            failure: Mutex::new(None),
        }
    }

    /// Handles an error event of the client (`ClientContext::error`): a security failure is
    /// recorded; every event is logged, as librdkafka's default handler does.
    pub(crate) fn event(&self, error: &KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code()
            && is_security_failure(code)
        {
            let mut failure = self.failure.lock().expect("security watch");
            failure.get_or_insert_with(|| (code, reason.to_string()));
        }
        error!(target: "librdkafka", "librdkafka: {error}: {reason}");
    }

    /// The failure recorded so far, as the typed error; `None` while there is none.
    pub(crate) fn error(&self) -> Option<Error> {
        let failure = self.failure.lock().expect("security watch");
        failure
            .as_ref()
            .map(|(code, message)| self.endpoint.error(*code, message.clone()))
    }

    /// `error` unless a security failure was recorded: that one then (it says why the call
    /// failed; `error` is usually a timeout).
    pub(crate) fn explain(&self, error: Error) -> Error {
        self.error().unwrap_or(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_security_failure_is_kept_and_named_by_endpoint() {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "b:9094")
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanisms", "SCRAM-SHA-512");
        let watch = SecurityWatch::new(Endpoint::of(&c, ClientRole::Admin));
        watch.event(
            &KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "disconnected",
        );
        assert!(
            watch.error().is_none(),
            "a transport error is not a security failure"
        );
        watch.event(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error: invalid credentials",
        );
        watch.event(&KafkaError::Global(RDKafkaErrorCode::SSL), "later");
        let e = watch.error().unwrap();
        assert!(
            matches!(&e, Error::Kafka(error::KafkaError::Security { listener, protocol, mechanism: Some(m), client: "admin", code, message })
                if code.value == RDKafkaErrorCode::Authentication as i32 && &**listener == "b:9094" && &**protocol == "SASL_SSL" && &**m == "SCRAM-SHA-512" && message.contains("invalid credentials")),
            "{e}"
        );
        assert!(e.to_string().contains("b:9094") && e.to_string().contains("SCRAM-SHA-512"));
        let plain = Endpoint::of(
            ClientConfig::new().set("bootstrap.servers", "b:9092"),
            ClientRole::Consumer,
        );
        assert_eq!(
            (plain.protocol.as_str(), plain.mechanism),
            ("plaintext", None)
        );
    }
}
