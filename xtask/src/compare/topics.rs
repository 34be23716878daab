//! The comparison's topics: creating them, and reading one back to its end as a
//! `read_committed` consumer sees it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use parsley_runtime::rdkafka::message::Headers;
use parsley_runtime::rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use parsley_runtime::{Admin, TopicSpec};

use super::verdict::Record;

/// How long reading a topic back may take: a safety net, not a decision.
const READ_DEADLINE: Duration = Duration::from_secs(300);

/// Creates `names`, each with `partitions` partitions, and returns once the cluster describes
/// them.
///
/// # Errors
/// A topic that exists already, or an admin error.
pub fn create(admin: &Admin, names: &[&str], partitions: i32) -> Result<()> {
    let specs: Vec<TopicSpec> = names
        .iter()
        .map(|n| TopicSpec::new(*n, partitions))
        .collect();
    admin
        .create_topics(&specs)
        .with_context(|| format!("creating topics {names:?}"))?;
    Ok(())
}

/// Every record of `topic` that a `read_committed` consumer sees, partition by partition in
/// offset order, up to the end offsets (last stable offsets) read when the call begins. Done
/// when the consumer's position on every partition has reached its end: evidence, not
/// silence (a topic written in transactions ends with a marker the position passes).
///
/// # Errors
/// An admin or consumer error, or the ends not reached within [`READ_DEADLINE`].
pub fn read_to_end(bootstrap: &str, admin: &Admin, topic: &str) -> Result<Vec<Record>> {
    let info = admin.describe_topics(&[topic])?.remove(0);
    let partitions: Vec<(&str, i32)> = (0..info.partitions).map(|p| (topic, p)).collect();
    let ends = admin
        .last_stable_offsets(&partitions)
        .with_context(|| format!("the end offsets of {topic}"))?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("group.id", format!("{topic}.xtask-reader"))
        .create()
        .context("creating a reader")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..info.partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assigning the reader")?;
    let mut per_partition: Vec<Vec<Record>> = vec![Vec::new(); info.partitions as usize];
    let started = Instant::now();
    loop {
        let positions = consumer.position().context("the reader's positions")?;
        let open: Vec<i32> = (0..info.partitions)
            .filter(|p| {
                let end = ends[*p as usize];
                end > 0
                    && positions
                        .find_partition(topic, *p)
                        .and_then(|e| e.offset().to_raw())
                        .is_none_or(|at| at < end)
            })
            .collect();
        if open.is_empty() {
            return Ok(per_partition.concat());
        }
        if started.elapsed() > READ_DEADLINE {
            bail!(
                "reading {topic}: partitions {open:?} not read to their ends {ends:?} within \
                 {READ_DEADLINE:?}"
            );
        }
        while let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.with_context(|| format!("reading {topic}"))?;
            if m.offset() >= ends[m.partition() as usize] {
                continue;
            }
            per_partition[m.partition() as usize].push(Record {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                timestamp: m.timestamp().to_millis(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
}
