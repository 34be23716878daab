//! The local broker's secure listener (SASL/SCRAM-SHA-512 over TLS) on the real broker: a
//! client with the recorded credentials and CA fetches metadata over it; a client with a
//! wrong password, or trusting a CA that did not sign the broker's certificate, does not.
//!
//! What librdkafka reports in the failure cases (2.12.1, measured on this broker): the
//! metadata request does not fail fast — it returns `_TRANSPORT` (broker transport failure)
//! only when its own timeout runs out — while the cause arrives as an error event (the
//! context's `error` callback, and `Err` from `BaseConsumer::poll`) as soon as the handshake
//! fails: `_AUTHENTICATION` for a wrong password (after about 0.3 s: the broker holds back its
//! answer to a failed authentication, `connection.failed.authentication.delay.ms`), `_SSL`
//! ("certificate verify failed") for an untrusted CA (within a few tens of milliseconds).
//! Each test prints what it saw and when (`--nocapture`).
//!
//! With `$PARSLEY_BOOTSTRAP` pointing at another cluster than the local broker there is no
//! secure listener to test: the tests say so and pass.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parsley_testkit::broker::{self, SecureListener};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

/// How long a metadata request of a client that should succeed may take; a safety net,
/// never a synchronisation point (it returns as soon as the broker answers).
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a metadata request of a client that should fail may take: librdkafka returns
/// only at this timeout, so it is short.
const REFUSED_METADATA_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a failing client may take to report why; the test fails after it.
const ERROR_DEADLINE: Duration = Duration::from_secs(10);

