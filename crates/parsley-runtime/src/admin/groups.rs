//! A consumer group described over the classic protocol's own requests (`ListGroups` to every
//! broker, then `DescribeGroups` to the one that coordinates the group), not the admin API's
//! `DescribeConsumerGroups`.
//!
//! Why two ways: librdkafka's admin requests that go to a group coordinator can end the process
//! with an assertion (`rd_kafka_enq_once_del_source_return: eonce->refcnt > 0`) when the
//! coordinator's connection fails as the request is sent — a use-after-free in the admin
//! coordinator path, seen on the local three-node cluster 0.4–1.8 minutes after a node was
//! killed, while a stage described its group every few seconds. The classic requests take
//! another path in librdkafka, with no such object; the stage's periodic look at its group
//! (module `stage::ownership`) uses them. They cannot name a member's `group.instance.id`,
//! which only the rare, one-off descriptions that name members to a person need
//! ([`Admin::describe_group`]).
//!
//! A member's assignment comes as the consumer protocol's bytes (`ConsumerProtocolAssignment`:
//! a version `i16`, then an array of topics, each a string and an array of `i32` partitions,
//! then user data), decoded by [`decode_assignment`], which never panics on any bytes.

use std::time::Duration;

use rdkafka::error::KafkaError as LibError;
use rdkafka::types::RDKafkaErrorCode;

use super::{Admin, GroupMember, GroupView};
use crate::clients::ClientRole;
use parsley_task::error::{Operation, Result};

impl Admin {
    /// Group `group` as its coordinator describes it, over the classic protocol's requests
    /// (module docs), each member's `instance_id` `None`; waits at most `timeout`. A broker that
    /// does not answer within it (a node that is down) fails the call: the group may be on it.
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming the group, for a
    /// failed or partial answer or an assignment that does not decode;
    /// [`KafkaError::Authorization`](parsley_task::error::KafkaError::Authorization) when the
    /// principal may not describe it.
    pub(crate) fn describe_group_classic(
        &self,
        group: &str,
        timeout: Duration,
    ) -> Result<GroupView> {
        let fail = |message: String| super::describe_group_failed(group, message);
        let list = match self.client.inner().fetch_group_list(Some(group), timeout) {
            Ok(list) => list,
            Err(LibError::GroupListFetch(RDKafkaErrorCode::CoordinatorLoadInProgress)) => {
                return Ok(GroupView::Loading);
            }
            Err(LibError::GroupListFetch(code)) => {
                return Err(super::refused(
                    Operation::DescribeGroup,
                    code,
                    Some(group),
                    ClientRole::Admin,
                    code.to_string(),
                )
                .unwrap_or_else(|| fail(code.to_string())));
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
            // No broker lists the group: it has no member and no committed offset.
            return Ok(GroupView::Described {
                state: "Dead".into(),
                members: Vec::new(),
            });
        };
        let mut members = Vec::with_capacity(info.members().len());
        for m in info.members() {
            let assignment = decode_assignment(m.assignment().unwrap_or_default())
                .map_err(|why| fail(format!("the assignment of member {}: {why}", m.id())))?;
            members.push(GroupMember {
                client_id: m.client_id().to_string(),
                host: m.client_host().to_string(),
                instance_id: None,
                member_id: m.id().to_string(),
                assignment,
            });
        }
        Ok(GroupView::Described {
            state: info.state().to_string(),
            members,
        })
    }
}

/// The (topic, partition) pairs of a consumer protocol assignment (module docs); empty bytes are
/// an empty assignment (a member between two generations).
///
/// # Errors
/// What is wrong, with the byte position: a length past the end, a negative count, a topic name
/// that is not UTF-8.
pub(crate) fn decode_assignment(bytes: &[u8]) -> std::result::Result<Vec<(String, i32)>, String> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader { bytes, at: 0 };
    let _version = r.i16()?;
    let topics = r.count()?;
    let mut out = Vec::new();
    for _ in 0..topics {
        let len = r.i16()?;
        let len =
            usize::try_from(len).map_err(|_| format!("a null topic name at byte {}", r.at - 2))?;
        let start = r.at;
        let name = std::str::from_utf8(r.take(len)?)
            .map_err(|_| format!("a topic name that is not UTF-8 at byte {start}"))?
            .to_string();
        let partitions = r.count()?;
        for _ in 0..partitions {
            out.push((name.clone(), r.i32()?));
        }
    }
    // User data follows; the assignment does not need it.
    Ok(out)
}

/// A cursor over untrusted bytes: every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "{n} bytes wanted at byte {}, {} there",
                    self.at,
                    self.bytes.len() - self.at
                )
            })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn i16(&mut self) -> std::result::Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> std::result::Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An array's element count: -1 (null) is none; below that is an error; a count larger than
    /// the bytes left could hold (one byte per element at least) is an error before anything is
    /// allocated for it.
    fn count(&mut self) -> std::result::Result<usize, String> {
        let at = self.at;
        let n = self.i32()?;
        if n == -1 {
            return Ok(0);
        }
        let n = usize::try_from(n).map_err(|_| format!("a negative count {n} at byte {at}"))?;
        if n > self.bytes.len() - self.at {
            return Err(format!(
                "a count of {n} at byte {at} with {} bytes left",
                self.bytes.len() - self.at
            ));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 0 assignment of `topics`, with user data `user`.
    fn encode(topics: &[(&str, &[i32])], user: &[u8]) -> Vec<u8> {
        let mut b = 0i16.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (name, partitions) in topics {
            b.extend((name.len() as i16).to_be_bytes());
            b.extend(name.as_bytes());
            b.extend((partitions.len() as i32).to_be_bytes());
            for p in *partitions {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((user.len() as i32).to_be_bytes());
        b.extend(user);
        b
    }

    #[test]
    fn an_assignment_decodes_to_its_topic_partitions() {
        let bytes = encode(&[("orders", &[0, 2]), ("payments", &[1])], b"x");
        assert_eq!(
            decode_assignment(&bytes).unwrap(),
            [
                ("orders".to_string(), 0),
                ("orders".to_string(), 2),
                ("payments".to_string(), 1)
            ]
        );
        assert_eq!(decode_assignment(&[]).unwrap(), []);
        assert_eq!(decode_assignment(&encode(&[], b"")).unwrap(), []);
    }

    #[test]
    fn bad_bytes_are_errors_naming_the_position() {
        let good = encode(&[("orders", &[0, 2])], b"");
        // Cut anywhere inside the topics: an error, never a panic.
        for cut in 1..good.len() - 4 {
            let e = decode_assignment(&good[..cut]).unwrap_err();
            assert!(e.contains("byte"), "{cut}: {e}");
        }
        let mut huge = 0i16.to_be_bytes().to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        assert_eq!(
            decode_assignment(&huge).unwrap_err(),
            "a count of 2147483647 at byte 2 with 0 bytes left"
        );
        let mut negative = 0i16.to_be_bytes().to_vec();
        negative.extend((-2i32).to_be_bytes());
        assert_eq!(
            decode_assignment(&negative).unwrap_err(),
            "a negative count -2 at byte 2"
        );
    }

    #[test]
    fn any_bytes_decode_or_fail_without_a_panic() {
        // A deterministic walk over many short inputs (every prefix of mutated encodings).
        let base = encode(&[("t", &[1, 2, 3]), ("uu", &[7])], b"data");
        for i in 0..base.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut b = base.clone();
                b[i] = v;
                for cut in 0..=b.len() {
                    let _ = decode_assignment(&b[..cut]);
                }
            }
        }
    }
}
