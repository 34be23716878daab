//! The arguments and results of `CreateAcls`, `DeleteAcls` and `DescribeAcls` (KIP-11's ACL
//! bindings), which the `rdkafka` crate does not wrap.

use std::ffi::{CString, c_char};

use rdkafka::error::RDKafkaErrorCode;
use rdkafka_sys as rdsys;

use super::{Guard, cstr};
use crate::admin::acl::{Acl, PatternType};
use parsley_task::error::{AclOperation, ResourceType};

/// ACL bindings owned here: the argument of a `CreateAcls` request, or, as filters matching
/// exactly these bindings, of a `DeleteAcls` request.
pub(crate) struct AclBindings(Vec<Guard<rdsys::rd_kafka_AclBinding_t>>);

/// The filter of a `DescribeAcls` request: every ACL of one principal.
pub(crate) struct PrincipalFilter(pub(super) Guard<rdsys::rd_kafka_AclBindingFilter_t>);

impl PrincipalFilter {
    /// The filter matching every ACL of `principal`.
    ///
    /// # Errors
    /// librdkafka's message, or a principal with a NUL byte.
    pub(crate) fn new(principal: &str) -> Result<Self, String> {
        let principal =
            CString::new(principal).map_err(|_| format!("{principal:?} contains a NUL byte"))?;
        let mut errstr = [0 as c_char; 512];
        // SAFETY: as in `AclBindings::new`; a null name and host match any.
        let filter = unsafe {
            Guard::new(
                rdsys::rd_kafka_AclBindingFilter_new(
                    rdsys::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_ANY,
                    std::ptr::null(),
                    rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_ANY,
                    principal.as_ptr(),
                    std::ptr::null(),
                    rdsys::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ANY,
                    rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ANY,
                    errstr.as_mut_ptr(),
                    errstr.len(),
                ),
                rdsys::rd_kafka_AclBinding_destroy,
            )
        };
        if filter.0.is_null() {
            // SAFETY: librdkafka wrote a NUL-terminated message into the buffer.
            return Err(unsafe { cstr(errstr.as_ptr()) });
        }
        Ok(PrincipalFilter(filter))
    }
}

/// The ALLOW ACLs of a `DescribeAcls` result event, as [`Acl`]s (ACLs of another permission,
/// resource type, pattern or operation than Parsley names are left out).
///
/// # Safety
/// `event` is a live event.
pub(super) unsafe fn described(event: *mut rdsys::rd_kafka_event_t) -> Vec<Acl> {
    use rdsys::rd_kafka_ResourcePatternType_t as P;
    use rdsys::rd_kafka_ResourceType_t as R;
    // SAFETY: the caller's; the bindings and strings read belong to the event.
    unsafe {
        let result = rdsys::rd_kafka_event_DescribeAcls_result(event);
        if result.is_null() {
            return Vec::new();
        }
        let mut count = 0usize;
        let acls = rdsys::rd_kafka_DescribeAcls_result_acls(result, &mut count);
        (0..count)
            .filter_map(|i| {
                let b = *acls.add(i);
                let allow = rdsys::rd_kafka_AclBinding_permission_type(b)
                    == rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW;
                let resource = match rdsys::rd_kafka_AclBinding_restype(b) {
                    R::RD_KAFKA_RESOURCE_TOPIC => ResourceType::Topic,
                    R::RD_KAFKA_RESOURCE_GROUP => ResourceType::Group,
                    R::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID => ResourceType::TransactionalId,
                    R::RD_KAFKA_RESOURCE_BROKER => ResourceType::Cluster,
                    _ => return None,
                };
                let pattern = match rdsys::rd_kafka_AclBinding_resource_pattern_type(b) {
                    P::RD_KAFKA_RESOURCE_PATTERN_LITERAL => PatternType::Literal,
                    P::RD_KAFKA_RESOURCE_PATTERN_PREFIXED => PatternType::Prefixed,
                    _ => return None,
                };
                let operation = operation_of(rdsys::rd_kafka_AclBinding_operation(b))?;
                allow.then(|| Acl {
                    resource,
                    name: cstr(rdsys::rd_kafka_AclBinding_name(b)),
                    pattern,
                    operation,
                    principal: cstr(rdsys::rd_kafka_AclBinding_principal(b)),
                })
            })
            .collect()
    }
}

impl AclBindings {
    /// The bindings of `acls` (each allowing its principal from any host); as filters with
    /// `filter`.
    ///
    /// # Errors
    /// librdkafka's message for a binding it refuses, or a name with a NUL byte.
    pub(crate) fn new(acls: &[Acl], filter: bool) -> Result<Self, String> {
        let mut bindings = Vec::with_capacity(acls.len());
        for acl in acls {
            let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
            let (name, principal, host) = (c(&acl.name)?, c(&acl.principal)?, c("*")?);
            let mut errstr = [0 as c_char; 512];
            let make = if filter {
                rdsys::rd_kafka_AclBindingFilter_new
            } else {
                rdsys::rd_kafka_AclBinding_new
            };
            // SAFETY: the strings are NUL-terminated and alive for the call, which copies
            // them; `errstr` is a writable buffer of the length given; the binding returned
            // (null on error) is owned by its guard and destroyed once.
            let binding = unsafe {
                Guard::new(
                    make(
                        resource_type(acl.resource),
                        name.as_ptr(),
                        pattern_type(acl.pattern),
                        principal.as_ptr(),
                        host.as_ptr(),
                        operation(acl.operation),
                        rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
                        errstr.as_mut_ptr(),
                        errstr.len(),
                    ),
                    rdsys::rd_kafka_AclBinding_destroy,
                )
            };
            if binding.0.is_null() {
                // SAFETY: librdkafka wrote a NUL-terminated message into the buffer.
                return Err(unsafe { cstr(errstr.as_ptr()) });
            }
            bindings.push(binding);
        }
        Ok(AclBindings(bindings))
    }

