//! Secured clusters on the real broker's SASL_SSL listener (SCRAM-SHA-512 over TLS): every
//! client a stage creates — consumer, transactional producer, admin client, changelog restore
//! consumer — and a `CausalProducer`'s clients get the user's client settings; a wrong password
//! or an untrusted certificate is `KafkaError::Security` naming the listener and the mechanism,
//! well within the configured timeout, never a hang.
//!
//! With `$PARSLEY_BOOTSTRAP` pointing at another cluster there is no secure listener of ours:
//! the tests say so and pass.

use std::time::{Duration, Instant};

use parsley_runtime::KafkaError;
use parsley_runtime::rdkafka::types::RDKafkaErrorCode;
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, ClientSettings, Error, Runtime, RuntimeConfig,
};
use parsley_stage::Topology;
use parsley_testkit::broker::{self, SecureListener};
use parsley_testkit::fixtures::{
    CountKeys, committed_values, create_topic, key_on, next_failure, raw_producer, send_stamped,
    unique_topic, utf8_stage, wait_committed,
};

/// The local broker's secure listener, or `None` (said on stderr) on an external cluster.
fn listener() -> Option<SecureListener> {
    match broker::secure_listener() {
        Ok(Some(s)) => Some(s),
        Ok(None) if broker::uses_external_cluster() => {
            eprintln!("skipped: no secure listener on an external cluster");
            None
        }
        Ok(None) => panic!(
            "the local broker records no secure listener: restart it with \
             `cargo kafka down && cargo kafka up`"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// A runtime configuration for the secure listener `l`, with `timeout` for blocking calls.
fn secure_config(l: &SecureListener, timeout: Duration) -> RuntimeConfig {
    let mut config = RuntimeConfig::new(&l.bootstrap)
        .client_settings(ClientSettings::new().set_all(l.client_properties()));
    config.timeout = timeout;
    config
}

fn counting(app: &str, input: &str, output: &str) -> Topology {
    Topology::builder(app)
        .stage("count", CountKeys::new(output), |s| {
            utf8_stage(s, &[input], &[output])
        })
        .build()
        .unwrap()
}

#[test]
fn a_stage_runs_over_sasl_ssl_and_restores_its_state_over_it() {
    let Some(l) = listener() else { return };
    let input = create_topic("secure-in", 1);
    let output = create_topic("secure-out", 1);
    let p = raw_producer(None);
    let key = key_on(0, 1);
    for _ in 0..3 {
        send_stamped(&p, &input.name, 0, key.as_bytes(), b"x", None);
    }
    let app = unique_topic("secure");
    let run = || {
        let running = Runtime::new(
            counting(&app, &input.name, &output.name),
            secure_config(&l, Duration::from_secs(30)),
        )
        .start()
        .unwrap();
        wait_committed(&running, "count", 3);
        running.stop().unwrap();
    };
    run();
    // A second run restores the count from the changelog (the restore consumer connects over
    // the secure listener too) and goes on from it.
    for _ in 0..3 {
        send_stamped(&p, &input.name, 0, key.as_bytes(), b"x", None);
    }
    run();
    let expected: Vec<String> = (1..=6).map(|n| format!("{key}={n}")).collect();
    assert_eq!(committed_values(&output), expected);
}

/// Starts a counting stage with `l`'s settings and returns its error and how long it took.
fn failing_start(l: &SecureListener, timeout: Duration) -> (std::sync::Arc<Error>, Duration) {
    let input = create_topic("insecure-in", 1);
    let output = create_topic("insecure-out", 1);
    let app = unique_topic("insecure");
    let started = Instant::now();
    let running = Runtime::new(
        counting(&app, &input.name, &output.name),
        secure_config(l, timeout),
    )
    .start()
    .unwrap();
    let failure = next_failure(&running);
    let took = started.elapsed();
    let _ = running.stop();
    (failure, took)
}

#[test]
fn a_wrong_password_is_a_security_error_naming_the_listener_and_mechanism() {
    let Some(l) = listener() else { return };
    let timeout = Duration::from_secs(20);
    let (failure, took) = failing_start(&l.with_wrong_password(), timeout);
    eprintln!("wrong password: {failure} after {took:?}");
    assert!(
        matches!(&*failure, Error::Kafka(KafkaError::Security { listener, protocol, mechanism: Some(m), code, .. }) 
            if code.value == RDKafkaErrorCode::Authentication as i32 && **listener == *l.bootstrap && &**protocol == "SASL_SSL" && &**m == "SCRAM-SHA-512"),
        "{failure}"
    );
    assert!(
        failure.is_fatal() && !failure.is_transient(),
        "not retried: {failure}"
    );
    assert!(took < timeout, "reported within the timeout: {took:?}");
}

#[test]
fn the_admin_creating_a_topic_with_a_wrong_password_says_so_as_the_runtime_does() {
    let Some(l) = listener() else { return };
    let timeout = Duration::from_secs(20);
    let wrong = l.with_wrong_password();
    let admin = parsley_runtime::Admin::connect(
        &wrong.bootstrap,
        &ClientSettings::new().set_all(wrong.client_properties()),
        timeout,
    )
    .unwrap();
    let started = Instant::now();
    let err = admin
        .create_topic_if_absent(&parsley_runtime::TopicSpec::new(unique_topic("never"), 1))
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("admin, wrong password: {err} after {took:?}");
    assert!(
        matches!(&err, Error::Kafka(KafkaError::Security { listener, mechanism: Some(m), client: "admin", code, .. })
            if code.value == RDKafkaErrorCode::Authentication as i32 && **listener == *l.bootstrap && &**m == "SCRAM-SHA-512"),
        "{err}"
    );
    assert!(took < timeout, "reported within the timeout: {took:?}");
}

#[test]
fn an_untrusted_certificate_is_a_security_error_naming_the_listener() {
    let Some(l) = listener() else { return };
    let timeout = Duration::from_secs(20);
    let (failure, took) = failing_start(&l.with_untrusted_ca(), timeout);
    eprintln!("untrusted CA: {failure} after {took:?}");
    assert!(
        matches!(&*failure, Error::Kafka(KafkaError::Security { listener, protocol, code, message, .. }) 
            if code.value == RDKafkaErrorCode::SSL as i32 && **listener == *l.bootstrap && &**protocol == "SASL_SSL" && message.contains("certificate verify failed")),
        "{failure}"
    );
    assert!(took < timeout, "reported within the timeout: {took:?}");
}

#[test]
fn a_causal_producer_uses_the_settings_for_both_of_its_clients() {
    let Some(l) = listener() else { return };
    let topic = create_topic("secure-causal", 1);
    let config = |l: &SecureListener| {
        CausalProducerConfig::new(&l.bootstrap)
            .client_settings(ClientSettings::new().set_all(l.client_properties()))
    };
    let mut producer = CausalProducer::new(config(&l)).unwrap();
    producer.send(&topic.name, b"k", b"v").unwrap();
    let acked = producer.flush().unwrap();
    assert_eq!(acked.len(), 1);
    assert_eq!(committed_values(&topic), ["v"]);

    let mut refused = CausalProducer::new(config(&l.with_wrong_password())).unwrap();
    let started = Instant::now();
    let err = refused.send(&topic.name, b"k", b"w").unwrap_err();
    assert!(
        matches!(&err, Error::Kafka(KafkaError::Security { client: "admin", mechanism: Some(m), .. }) if &**m == "SCRAM-SHA-512"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}
