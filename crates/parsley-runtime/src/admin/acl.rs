//! ACLs through the admin (KIP-11): [`Admin::create_acls`] and [`Admin::delete_acls`], for a
//! principal allowed to alter them (`Alter` on the cluster, or a super user). The book's
//! operations chapter lists the ACLs each part of Parsley needs.

use parsley_task::error::{AclOperation, Error, Operation, ResourceType, Result};

use super::Admin;
use crate::librdkafka::acl::AclBindings;
use crate::librdkafka::admin::AdminCall;

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

impl Admin {
    /// Creates `acls` (one `CreateAcls` request); an ACL that exists already is not an error.
    ///
    /// # Errors
    /// [`KafkaError::Security`](parsley_task::error::KafkaError::Security) when the client
    /// cannot authenticate; [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) for a
    /// binding librdkafka refuses, a failed request, or an ACL the broker refused (this
    /// principal may not alter ACLs: `CLUSTER_AUTHORIZATION_FAILED`; no authorizer: `SECURITY_DISABLED`).
    pub fn create_acls(&self, acls: &[Acl]) -> Result<()> {
        self.acl_request(Operation::CreateAcls, acls, false)
    }

    /// Deletes the ACLs equal to `acls` (one `DeleteAcls` request, each ACL a filter matching
    /// exactly itself); an ACL that does not exist is not an error.
    ///
    /// # Errors
    /// As [`Admin::create_acls`].
    pub fn delete_acls(&self, acls: &[Acl]) -> Result<()> {
        self.acl_request(Operation::DeleteAcls, acls, true)
    }

    /// The ACLs allowing `principal` something, as the broker's authorizer holds them (one
    /// `DescribeAcls` request, answered by the broker from the ACLs it applies): evidence that
    /// an ACL just created or deleted is in force there. DENY ACLs and ACLs of a type,
    /// pattern or operation Parsley does not name are left out.
    ///
    /// # Errors
    /// As [`Admin::create_acls`].
    pub fn acls_of(&self, principal: &str) -> Result<Vec<Acl>> {
        let operation = Operation::DescribeAcls;
        let filter = crate::librdkafka::acl::PrincipalFilter::new(principal)
            .map_err(|message| Error::admin(operation, message))?;
        let call = AdminCall::DescribeAcls(&filter);
        Ok(self
            .request(operation, None, self.timeout, call, None)?
            .described_acls())
    }

    /// The topics of `names` this client's principal may not read: described without `Read`
    /// (or `All`) among its authorized operations (KIP-430), or refused a description for want
    /// of an ACL. Names the topic of a consumer's `TOPIC_AUTHORIZATION_FAILED`, which the
    /// client library reports without it.
    ///
    /// # Errors
    /// As [`Admin::describe_topics`].
    pub(crate) fn unreadable(&self, names: &[&str]) -> Result<Vec<String>> {
        let described = self.describe_raw_authorized(names, self.timeout)?;
        Ok(described
            .into_iter()
            .filter(|d| match (&d.result, &d.authorized) {
                (Err((code, _)), _) => crate::client_error::code(*code)
                    .refused_resource_type()
                    .is_some(),
                (Ok(_), Some(ops)) => {
                    !ops.contains(&AclOperation::Read) && !ops.contains(&AclOperation::All)
                }
                (Ok(_), None) => false,
            })
            .map(|d| d.name)
            .collect())
    }

    fn acl_request(&self, operation: Operation, acls: &[Acl], delete: bool) -> Result<()> {
        if acls.is_empty() {
            return Ok(());
        }
        let bindings =
            AclBindings::new(acls, delete).map_err(|message| Error::admin(operation, message))?;
        let call = if delete {
            AdminCall::DeleteAcls(&bindings)
        } else {
            AdminCall::CreateAcls(&bindings)
        };
        let event = self.request(operation, None, self.timeout, call, None)?;
        match event.acl_error() {
            None => Ok(()),
            Some((code, message)) => Err(Error::admin(operation, format!("{code:?}: {message}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acl_is_written_as_kafka_acls_lists_it() {
        let p = "User:app";
        assert_eq!(
            Acl::prefixed(ResourceType::Topic, "app.", AclOperation::Write, p).to_string(),
            "ALLOW User:app Write on Topic prefixed app."
        );
        assert_eq!(
            Acl::literal(ResourceType::Group, "app.s", AclOperation::Read, p).to_string(),
            "ALLOW User:app Read on Group app.s"
        );
        assert_eq!(
            Acl::cluster(AclOperation::IdempotentWrite, p).to_string(),
            "ALLOW User:app IdempotentWrite on Cluster kafka-cluster"
        );
    }

    #[test]
    fn a_name_with_a_nul_byte_is_refused_before_any_request() {
        let acl = Acl::literal(ResourceType::Topic, "a\0b", AclOperation::Read, "User:x");
        let refused = AclBindings::new(&[acl], false).err().unwrap();
        assert!(refused.contains("NUL"), "{refused}");
    }
}
