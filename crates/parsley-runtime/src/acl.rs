//! An ACL binding (KIP-11) as the runtime's admin creates, deletes and describes it
//! ([`Admin::create_acls`](crate::Admin::create_acls)): pure data, shared by the admin and the
//! librdkafka calls beneath it.

use parsley_task::error::{AclOperation, ResourceType};

/// How an ACL's resource name matches resources (Kafka's `PatternType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternType {
    /// The resource with exactly this name.
    Literal,
    /// Every resource whose name starts with this one (KIP-290): an application id covers
    /// the internal topics, groups and transactional ids the runtime derives from it.
    Prefixed,
}

/// An ACL that allows `principal`, from any host, `operation` on the resources of type
/// `resource` that `name` matches by `pattern`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acl {
    /// The type of resource.
    pub resource: ResourceType,
    /// The resource's name or prefix; for [`ResourceType::Cluster`], `kafka-cluster`.
    pub name: String,
    /// How `name` matches.
    pub pattern: PatternType,
    /// The operation allowed.
    pub operation: AclOperation,
    /// The principal allowed (`User:alice`).
    pub principal: String,
}

impl Acl {
    /// Allows `principal` `operation` on the resource of type `resource` named exactly `name`.
    pub fn literal(
        resource: ResourceType,
        name: impl Into<String>,
        operation: AclOperation,
        principal: impl Into<String>,
    ) -> Self {
        Acl {
            resource,
            name: name.into(),
            pattern: PatternType::Literal,
            operation,
            principal: principal.into(),
        }
    }

    /// Allows `principal` `operation` on every resource of type `resource` whose name starts
    /// with `prefix`.
    pub fn prefixed(
        resource: ResourceType,
        prefix: impl Into<String>,
        operation: AclOperation,
        principal: impl Into<String>,
    ) -> Self {
        Acl {
            pattern: PatternType::Prefixed,
            ..Acl::literal(resource, prefix, operation, principal)
        }
    }

    /// Allows `principal` `operation` on the cluster.
    pub fn cluster(operation: AclOperation, principal: impl Into<String>) -> Self {
        Acl::literal(ResourceType::Cluster, "kafka-cluster", operation, principal)
    }
}

impl std::fmt::Display for Acl {
    /// `ALLOW User:app Write on Topic prefixed app.` — as `kafka-acls --list` says it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pattern = match self.pattern {
            PatternType::Literal => "",
            PatternType::Prefixed => "prefixed ",
        };
        write!(
            f,
            "ALLOW {} {} on {} {pattern}{}",
            self.principal, self.operation, self.resource, self.name
        )
    }
}
