//! Kafka's authorization model (KIP-11) as far as Parsley's errors and ACLs name it: the
//! resource a request was refused on ([`AclResource`], of a [`ResourceType`]) and the
//! operation an ACL allows on it ([`AclOperation`]).
//!
//! A broker with an authorizer answers a request its principal has no ACL for with an
//! authorization code, one per resource type: `TOPIC_AUTHORIZATION_FAILED` (29),
//! `GROUP_AUTHORIZATION_FAILED` (30), `CLUSTER_AUTHORIZATION_FAILED` (31) and
//! `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` (53) ([`ResourceType::of_code`]). The error that
//! reports one is [`KafkaError::Authorization`](super::KafkaError::Authorization).

use std::fmt;

/// The type of a resource an ACL is about (Kafka's `ResourceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceType {
    /// A topic, by name.
    Topic,
    /// A consumer group, by `group.id`.
    Group,
    /// A transactional id (`transactional.id`).
    TransactionalId,
    /// The cluster (its one resource is named `kafka-cluster`).
    Cluster,
}

impl ResourceType {
    /// The broker's `TOPIC_AUTHORIZATION_FAILED`.
    pub const TOPIC_AUTHORIZATION_FAILED: i32 = 29;
    /// The broker's `GROUP_AUTHORIZATION_FAILED`.
    pub const GROUP_AUTHORIZATION_FAILED: i32 = 30;
    /// The broker's `CLUSTER_AUTHORIZATION_FAILED`.
    pub const CLUSTER_AUTHORIZATION_FAILED: i32 = 31;
    /// The broker's `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`.
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i32 = 53;

    /// The resource type an authorization code (librdkafka's `rd_kafka_resp_err_t`, which is
    /// the broker's code for these) says access was refused on; `None` for any other code.
    pub fn of_code(code: i32) -> Option<ResourceType> {
        match code {
            Self::TOPIC_AUTHORIZATION_FAILED => Some(ResourceType::Topic),
            Self::GROUP_AUTHORIZATION_FAILED => Some(ResourceType::Group),
            Self::CLUSTER_AUTHORIZATION_FAILED => Some(ResourceType::Cluster),
            Self::TRANSACTIONAL_ID_AUTHORIZATION_FAILED => Some(ResourceType::TransactionalId),
            _ => None,
        }
    }

    /// Kafka's name of the type, as `kafka-acls` writes it (`Topic`, `Group`,
    /// `TransactionalId`, `Cluster`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ResourceType::Topic => "Topic",
            ResourceType::Group => "Group",
            ResourceType::TransactionalId => "TransactionalId",
            ResourceType::Cluster => "Cluster",
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation an ACL allows on a resource (Kafka's `AclOperation`): the ones a Parsley
/// application needs, and `All`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AclOperation {
    /// Every operation.
    All,
    /// Read a topic (fetch, commit offsets for it), join or commit to a group.
    Read,
    /// Write a topic (produce), use a transactional id.
    Write,
    /// Create topics (on a topic, or on the cluster for any topic).
    Create,
    /// Describe a topic (metadata, its id, its offsets), a group or a transactional id.
    /// Implied by `Read`, `Write`, `Delete` and `Alter` on the same resource.
    Describe,
    /// Read a topic's or the cluster's configuration. Implied by `AlterConfigs`.
    DescribeConfigs,
    /// Initialise an idempotent producer (on the cluster). Since Kafka 3.0 (KIP-679), `Write`
    /// on any topic implies it.
    IdempotentWrite,
}

impl AclOperation {
    /// Kafka's name of the operation, as `kafka-acls` writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            AclOperation::All => "All",
            AclOperation::Read => "Read",
            AclOperation::Write => "Write",
            AclOperation::Create => "Create",
            AclOperation::Describe => "Describe",
            AclOperation::DescribeConfigs => "DescribeConfigs",
            AclOperation::IdempotentWrite => "IdempotentWrite",
        }
    }
}

impl fmt::Display for AclOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resource a request was refused on: its type and, when the refusal names it, its name
/// (a group, a transactional id, the topics of the call; the cluster has none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AclResource {
    /// The resource's type.
    pub kind: ResourceType,
    /// Its name: a topic, group or transactional id; `None` for the cluster, or when the
    /// refusal does not say which of the call's resources it was.
    pub name: Option<Box<str>>,
}

impl AclResource {
    /// The resource `kind` named `name`.
    pub fn named(kind: ResourceType, name: impl Into<Box<str>>) -> Self {
        AclResource {
            kind,
            name: Some(name.into()),
        }
    }

    /// A resource of `kind` the refusal does not name (the cluster's, or a call's).
    pub fn unnamed(kind: ResourceType) -> Self {
        AclResource { kind, name: None }
    }
}

impl fmt::Display for AclResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, self.kind) {
            (Some(name), kind) => write!(f, "{kind} {name}"),
            (None, ResourceType::Cluster) => f.write_str("Cluster kafka-cluster"),
            (None, kind) => write!(f, "{kind} (not named by the broker)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_authorization_code_names_its_resource_type() {
        assert_eq!(ResourceType::of_code(29), Some(ResourceType::Topic));
        assert_eq!(ResourceType::of_code(30), Some(ResourceType::Group));
        assert_eq!(ResourceType::of_code(31), Some(ResourceType::Cluster));
        assert_eq!(
            ResourceType::of_code(53),
            Some(ResourceType::TransactionalId)
        );
        assert_eq!(ResourceType::of_code(3), None);
        assert_eq!(ResourceType::of_code(-195), None);
    }

    #[test]
    fn a_resource_is_written_as_kafka_acls_names_it() {
        assert_eq!(
            AclResource::named(ResourceType::Topic, "in").to_string(),
            "Topic in"
        );
        assert_eq!(
            AclResource::unnamed(ResourceType::Cluster).to_string(),
            "Cluster kafka-cluster"
        );
        assert_eq!(
            AclResource::named(ResourceType::TransactionalId, "app.s-a-0").to_string(),
            "TransactionalId app.s-a-0"
        );
        assert_eq!(AclOperation::DescribeConfigs.to_string(), "DescribeConfigs");
    }
}
