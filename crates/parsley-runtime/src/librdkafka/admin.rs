//! The admin requests the `rdkafka` crate does not wrap — `DescribeTopics` (topic ids,
//! KIP-516, with the operations the principal may do on each, KIP-430), `ListOffsets` with an
//! isolation level, `DescribeConsumerGroups`, `CreateAcls`, `DeleteAcls` and `DescribeAcls`
//! (their arguments: module `acl`) — and the events of a client's main queue, which its admin
//! client never polls.
//!
//! A [`Request`] owns its options and its private result queue; its arguments
//! ([`AdminCall`]) are owned values of this module or borrowed for the request's life; an
//! [`Event`] owns the result and is read into owned Rust values, so nothing returned here points
//! into librdkafka.

use std::ffi::{CStr, CString, NulError, c_char};
use std::marker::PhantomData;

use parsley_clock::TopicId;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka_sys as rdsys;

use super::{Guard, cstr};

/// `enabled_events` for a client whose errors should arrive as events in its main queue
/// (`RD_KAFKA_EVENT_ERROR`), served by [`drain_main_queue`].
pub(crate) fn error_events() -> String {
    rdsys::RD_KAFKA_EVENT_ERROR.to_string()
}

/// The topics of a `DescribeTopics` request (`rd_kafka_TopicCollection_t`).
pub(crate) struct TopicNames(Guard<rdsys::rd_kafka_TopicCollection_t>);

impl TopicNames {
    /// The collection of `names`.
    ///
    /// # Errors
    /// The first name with a NUL byte.
    pub(crate) fn new(names: &[&str]) -> Result<Self, NulError> {
        let names: Vec<CString> = names
            .iter()
            .map(|n| CString::new(*n))
            .collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: the pointers are NUL-terminated strings alive for the call, which copies
        // them; the collection returned is owned by the guard and destroyed once.
        Ok(TopicNames(unsafe {
            Guard::new(
                rdsys::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len()),
                rdsys::rd_kafka_TopicCollection_destroy,
            )
        }))
    }
}

/// What a `ListOffsets` request asks for each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OffsetSpec {
    /// The end offset (high watermark, or last stable offset under `READ_COMMITTED`).
    Latest,
    /// The log start offset.
    Earliest,
}

/// The isolation level of a `ListOffsets` request: the high watermark or the LSO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

/// The partitions of a `ListOffsets` request, each with the same [`OffsetSpec`].
pub(crate) struct OffsetQuery(Guard<rdsys::rd_kafka_topic_partition_list_t>);

impl OffsetQuery {
    /// `partitions` (topic name, partition) asked for `spec`.
    ///
    /// # Errors
    /// The first topic name with a NUL byte.
    pub(crate) fn new(partitions: &[(&str, i32)], spec: OffsetSpec) -> Result<Self, NulError> {
        let names: Vec<CString> = partitions
            .iter()
            .map(|(t, _)| CString::new(*t))
            .collect::<Result<_, _>>()?;
        let spec = match spec {
            OffsetSpec::Latest => rdsys::rd_kafka_OffsetSpec_t::RD_KAFKA_OFFSET_SPEC_LATEST,
            OffsetSpec::Earliest => rdsys::rd_kafka_OffsetSpec_t::RD_KAFKA_OFFSET_SPEC_EARLIEST,
        };
        // SAFETY: a new list, owned by the guard and destroyed once; each name is a
        // NUL-terminated string alive for the call that copies it; `list_add` returns the
        // element it appended, valid until the list changes again (the write below).
        unsafe {
            let list = Guard::new(
                rdsys::rd_kafka_topic_partition_list_new(partitions.len() as i32),
                rdsys::rd_kafka_topic_partition_list_destroy,
            );
            for (name, (_, p)) in names.iter().zip(partitions) {
                let tp = rdsys::rd_kafka_topic_partition_list_add(list.0, name.as_ptr(), *p);
                (*tp).offset = spec as i64;
            }
            Ok(OffsetQuery(list))
        }
    }
}