    /// The bindings as the array librdkafka takes (it copies them into the request).
    pub(crate) fn pointers(&self) -> Vec<*mut rdsys::rd_kafka_AclBinding_t> {
        self.0.iter().map(|g| g.0).collect()
    }
}

fn resource_type(kind: ResourceType) -> rdsys::rd_kafka_ResourceType_t {
    use rdsys::rd_kafka_ResourceType_t as R;
    match kind {
        ResourceType::Topic => R::RD_KAFKA_RESOURCE_TOPIC,
        ResourceType::Group => R::RD_KAFKA_RESOURCE_GROUP,
        ResourceType::TransactionalId => R::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
        // librdkafka's name for Kafka's `Cluster` resource type (4).
        ResourceType::Cluster => R::RD_KAFKA_RESOURCE_BROKER,
        _ => R::RD_KAFKA_RESOURCE_UNKNOWN,
    }
}

fn pattern_type(pattern: PatternType) -> rdsys::rd_kafka_ResourcePatternType_t {
    use rdsys::rd_kafka_ResourcePatternType_t as P;
    match pattern {
        PatternType::Literal => P::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
        PatternType::Prefixed => P::RD_KAFKA_RESOURCE_PATTERN_PREFIXED,
    }
}

fn operation(operation: AclOperation) -> rdsys::rd_kafka_AclOperation_t {
    use rdsys::rd_kafka_AclOperation_t as O;
    match operation {
        AclOperation::All => O::RD_KAFKA_ACL_OPERATION_ALL,
        AclOperation::Read => O::RD_KAFKA_ACL_OPERATION_READ,
        AclOperation::Write => O::RD_KAFKA_ACL_OPERATION_WRITE,
        AclOperation::Create => O::RD_KAFKA_ACL_OPERATION_CREATE,
        AclOperation::Describe => O::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        AclOperation::DescribeConfigs => O::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        AclOperation::IdempotentWrite => O::RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE,
        _ => O::RD_KAFKA_ACL_OPERATION_UNKNOWN,
    }
}

/// The first error among the per-binding results of a `CreateAcls` or `DeleteAcls` result
/// event (`None`: every binding succeeded).
///
/// # Safety
/// `event` is a live event.
pub(super) unsafe fn first_error(
    event: *mut rdsys::rd_kafka_event_t,
) -> Option<(RDKafkaErrorCode, String)> {
    // SAFETY: the caller's; the results and errors read belong to the event and are only read
    // here. A result accessor returns null for an event of another type.
    unsafe {
        let mut count = 0usize;
        let errors: Vec<*const rdsys::rd_kafka_error_t> =
            if let Some(r) = non_null(rdsys::rd_kafka_event_CreateAcls_result(event)) {
                let results = rdsys::rd_kafka_CreateAcls_result_acls(r, &mut count);
                (0..count)
                    .map(|i| rdsys::rd_kafka_acl_result_error(*results.add(i)))
                    .collect()
            } else if let Some(r) = non_null(rdsys::rd_kafka_event_DeleteAcls_result(event)) {
                let responses = rdsys::rd_kafka_DeleteAcls_result_responses(r, &mut count);
                (0..count)
                    .map(|i| rdsys::rd_kafka_DeleteAcls_result_response_error(*responses.add(i)))
                    .collect()
            } else {
                Vec::new()
            };
        errors.into_iter().find(|e| !e.is_null()).map(|e| {
            (
                rdsys::rd_kafka_error_code(e).into(),
                cstr(rdsys::rd_kafka_error_string(e)),
            )
        })
    }
}

/// librdkafka's ACL operation as the one Parsley names; `None` for another.
pub(super) fn operation_of(op: rdsys::rd_kafka_AclOperation_t) -> Option<AclOperation> {
    use rdsys::rd_kafka_AclOperation_t as O;
    Some(match op {
        O::RD_KAFKA_ACL_OPERATION_ALL => AclOperation::All,
        O::RD_KAFKA_ACL_OPERATION_READ => AclOperation::Read,
        O::RD_KAFKA_ACL_OPERATION_WRITE => AclOperation::Write,
        O::RD_KAFKA_ACL_OPERATION_CREATE => AclOperation::Create,
        O::RD_KAFKA_ACL_OPERATION_DESCRIBE => AclOperation::Describe,
        O::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS => AclOperation::DescribeConfigs,
        O::RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE => AclOperation::IdempotentWrite,
        _ => return None,
    })
}

fn non_null<T>(p: *const T) -> Option<*const T> {
    (!p.is_null()).then_some(p)
}
