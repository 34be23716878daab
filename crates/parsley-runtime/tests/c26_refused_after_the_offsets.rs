//! Case C26 on the real broker: a produce refused after the input offsets were staged.
//!
//! In a stage's commit the outputs are acknowledged before anything else, so an output refused
//! by the broker is known before the offsets are sent (cases C16, C17). The changelog records
//! are not waited for: the offsets are sent and `EndTxn` called while they are in flight, and
//! the commit's own flush meets their delivery reports. Here the changelog topic has
//! `max.message.bytes=2000` and one key's fold state grows to 3,000 bytes, so the broker
//! refuses that changelog record of a transaction whose offsets are being sent. Right value:
//! the transaction aborts, the group's committed offset does not move, nothing of it is
//! visible; once the changelog takes such records again the work is redone exactly once.

use parsley_runtime::rdkafka::ClientConfig;
use parsley_runtime::rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use parsley_runtime::rdkafka::client::DefaultClientContext;
use parsley_runtime::{Admin, Runtime, RuntimeConfig, TopicSpec, changelog_topic};
use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_values, create_topic, group_offset, raw_producer, send_stamped,
    unique_topic, wait_committed, wait_metrics,
};

/// The changelog's record limit, and the fold state of a `big` record (over it).
const LIMIT: &str = "2000";
const BIG_STATE: usize = 3000;

/// Emits `key=seen` for each record; its fold state is the last value, padded to
/// [`BIG_STATE`] bytes when the value is `big`.
struct Remember(String);

impl Handler for Remember {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = String;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<String>,
    ) -> HandlerResult<String, String, String> {
        let state = if r.value == "big" {
            "x".repeat(BIG_STATE)
        } else {
            r.value.clone()
        };
        let line = format!("{}=seen", r.key);
        Ok(Step::none()
            .set_state(state)
            .emit(self.0.as_str(), r.key, line))
    }
}

/// Sets `max.message.bytes` of the compacted changelog `topic` (the whole topic config is set:
/// `AlterConfigs` replaces it).
fn set_changelog_limit(topic: &str, limit: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let config = AlterConfig::new(ResourceSpecifier::Topic(topic))
        .set("cleanup.policy", "compact")
        .set("max.message.bytes", limit);
    let results = futures::executor::block_on(admin.alter_configs(
        [&config],
        &AdminOptions::new().request_timeout(Some(DEADLINE)),
    ))
    .unwrap();
    for r in results {
        r.unwrap();
    }
}

#[test]
fn c26_a_changelog_write_refused_after_the_offsets_aborts_and_the_offset_stays() {
    let input = create_topic("c26-in", 1);
    let output = create_topic("c26-out", 1);
    let app = unique_topic("c26");
    let topology = Topology::builder(&app)
        .stage("remember", Remember(output.name.clone()), |s| {
            s.source(&input.name)
                .sink(&output.name)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let group = topology.stage("remember").unwrap().group_id(&app);
    let changelog = changelog_topic(&group);
    Admin::new(&bootstrap(), DEADLINE)
        .unwrap()
        .create_topics(&[TopicSpec::new(&changelog, 1)
            .config("cleanup.policy", "compact")
            .config("max.message.bytes", LIMIT)])
        .unwrap();
    let plain = raw_producer(None);

    // One committed transaction first: the group's offset is 1.
    send_stamped(&plain, &input.name, 0, b"k0", b"small", None);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "remember", 1);
    running.stop().unwrap();
    assert_eq!(group_offset(&group, &input.name, 0), Some(1));

    // k2's state record is refused by the changelog's limit.
    send_stamped(&plain, &input.name, 0, b"k1", b"small", None);
    send_stamped(&plain, &input.name, 0, b"k2", b"big", None);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let failure = loop {
        let m = running.metrics()[0].1;
        if m.aborts >= 1 {
            // The stage aborted at least once; it may go on retrying, or have ended.
            break parsley_testkit::fixtures::next_failure(&running);
        }
        if let Some(parsley_runtime::Progress::Failed { error, .. }) =
            running.next_progress(std::time::Duration::from_millis(20))
        {
            break error;
        }
    };
    let m = running.metrics()[0].1;
    let _ = running.stop();
    eprintln!(
        "C26: the stage aborted {} time(s) and ended with: {failure}",
        m.aborts
    );
    assert!(m.aborts >= 1, "the transaction aborted: {m:?}");
    assert_eq!(
        group_offset(&group, &input.name, 0),
        Some(1),
        "the committed offset did not move"
    );
    assert_eq!(committed_values(&output), ["k0=seen"]);

    // Once the changelog takes the record, the work is redone exactly once.
    set_changelog_limit(&changelog, "1048588");
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_metrics(&running, "remember", "2 committed deliveries", |m| {
        m.committed_deliveries >= 2
    });
    running.stop().unwrap();
    assert_eq!(committed_values(&output), ["k0=seen", "k1=seen", "k2=seen"]);
    assert_eq!(group_offset(&group, &input.name, 0), Some(3));
}