/// One admin request and its arguments.
pub(crate) enum AdminCall<'a> {
    /// `DescribeTopics` of these topics.
    DescribeTopics(&'a TopicNames),
    /// `ListOffsets` of these partitions.
    ListOffsets(&'a OffsetQuery),
    /// `DescribeConsumerGroups` of this group.
    DescribeGroup(&'a CStr),
    /// `CreateAcls` of these bindings.
    CreateAcls(&'a super::acl::AclBindings),
    /// `DeleteAcls` of the bindings these filters match.
    DeleteAcls(&'a super::acl::AclBindings),
    /// `DescribeAcls` of the bindings this filter matches.
    DescribeAcls(&'a super::acl::PrincipalFilter),
}

impl AdminCall<'_> {
    fn op(&self) -> rdsys::rd_kafka_admin_op_t {
        match self {
            AdminCall::DescribeTopics(_) => {
                rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS
            }
            AdminCall::ListOffsets(_) => rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTOFFSETS,
            AdminCall::DescribeGroup(_) => {
                rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS
            }
            AdminCall::CreateAcls(_) => rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS,
            AdminCall::DeleteAcls(_) => rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DELETEACLS,
            AdminCall::DescribeAcls(_) => {
                rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBEACLS
            }
        }
    }
}

/// An admin request of one client: its options, its arguments and the private queue its
/// results arrive on. [`Request::start`] may send it again (a retry) on the same queue.
pub(crate) struct Request<'a> {
    rk: *mut rdsys::rd_kafka_t,
    call: AdminCall<'a>,
    options: Guard<rdsys::rd_kafka_AdminOptions_t>,
    queue: Guard<rdsys::rd_kafka_queue_t>,
    /// The client outlives the request.
    _client: PhantomData<&'a ()>,
}

impl<'a> Request<'a> {
    /// A request of `client` for `call`, with request timeout `timeout_ms` (ms). Nothing is
    /// sent before [`Request::start`].
    pub(crate) fn new<C: ClientContext>(
        client: &'a Client<C>,
        call: AdminCall<'a>,
        timeout_ms: i32,
    ) -> Self {
        let rk = client.native_ptr();
        // SAFETY: the client handle is live for `'a`; the options and the queue are new
        // objects owned by their guards, destroyed once, after the request (they are fields
        // of it); `errstr` is a writable buffer of the length given.
        unsafe {
            let options = Guard::new(
                rdsys::rd_kafka_AdminOptions_new(rk, call.op()),
                rdsys::rd_kafka_AdminOptions_destroy,
            );
            let mut errstr = [0 as c_char; 512];
            rdsys::rd_kafka_AdminOptions_set_request_timeout(
                options.0,
                timeout_ms,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            let queue = Guard::new(rdsys::rd_kafka_queue_new(rk), rdsys::rd_kafka_queue_destroy);
            Request {
                rk,
                call,
                options,
                queue,
                _client: PhantomData,
            }
        }
    }

    /// Sets the request's isolation level (`ListOffsets`).
    ///
    /// # Errors
    /// librdkafka's message when it refuses the option.
    pub(crate) fn set_isolation(&mut self, isolation: Isolation) -> Result<(), String> {
        let level = match isolation {
            Isolation::ReadUncommitted => {
                rdsys::rd_kafka_IsolationLevel_t::RD_KAFKA_ISOLATION_LEVEL_READ_UNCOMMITTED
            }
            Isolation::ReadCommitted => {
                rdsys::rd_kafka_IsolationLevel_t::RD_KAFKA_ISOLATION_LEVEL_READ_COMMITTED
            }
        };
        // SAFETY: the options are live (owned by `self`); a returned error object is read
        // and destroyed once, here.
        unsafe {
            let err = rdsys::rd_kafka_AdminOptions_set_isolation_level(self.options.0, level);
            if err.is_null() {
                return Ok(());
            }
            let message = cstr(rdsys::rd_kafka_error_string(err));
            rdsys::rd_kafka_error_destroy(err);
            Err(message)
        }
    }

    /// Asks the broker for the operations the principal may do on each resource described
    /// (KIP-430: `DescribeTopics`).
    ///
    /// # Errors
    /// librdkafka's message when it refuses the option.
    pub(crate) fn include_authorized_operations(&mut self) -> Result<(), String> {
        // SAFETY: as in `set_isolation`.
        unsafe {
            let err =
                rdsys::rd_kafka_AdminOptions_set_include_authorized_operations(self.options.0, 1);
            if err.is_null() {
                return Ok(());
            }
            let message = cstr(rdsys::rd_kafka_error_string(err));
            rdsys::rd_kafka_error_destroy(err);
            Err(message)
        }
    }

    /// Sends the request; its result arrives as an [`Event`] on [`Request::poll`].
    pub(crate) fn start(&self) {
        let (rk, options, queue) = (self.rk, self.options.0, self.queue.0);
        // SAFETY: the client, the options, the queue and the arguments are live for the
        // request's life; librdkafka copies the arguments (topic names, partitions, group
        // names) into the request; its signature asks for a mutable array of group names,
        // which it only reads.
        unsafe {
            match &self.call {
                AdminCall::DescribeTopics(names) => {
                    rdsys::rd_kafka_DescribeTopics(rk, names.0.0, options, queue);
                }
                AdminCall::ListOffsets(query) => {
                    rdsys::rd_kafka_ListOffsets(rk, query.0.0, options, queue);
                }
                AdminCall::DescribeGroup(group) => {
                    let names = [group.as_ptr()];
                    rdsys::rd_kafka_DescribeConsumerGroups(
                        rk,
                        names.as_ptr().cast_mut(),
                        names.len(),
                        options,
                        queue,
                    );
                }
                AdminCall::CreateAcls(bindings) => {
                    let mut ptrs = bindings.pointers();
                    rdsys::rd_kafka_CreateAcls(rk, ptrs.as_mut_ptr(), ptrs.len(), options, queue);
                }
                AdminCall::DeleteAcls(filters) => {
                    let mut ptrs = filters.pointers();
                    rdsys::rd_kafka_DeleteAcls(rk, ptrs.as_mut_ptr(), ptrs.len(), options, queue);
                }
                AdminCall::DescribeAcls(filter) => {
                    rdsys::rd_kafka_DescribeAcls(rk, filter.0.0, options, queue);
                }
            }
        }
    }

    /// The next result of the request, waiting up to `timeout_ms` (ms) for one.
    pub(crate) fn poll(&self, timeout_ms: i32) -> Option<Event> {
        // SAFETY: the queue is live; an event returned is owned by the `Event` and destroyed
        // once.
        let event = unsafe { rdsys::rd_kafka_queue_poll(self.queue.0, timeout_ms) };
        // SAFETY: `event` is null or a new event nobody else destroys.
        (!event.is_null())
            .then(|| Event(unsafe { Guard::new(event, rdsys::rd_kafka_event_destroy) }))
    }
}

/// A librdkafka event (an admin result, an error, a log line), destroyed when dropped.
pub(crate) struct Event(Guard<rdsys::rd_kafka_event_t>);

/// One topic of a `DescribeTopics` result: its id and partition count, or its error.
pub(crate) struct DescribedTopic {
    pub name: String,
    pub result: Result<(TopicId, usize), (RDKafkaErrorCode, String)>,
    /// The operations the principal may do on the topic, when the request asked
    /// ([`Request::include_authorized_operations`]) and the topic was described.
    pub authorized: Option<Vec<parsley_task::error::AclOperation>>,
}

/// One partition of a `ListOffsets` result.
pub(crate) struct ListedOffset {
    pub topic: String,
    pub partition: i32,
    /// The offset; negative when librdkafka had none to give (a logical offset).
    pub offset: i64,
    /// The partition's error, if any.
    pub error: Option<RDKafkaErrorCode>,
}

/// One group of a `DescribeConsumerGroups` result: its state and members, or its error.
pub(crate) struct DescribedGroup {
    pub result: Result<(String, Vec<DescribedMember>), (RDKafkaErrorCode, String)>,
}

/// A member of a described group.
pub(crate) struct DescribedMember {
    pub client_id: String,
    pub host: String,
    /// The member's `group.instance.id` (a static member's).
    pub instance_id: Option<String>,
    pub consumer_id: String,
    /// The partitions of the member's assignment, (topic, partition); while the group
    /// rebalances, empty or the last generation's, as the coordinator describes it.
    pub assignment: Vec<(String, i32)>,
}

impl Event {
    /// The event's error code (`NoError` for none).
    pub(crate) fn error(&self) -> RDKafkaErrorCode {
        // SAFETY: the event is live.
        unsafe { rdsys::rd_kafka_event_error(self.0.0) }.into()
    }

    /// The event's error message.
    pub(crate) fn error_string(&self) -> String {
        // SAFETY: the event is live; the string it returns lives as long as the event.
        unsafe { cstr(rdsys::rd_kafka_event_error_string(self.0.0)) }
    }

    /// The first error of a `CreateAcls` or `DeleteAcls` result's bindings (`None`: none, or
    /// an event of another type).
    pub(crate) fn acl_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        // SAFETY: the event is live.
        unsafe { super::acl::first_error(self.0.0) }
    }

    /// The ALLOW ACLs of a `DescribeAcls` result (none for another event).
    pub(crate) fn described_acls(&self) -> Vec<crate::admin::acl::Acl> {
        // SAFETY: the event is live.
        unsafe { super::acl::described(self.0.0) }
    }

    /// The topics of a `DescribeTopics` result (none for another event).
    pub(crate) fn described_topics(&self) -> Vec<DescribedTopic> {
        // SAFETY: the event is live; the result, its descriptions and the strings and
        // errors they hold belong to the event and are only read here, while it lives. The
        // result accessor returns null for an event of another type.
        unsafe {
            let result = rdsys::rd_kafka_event_DescribeTopics_result(self.0.0);
            if result.is_null() {
                return Vec::new();
            }
            let mut count = 0usize;
            let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
            (0..count)
                .map(|i| {
                    let d = *descriptions.add(i);
                    let name = cstr(rdsys::rd_kafka_TopicDescription_name(d));
                    let error = rdsys::rd_kafka_TopicDescription_error(d);
                    let code = if error.is_null() {
                        rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    } else {
                        rdsys::rd_kafka_error_code(error)
                    };
                    let mut ops = 0usize;
                    let listed =
                        rdsys::rd_kafka_TopicDescription_authorized_operations(d, &mut ops);
                    let authorized = (!listed.is_null()).then(|| {
                        (0..ops)
                            .filter_map(|i| super::acl::operation_of(*listed.add(i)))
                            .collect()
                    });
                    let result = if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                        Err((code.into(), cstr(rdsys::rd_kafka_error_string(error))))
                    } else {
                        let uuid = rdsys::rd_kafka_TopicDescription_topic_id(d);
                        let id = TopicId::from_halves(
                            rdsys::rd_kafka_Uuid_most_significant_bits(uuid),
                            rdsys::rd_kafka_Uuid_least_significant_bits(uuid),
                        );
                        let mut partitions = 0usize;
                        rdsys::rd_kafka_TopicDescription_partitions(d, &mut partitions);
                        Ok((id, partitions))
                    };
                    DescribedTopic {
                        name,
                        result,
                        authorized,
                    }
                })
                .collect()
        }
    }

    /// The partitions of a `ListOffsets` result (none for another event).
    pub(crate) fn listed_offsets(&self) -> Vec<ListedOffset> {
        // SAFETY: as in `described_topics`: everything read belongs to the live event.
        unsafe {
            let result = rdsys::rd_kafka_event_ListOffsets_result(self.0.0);
            if result.is_null() {
                return Vec::new();
            }
            let mut count = 0usize;
            let infos = rdsys::rd_kafka_ListOffsets_result_infos(result, &mut count);
            (0..count)
                .map(|i| {
                    let tp = &*rdsys::rd_kafka_ListOffsetsResultInfo_topic_partition(*infos.add(i));
                    ListedOffset {
                        topic: cstr(tp.topic),
                        partition: tp.partition,
                        offset: tp.offset,
                        error: (tp.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                            .then(|| tp.err.into()),
                    }
                })
                .collect()
        }
    }

    /// The groups of a `DescribeConsumerGroups` result (none for another event); a group's
    /// state and members are read only when it has no error.
    pub(crate) fn described_groups(&self) -> Vec<DescribedGroup> {
        // SAFETY: as in `described_topics`: everything read belongs to the live event.
        unsafe {
            let result = rdsys::rd_kafka_event_DescribeConsumerGroups_result(self.0.0);
            if result.is_null() {
                return Vec::new();
            }
            let mut count = 0usize;
            let groups = rdsys::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
            (0..count)
                .map(|i| {
                    let d = *groups.add(i);
                    let error = rdsys::rd_kafka_ConsumerGroupDescription_error(d);
                    if !error.is_null() {
                        return DescribedGroup {
                            result: Err((
                                rdsys::rd_kafka_error_code(error).into(),
                                cstr(rdsys::rd_kafka_error_string(error)),
                            )),
                        };
                    }
                    let state = cstr(rdsys::rd_kafka_consumer_group_state_name(
                        rdsys::rd_kafka_ConsumerGroupDescription_state(d),
                    ));
                    let members = (0..rdsys::rd_kafka_ConsumerGroupDescription_member_count(d))
                        .map(|i| {
                            let m = rdsys::rd_kafka_ConsumerGroupDescription_member(d, i);
                            let instance = rdsys::rd_kafka_MemberDescription_group_instance_id(m);
                            DescribedMember {
                                client_id: cstr(rdsys::rd_kafka_MemberDescription_client_id(m)),
                                host: cstr(rdsys::rd_kafka_MemberDescription_host(m)),
                                instance_id: (!instance.is_null()).then(|| cstr(instance)),
                                consumer_id: cstr(rdsys::rd_kafka_MemberDescription_consumer_id(m)),
                                assignment: assignment_of(m),
                            }
                        })
                        .collect();
                    DescribedGroup {
                        result: Ok((state, members)),
                    }
                })
                .collect()
        }
    }
}

/// The partitions of a described member's assignment, (topic, partition).
///
/// # Safety
/// `member` is a live member description of a live event.
unsafe fn assignment_of(member: *const rdsys::rd_kafka_MemberDescription_t) -> Vec<(String, i32)> {
    // SAFETY: the caller's; the assignment and its list belong to the member (null when it has
    // none) and are only read here.
    unsafe {
        let assignment = rdsys::rd_kafka_MemberDescription_assignment(member);
        if assignment.is_null() {
            return Vec::new();
        }
        let list = rdsys::rd_kafka_MemberAssignment_partitions(assignment);
        if list.is_null() {
            return Vec::new();
        }
        let list = &*list;
        (0..list.cnt.max(0) as usize)
            .map(|i| {
                let tp = &*list.elems.add(i);
                (cstr(tp.topic), tp.partition)
            })
            .collect()
    }
}

/// An event of a client's main queue, as [`drain_main_queue`] hands it over.
pub(crate) enum MainEvent {
    /// An error event (`RD_KAFKA_EVENT_ERROR`).
    Error {
        code: RDKafkaErrorCode,
        reason: String,
    },
    /// A log line (`RD_KAFKA_EVENT_LOG`), with its syslog level.
    Log {
        facility: String,
        text: String,
        level: i32,
    },
}

/// Takes every event waiting now in `client`'s main queue (without blocking), handing errors
/// and log lines to `handle`; other events are dropped.
pub(crate) fn drain_main_queue<C: ClientContext>(
    client: &Client<C>,
    mut handle: impl FnMut(MainEvent),
) {
    // SAFETY: the client handle is live for the call; the queue handle returned is owned by
    // its guard and destroyed once, and every event polled from it is destroyed (by its
    // guard) after its last use; the strings read belong to the event.
    unsafe {
        let main = Guard::new(
            rdsys::rd_kafka_queue_get_main(client.native_ptr()),
            rdsys::rd_kafka_queue_destroy,
        );
        loop {
            let event = rdsys::rd_kafka_queue_poll(main.0, 0);
            if event.is_null() {
                return;
            }
            let event = Guard::new(event, rdsys::rd_kafka_event_destroy);
            match rdsys::rd_kafka_event_type(event.0) {
                rdsys::RD_KAFKA_EVENT_ERROR => handle(MainEvent::Error {
                    code: rdsys::rd_kafka_event_error(event.0).into(),
                    reason: cstr(rdsys::rd_kafka_event_error_string(event.0)),
                }),
                rdsys::RD_KAFKA_EVENT_LOG => {
                    let (mut fac, mut text, mut level) = (std::ptr::null(), std::ptr::null(), 0);
                    if rdsys::rd_kafka_event_log(event.0, &mut fac, &mut text, &mut level) == 0 {
                        handle(MainEvent::Log {
                            facility: cstr(fac),
                            text: cstr(text),
                            level,
                        });
                    }
                }
                _ => {}
            }
        }
    }
}
