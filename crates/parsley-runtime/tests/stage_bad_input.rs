//! Bad input on the real broker: a malformed stamp header stops the task with an error that
//! names the record, and nothing is lost — the record stays uncommitted and is read again;
//! sources that are not co-partitioned, by partition count or by a member's assignment, are
//! refused with an error naming them.

use std::sync::Arc;
use std::time::Duration;

use parsley_runtime::{Error, Runtime, RuntimeConfig};
use parsley_runtime::{RecordError, SetupError};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, forward_topology, next_failure, unique_topic, wait_tasks,
};
use rdkafka::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

#[test]
fn a_malformed_stamp_stops_the_task_naming_the_record_and_loses_nothing() {
    let input = create_topic("bad-stamp-in", 1);
    let output = create_topic("bad-stamp-out", 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    // offset 0: unstamped (claims nothing); offset 1: a stamp of unknown version 9.
    producer
        .send(BaseRecord::to(&input.name).key("k").payload("fine"))
        .unwrap();
    producer
        .send(BaseRecord::to(&input.name).key("k").payload("bad").headers(
            OwnedHeaders::new().insert(Header {
                key: parsley_clock::STAMP_HEADER,
                value: Some(&[9u8, 0, 0][..]),
            }),
        ))
        .unwrap();
    producer.flush(DEADLINE).unwrap();

    let app = unique_topic("bad-stamp");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let failure = next_failure(&running);
    assert!(
        matches!(
            &*failure,
            Error::Record(RecordError::MalformedStamp { topic, partition: 0, offset: 1, source, .. })
                if *topic == input.name
                    && matches!(
                        **source,
                        parsley_clock::Error::Decode { kind: parsley_clock::DecodeErrorKind::UnknownVersion(9), .. }
                    )
        ),
        "the error names the record and what was wrong: {failure:?}"
    );
    // `stop` returns the same error, named by its stage.
    let err = running.stop().unwrap_err();
    assert!(
        matches!(&err, Error::StageFailed { stage, source } if stage == "forward" && Arc::ptr_eq(source, &failure)),
        "{err:?}"
    );

    // Nothing lost: the group's committed offset is at most 1, so the bad record is read
    // again by the next owner.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&input.name, 0);
    let group_consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("{app}.forward"))
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let offsets = group_consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .unwrap();
    match offsets.elements()[0].offset() {
        Offset::Offset(o) => assert!(o <= 1, "committed past the bad record: {o}"),
        Offset::Invalid => {} // nothing committed at all
        other => panic!("unexpected committed offset {other:?}"),
    }
}

#[test]
fn a_stage_whose_sources_are_not_co_partitioned_refuses_to_start() {
    let a = create_topic("copart-a", 2);
    let b = create_topic("copart-b", 3);
    let out = create_topic("copart-out", 2);
    let topology = forward_topology(
        &unique_topic("copart"),
        &[&a.name, &b.name],
        &out.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let err = running.stop().unwrap_err();
    assert!(
        matches!(
            err.stage_error(),
            Error::Setup(SetupError::NotCoPartitioned { stage, partitions })
                if stage == "forward"
                    && partitions.contains(&(a.name.clone(), 2))
                    && partitions.contains(&(b.name.clone(), 3))
        ),
        "{err:?}"
    );
}

/// Co-partitioning is checked on every member's assignment, not only on the topics' partition
/// counts: two instances whose assignor spreads partitions round-robin over both sources (a
/// user's override of the runtime's `range`) get tasks missing partition `p` of one source, and
/// a stage refuses them with `NotCoPartitioned` naming the missing partition.
#[test]
fn an_assignment_that_splits_a_task_across_members_is_refused() {
    let a = create_topic("split-a", 3);
    let b = create_topic("split-b", 3);
    let out = create_topic("split-out", 3);
    let topology = forward_topology(
        &unique_topic("split"),
        &[&a.name, &b.name],
        &out.name,
        ImpossiblePolicy::Fail,
    );
    let config = |instance: &str| {
        let mut c = RuntimeConfig::new(bootstrap())
            .consumer_property("partition.assignment.strategy", "roundrobin");
        c.instance_id = instance.to_string();
        c
    };
    let first = Runtime::new(topology.clone(), config("one"))
        .start()
        .unwrap();
    // Alone, it gets every partition of both sources: every task is whole.
    wait_tasks(&first, "forward", "three whole tasks", |t| t.len() == 3);
    let second = Runtime::new(topology, config("two")).start().unwrap();
    // Round-robin over [a0 a1 a2 b0 b1 b2] gives each member one source's partition of a
    // task without the other's: both refuse.
    let error = next_failure(&first);
    let _ = second.stop();
    let _ = first.stop();
    assert!(
        matches!(
            &*error,
            Error::Setup(SetupError::NotCoPartitioned { partitions, .. })
                if partitions.iter().any(|(what, _)| what.ends_with(" missing)"))
        ),
        "{error:?}"
    );
}
