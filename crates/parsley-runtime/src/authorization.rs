//! Requests the cluster refused for want of an ACL (KIP-11), as
//! [`KafkaError::Authorization`](parsley_task::error::KafkaError::Authorization) naming the
//! resource: the topic, group, transactional id or the cluster.
//!
//! librdkafka reports a refusal as an error code of the request (an admin request's topic or
//! group result, a delivery report, a transactional call, a consumer error), and not always
//! with the resource: a consumer error of a subscribed topic names no topic through the
//! `rdkafka` crate, a transactional call names no transactional id. So each place that knows
//! the names makes the typed error: the admin from its request ([`refused`]), a stage and a
//! `CausalProducer` from their own names ([`Names::typed`]), and a stage's consumer from the
//! sources the principal may not read (`DescribeTopics` with the authorized operations,
//! KIP-430).
//!
//! Invariant: an error whose code is an authorization code leaves a stage or a
//! `CausalProducer` as `KafkaError::Authorization`, never as a generic client or admin error,
//! and is fatal ([`Error::is_fatal`]): nothing in the runtime retries it.

use std::fmt::Display;

use parsley_task::error::{self, AclResource, Error, Operation, ResourceType};
use rdkafka::types::RDKafkaErrorCode;

use crate::clients::ClientRole;

/// The typed error when `code` is an authorization code: `operation` of the `client` client
/// refused on the resource of the code's type named `name` (ignored for the cluster).
pub(crate) fn refused(
    operation: Operation,
    code: RDKafkaErrorCode,
    name: Option<&str>,
    client: ClientRole,
    message: impl Display,
) -> Option<Error> {
    let code = crate::client_error::code(code);
    let kind = code.refused_resource_type()?;
    let resource = match (kind, name) {
        (ResourceType::Cluster, _) | (_, None) => AclResource::unnamed(kind),
        (kind, Some(name)) => AclResource::named(kind, name),
    };
    Some(Error::Kafka(error::KafkaError::authorization(
        operation,
        resource,
        client.name(),
        code,
        message.to_string(),
    )))
}

/// The names a stage's or a `CausalProducer`'s refusals are about, when the error does not
/// carry them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Names {
    /// The consumer group (a stage's).
    pub group: Option<String>,
    /// The transactional id, when transactional.
    pub transactional_id: Option<String>,
    /// The client whose refusals these are, for errors that do not say.
    pub client: Option<ClientRole>,
}

impl Names {
    /// `e`, made a [`KafkaError::Authorization`](error::KafkaError::Authorization) when it is a
    /// client, transactional or send error with an authorization code; any other error is
    /// returned unchanged.
    pub(crate) fn typed(&self, e: Error) -> Error {
        let Error::Kafka(kafka) = &e else { return e };
        let (operation, code, topic, group, message) = match kafka {
            error::KafkaError::Client {
                operation,
                topic,
                group,
                source,
                ..
            } => match &source.code {
                Some(code) => (
                    *operation,
                    code.clone(),
                    topic.clone(),
                    group.clone(),
                    source.message.clone(),
                ),
                None => return e,
            },
            error::KafkaError::Transaction {
                operation,
                code,
                message,
                ..
            } => (*operation, code.clone(), None, None, message.clone()),
            error::KafkaError::Send { topic, source, .. } => match &source.code {
                Some(code) => (
                    Operation::Send,
                    code.clone(),
                    Some(topic.clone()),
                    None,
                    source.message.clone(),
                ),
                None => return e,
            },
            _ => return e,
        };
        let Some(kind) = code.refused_resource_type() else {
            return e;
        };
        let name = match kind {
            ResourceType::Topic => topic,
            ResourceType::Group => group.or_else(|| self.group.clone()),
            ResourceType::TransactionalId => self.transactional_id.clone(),
            _ => None,
        };
        let resource = match name {
            Some(name) if kind != ResourceType::Cluster => AclResource::named(kind, name),
            _ => AclResource::unnamed(kind),
        };
        let client = self.client.unwrap_or_else(|| role_of(operation)).name();
        Error::Kafka(error::KafkaError::authorization(
            operation, resource, client, code, message,
        ))
    }
}

