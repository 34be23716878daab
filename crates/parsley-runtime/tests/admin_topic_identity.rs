//! Topic identity on the real broker: a recreated topic is a new channel.

use parsley_clock::Channel;
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
        Err(Error::UnknownTopic { ref topic }) if *topic == name
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
