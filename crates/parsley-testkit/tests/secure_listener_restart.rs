//! A broker restart keeps the secure listener: same address, credentials (the least-privilege
//! user's too) and CA, and a client with them fetches metadata over it again.
//!
//! One test in its own binary: it restarts the shared local broker, which other tests of the
//! same binary would see go away. Ignored by default: a restart takes about 8 s, and the tests
//! that run after it in the suite would meet a broker still loading its coordinators. Run it
//! with `cargo test -p parsley-testkit --test secure_listener_restart -- --ignored`.

use std::time::Duration;

use parsley_testkit::broker;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

#[test]
#[ignore = "restarts the shared local broker (about 8 s); run with --ignored"]
fn a_restart_keeps_the_secure_listener_its_credentials_and_its_ca() {
    if broker::uses_external_cluster() {
        eprintln!(
            "skipped: {} points at another cluster, which this test does not restart",
            broker::BOOTSTRAP_ENV
        );
        return;
    }
    let before = broker::secure_listener()
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("the local broker records a secure listener");
    let ca_before = std::fs::read(&before.ca_pem).expect("CA certificate");
    let least_before = broker::least_privilege_listener()
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("the local broker records its least-privilege user");

    let plaintext = broker::restart().unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(broker::bootstrap().unwrap(), plaintext);
    let after = broker::secure_listener()
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("the restarted broker records its secure listener");
    assert_eq!(after, before);
    assert_eq!(
        broker::least_privilege_listener().unwrap(),
        Some(least_before),
        "the least-privilege user's credentials are kept"
    );
    assert_eq!(
        std::fs::read(&after.ca_pem).expect("CA certificate"),
        ca_before
    );
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &after.bootstrap);
    for (k, v) in after.client_properties() {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().expect("consumer");
    // `restart` returned once this listener answered; this request is the test's own evidence.
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata over SASL_SSL after the restart");
}