/// The stage's client that makes the calls of `operation`.
fn role_of(operation: Operation) -> ClientRole {
    use Operation as O;
    match operation {
        O::CreateConsumer
        | O::Subscribe
        | O::Poll
        | O::Seek
        | O::ReadAssignment
        | O::Assign
        | O::UnassignAfterRevocation
        | O::PauseResume
        | O::ReadCommittedOffsets
        | O::ReadPositions
        | O::Rebalance
        | O::CreateProgressReader
        | O::ReadProgressOffsets
        | O::BuildProgressPartitions
        | O::AssignProgressPartitions
        | O::UnassignProgressPartitions => ClientRole::Consumer,
        O::CreateRestoreConsumer
        | O::BuildRestoreAssignment
        | O::AssignChangelogPartition
        | O::ReadRestorePosition
        | O::ReadChangelog => ClientRole::Restore,
        _ => ClientRole::Producer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsley_clock::{Channel, TopicId};
    use parsley_task::error::{ClientError, KafkaCode};

    fn names() -> Names {
        Names {
            group: Some("app.s".into()),
            transactional_id: Some("app.s-a-0".into()),
            client: None,
        }
    }

    fn resource(e: &Error) -> Option<&AclResource> {
        match e {
            Error::Kafka(k) => k.refused_resource(),
            _ => None,
        }
    }

    #[test]
    fn an_authorization_code_becomes_the_typed_error_naming_the_resource() {
        let code = |v: i32, n: &str| Some(KafkaCode::new(v, n));
        let poll = Error::kafka(
            Operation::Poll,
            ClientError::new(code(30, "GroupAuthorizationFailed"), "m"),
        );
        let e = names().typed(poll);
        assert_eq!(
            resource(&e),
            Some(&AclResource::named(ResourceType::Group, "app.s"))
        );
        assert!(e.is_fatal(), "{e}");
        let init = Error::kafka(
            Operation::InitTransactions,
            ClientError::new(code(53, "TransactionalIdAuthorizationFailed"), "m"),
        );
        assert_eq!(
            resource(&names().typed(init)),
            Some(&AclResource::named(
                ResourceType::TransactionalId,
                "app.s-a-0"
            ))
        );
        let send = Error::Kafka(error::KafkaError::Send {
            topic: "out".into(),
            channel: Box::new(Channel::new(TopicId::from_halves(1, 2), 0)),
            source: Box::new(ClientError::new(code(29, "TopicAuthorizationFailed"), "m")),
        });
        let e = names().typed(send);
        assert_eq!(
            resource(&e),
            Some(&AclResource::named(ResourceType::Topic, "out"))
        );
        assert!(e.to_string().contains("Topic out"), "{e}");
        let cluster = Error::Kafka(error::KafkaError::Transaction {
            operation: Operation::InitTransactions,
            code: KafkaCode::new(31, "ClusterAuthorizationFailed"),
            message: "m".into(),
            fatal: true,
            requires_abort: false,
        });
        assert_eq!(
            resource(&names().typed(cluster)),
            Some(&AclResource::unnamed(ResourceType::Cluster))
        );
        let restore = Error::from(
            error::KafkaError::client(
                Operation::ReadChangelog,
                ClientError::new(code(29, "TopicAuthorizationFailed"), "m"),
            )
            .with_partition("app.s.changelog", 0),
        );
        let e = names().typed(restore);
        assert_eq!(
            resource(&e),
            Some(&AclResource::named(ResourceType::Topic, "app.s.changelog"))
        );
        assert!(e.to_string().contains("the restore client"), "{e}");
        // Other codes, other errors: unchanged.
        let other = Error::kafka(
            Operation::Poll,
            ClientError::new(code(-195, "BrokerTransportFailure"), "m"),
        );
        assert!(resource(&names().typed(other)).is_none());
        assert!(
            refused(
                Operation::DescribeTopic,
                RDKafkaErrorCode::UnknownTopicOrPartition,
                Some("t"),
                ClientRole::Admin,
                "m"
            )
            .is_none()
        );
        let e = refused(
            Operation::CreateTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            Some("app.s.changelog"),
            ClientRole::Admin,
            "m",
        )
        .unwrap();
        assert_eq!(
            e.to_string(),
            "creating topic: the admin client is not authorized on Topic app.s.changelog \
             (TopicAuthorizationFailed: m): no ACL allows this principal the operation"
        );
    }
}