/// The local broker's secure listener, or `None` (said on stderr) on an external cluster.
fn listener() -> Option<SecureListener> {
    match broker::secure_listener() {
        Ok(Some(s)) => Some(s),
        Ok(None) if broker::uses_external_cluster() => {
            eprintln!(
                "skipped: {} points at another cluster, which has no secure listener of ours",
                broker::BOOTSTRAP_ENV
            );
            None
        }
        Ok(None) => panic!(
            "the local broker records no secure listener: it was started before the listener \
             existed; restart it with `cargo kafka down && cargo kafka up`"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Records the error callbacks of a client, with when they came.
struct Errors {
    started: Instant,
    seen: Mutex<Vec<(Duration, KafkaError, String)>>,
}

impl ClientContext for Errors {
    fn error(&self, error: KafkaError, reason: &str) {
        self.seen
            .lock()
            .unwrap()
            .push((self.started.elapsed(), error, reason.to_string()));
    }
}

impl ConsumerContext for Errors {}

/// What a client with `properties` saw at `bootstrap`.
struct Outcome {
    /// The metadata request's result and how long it took.
    metadata: (Result<Metadata, KafkaError>, Duration),
    /// The first error event and when it came, if one came before [`ERROR_DEADLINE`] and
    /// before the broker answered the metadata request.
    first_error: Option<(Duration, KafkaError)>,
    /// The error callbacks: when, what and librdkafka's reason.
    callbacks: Vec<(Duration, KafkaError, String)>,
}

/// Creates a consumer (no group) for `bootstrap` with `properties`, requests metadata with
/// `timeout`, and meanwhile polls the client for error events.
fn connect(bootstrap: &str, properties: &[(String, String)], timeout: Duration) -> Outcome {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in properties {
        config.set(k, v);
    }
    let started = Instant::now();
    let consumer: BaseConsumer<Errors> = config
        .create_with_context(Errors {
            started,
            seen: Mutex::new(Vec::new()),
        })
        .expect("consumer");
    let answered = AtomicBool::new(false);
    let (metadata, first_error) = std::thread::scope(|s| {
        let request = s.spawn(|| {
            let result = consumer.fetch_metadata(None, timeout);
            answered.store(result.is_ok(), Ordering::Release);
            (result, started.elapsed())
        });
        // Polling serves the client's events: it waits for evidence (an error event, or the
        // broker's answer), never longer than the deadline.
        let mut first_error = None;
        while first_error.is_none()
            && !answered.load(Ordering::Acquire)
            && started.elapsed() < ERROR_DEADLINE
        {
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                first_error = Some((started.elapsed(), e));
            }
        }
        (request.join().expect("metadata thread"), first_error)
    });
    let callbacks = std::mem::take(&mut *consumer.context().seen.lock().unwrap());
    Outcome {
        metadata,
        first_error,
        callbacks,
    }
}

impl Outcome {
    /// Prints what happened, for the record.
    fn report(&self, case: &str) {
        let (result, took) = &self.metadata;
        match result {
            Ok(m) => eprintln!(
                "{case}: metadata after {took:?}: {} broker(s)",
                m.brokers().len()
            ),
            Err(e) => eprintln!("{case}: metadata failed after {took:?}: {e}"),
        }
        match &self.first_error {
            Some((at, e)) => eprintln!("{case}: first error event after {at:?}: {e}"),
            None => eprintln!("{case}: no error event"),
        }
        for (at, e, reason) in &self.callbacks {
            eprintln!("{case}: error callback after {at:?}: {e}: {reason}");
        }
    }

    /// Asserts that the client was refused: the metadata request failed, and an error event
    /// with `code` came within [`ERROR_DEADLINE`].
    fn assert_refused(&self, case: &str, code: RDKafkaErrorCode) {
        self.report(case);
        assert!(
            self.metadata.0.is_err(),
            "{case}: the broker answered a metadata request"
        );
        match &self.first_error {
            Some((_, KafkaError::MessageConsumption(c))) if *c == code => {}
            other => panic!("{case}: expected an error event {code:?}, got {other:?}"),
        }
        assert!(
            self.callbacks
                .iter()
                .any(|(_, e, _)| matches!(e, KafkaError::Global(c) if *c == code)),
            "{case}: the error callback did not report {code:?}: {:?}",
            self.callbacks
        );
    }
}

#[test]
fn a_client_with_the_credentials_and_the_ca_fetches_metadata_over_the_secure_listener() {
    let Some(secure) = listener() else { return };
    let outcome = connect(
        &secure.bootstrap,
        &secure.client_properties(),
        METADATA_TIMEOUT,
    );
    outcome.report("right credentials");
    let (result, _) = &outcome.metadata;
    let metadata = result.as_ref().expect("metadata over SASL_SSL");
    // The broker advertises the listener the request came in on: the secure one.
    let brokers: Vec<String> = metadata
        .brokers()
        .iter()
        .map(|b| format!("{}:{}", b.host(), b.port()))
        .collect();
    assert_eq!(brokers, std::slice::from_ref(&secure.bootstrap));
    assert!(
        outcome.first_error.is_none() && outcome.callbacks.is_empty(),
        "errors on a good connection: {:?} {:?}",
        outcome.first_error,
        outcome.callbacks
    );
}

#[test]
fn a_wrong_password_is_refused_with_an_authentication_error() {
    let Some(secure) = listener() else { return };
    let wrong = secure.with_wrong_password();
    assert_ne!(wrong.password, secure.password);
    connect(
        &wrong.bootstrap,
        &wrong.client_properties(),
        REFUSED_METADATA_TIMEOUT,
    )
    .assert_refused("wrong password", RDKafkaErrorCode::Authentication);
}

#[test]
fn a_client_that_trusts_another_ca_fails_the_tls_handshake() {
    let Some(secure) = listener() else { return };
    let untrusted = secure.with_untrusted_ca();
    assert_ne!(
        std::fs::read(&untrusted.ca_pem).expect("untrusted CA"),
        std::fs::read(&secure.ca_pem).expect("CA")
    );
    connect(
        &untrusted.bootstrap,
        &untrusted.client_properties(),
        REFUSED_METADATA_TIMEOUT,
    )
    .assert_refused("untrusted CA", RDKafkaErrorCode::SSL);
}

#[test]
fn a_client_without_the_ca_fails_the_tls_handshake_against_the_system_store() {
    let Some(secure) = listener() else { return };
    // Without `ssl.ca.location` librdkafka verifies against the system's CA store, which
    // does not hold the throw-away CA either.
    let system_store: Vec<_> = secure
        .client_properties()
        .into_iter()
        .filter(|(k, _)| k != "ssl.ca.location")
        .collect();
    connect(&secure.bootstrap, &system_store, REFUSED_METADATA_TIMEOUT)
        .assert_refused("no ssl.ca.location", RDKafkaErrorCode::SSL);
}
