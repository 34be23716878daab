//! Topic identity on the real broker: a recreated topic is a new channel.

use parsley_clock::Channel;
use parsley_runtime::SetupError;
use parsley_runtime::{Error, TopicSpec};
use parsley_testkit::fixtures::{admin, unique_topic};

#[test]
fn a_topic_deleted_and_recreated_under_the_same_name_is_a_different_channel() {
    let admin = admin();
    let name = unique_topic("identity");
    let first = admin
        .create_topics(&[TopicSpec::new(&name, 2)])
        .unwrap()
        .remove(0);
    assert_eq!(first.partitions, 2);
    assert!(!first.id.is_zero());
    assert_eq!(admin.describe_topics(&[&name]).unwrap()[0], first);

    admin.delete_topics(&[&name]).unwrap();
    assert!(matches!(
        admin.describe_topics(&[&name]),
        Err(Error::Setup(SetupError::UnknownTopic { ref topic })) if *topic == name
    ));

    let second = admin
        .create_topics(&[TopicSpec::new(&name, 2)])
        .unwrap()
        .remove(0);
    assert_eq!(second.name, first.name);
    assert_ne!(second.id, first.id, "a recreated topic gets a new UUID");
    assert_ne!(Channel::new(first.id, 0), Channel::new(second.id, 0));
}

#[test]
fn describing_an_unknown_topic_names_it() {
    let name = unique_topic("never-created");
    let err = admin().describe_topics(&[&name]).unwrap_err();
    assert!(err.to_string().contains(&name), "{err}");
}

/// Two instances of a stage starting together both create its changelog (chaos seed 4: the
/// second one stopped with `TopicAlreadyExists`).
#[test]
fn creating_a_topic_if_absent_from_two_threads_at_once_gives_both_the_same_topic() {
    let name = unique_topic("if-absent");
    let spec = TopicSpec::new(&name, 3).config("cleanup.policy", "compact");
    let barrier = std::sync::Barrier::new(2);
    let (a, b) = std::thread::scope(|s| {
        let create = || {
            let admin = admin();
            barrier.wait();
            admin.create_topic_if_absent(&spec).unwrap()
        };
        let a = s.spawn(create);
        let b = s.spawn(create);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, b);
    assert_eq!(a.partitions, 3);
    // An existing topic keeps its partition count and identity; plain creation refuses it.
    let admin = admin();
    assert_eq!(
        admin
            .create_topic_if_absent(&TopicSpec::new(&name, 5))
            .unwrap(),
        a
    );
    assert!(admin.create_topics(&[TopicSpec::new(&name, 3)]).is_err());
}
