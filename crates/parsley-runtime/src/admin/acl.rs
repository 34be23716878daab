//! ACLs through the admin (KIP-11): [`Admin::create_acls`] and [`Admin::delete_acls`], for a
//! principal allowed to alter them (`Alter` on the cluster, or a super user). The book's
//! operations chapter lists the ACLs each part of Parsley needs.

use parsley_task::error::{AclOperation, Error, Operation, Result};

use super::Admin;
use crate::acl::Acl;
use crate::librdkafka::acl::AclBindings;
use crate::librdkafka::admin::AdminCall;

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
    use parsley_task::error::ResourceType;

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
