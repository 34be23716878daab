//! What a stage knows of its consumer group and of the copies of tasks it does not own: who
//! holds each task, how many tasks nobody holds, and each standby's position (part of the
//! stage's metrics, module `metrics`).

/// The member of a stage's consumer group that holds a task, as the group coordinator
/// described the group, with the instance id and application endpoint it advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOwner {
    /// The task: partition `partition` of every source.
    pub partition: i32,
    /// The owning instance's `RuntimeConfig::instance_id`.
    pub instance_id: String,
    /// The `host:port` it advertises (`RuntimeConfig::application_endpoint`).
    pub endpoint: String,
}

/// How many of a stage's tasks (partitions) a member of its consumer group holds, as the group
/// coordinator described the group (`DescribeConsumerGroups`) at the stream thread's last
/// look: the partitions of the stage's sources, counted once per task (partition `p` of every
/// source), that no member's assignment holds. While the group rebalances every member has
/// given its partitions up (eager assignment), so every task counts;
/// a member that died is still counted as holding its tasks until its session times out, which
/// no client can tell apart from a slow member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The stage's tasks: partitions of each source.
    pub tasks: u64,
    /// Tasks no member holds.
    pub unowned: u64,
}

/// A standby: a warm copy of a task this instance does not own, kept by reading the task's
/// changelog partition `read_committed` (`RuntimeConfig::standby_replicas` of the runtime), so
/// that the task, assigned here, restores only the changelog's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyMetrics {
    /// The task (partition).
    pub partition: i32,
    /// The next changelog offset the copy reads (offsets, i64).
    pub position: i64,
    /// The changelog partition's high watermark, as the copy's consumer last fetched it;
    /// `None` before its first fetch response.
    pub end: Option<i64>,
    /// Changelog records the copy has read since it started.
    pub records: u64,
}

impl StandbyMetrics {
    /// Offsets between the partition's high watermark and the copy's position (`None`: not
    /// known yet). Commit markers count: a copy that has read everything committed is at the
    /// end, lag 0; the records of a transaction still open on the partition count as lag. The
    /// one rule of a standby's lag, shared with stale reads ([`StandbyAt::lag`](crate::query::StandbyAt::lag)).
    pub fn lag(&self) -> Option<i64> {
        crate::query::StandbyAt {
            position: self.position,
            end: self.end,
        }
        .lag()
    }
}
