//! A topology described for people: its stages, what each reads, runs and writes, and the
//! topics the topology creates for itself — the analogue of Kafka Streams'
//! `Topology#describe`, where a Parsley stage stands for a sub-topology.
//!
//! The top of the crate: it reads a built [`Topology`]; no module imports it.

use std::fmt;

use crate::topology::Topology;

/// What [`Topology::describe`] returns; its `Display` is the printed description:
///
/// ```text
/// Topology shop
///   Stage payments (consumer group shop.payments, changelog shop.payments.changelog)
///     sources: payments, orders
///     operators:
///       …
///     sinks: shop-revenue-repartition (internal, partitions as orders)
///   Stage revenue (consumer group shop.revenue, changelog shop.revenue.changelog)
///     sources: shop-revenue-repartition (internal), shop-revenue-clock (internal, built-in clock: lag 500 ms, a tick every 100 ms)
///     …
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyDescription {
    /// The application id.
    pub application_id: String,
    /// The stages, in the order the topology lists them.
    pub stages: Vec<StageDescription>,
}

/// One stage of a [`TopologyDescription`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageDescription {
    /// The stage's name.
    pub name: String,
    /// Its consumer group.
    pub group: String,
    /// Its changelog topic.
    pub changelog: String,
    /// Its source topics, each with `(internal)` when the topology creates it; the topic of a
    /// built-in clock with its lag and tick interval.
    pub sources: Vec<String>,
    /// Its sink topics, each with `(internal, partitions as …)` when the topology creates it.
    pub sinks: Vec<String>,
    /// One line per operator (empty for a stage added with a handler).
    pub operators: Vec<String>,
}

impl Topology {
    /// The topology described: stages, their sources, operators and sinks, internal and
    /// changelog topics.
    pub fn describe(&self) -> TopologyDescription {
        let app = self.application_id();
        let internal = |topic: &String, with_partitions: bool| match self
            .internal_topics()
            .iter()
            .find(|t| t.name == *topic)
        {
            Some(t) if with_partitions => format!(
                "{topic} (internal, partitions as {})",
                t.partitions_of.join(", ")
            ),
            Some(_) => format!("{topic} (internal)"),
            None => topic.clone(),
        };
        TopologyDescription {
            application_id: app.to_string(),
            stages: self
                .stages()
                .iter()
                .map(|s| StageDescription {
                    name: s.name().to_string(),
                    group: s.group_id(app),
                    changelog: s.changelog_topic(app),
                    sources: s
                        .sources()
                        .iter()
                        .map(|t| match s.event_time().and_then(|o| o.clock) {
                            Some(c) if s.clock_topic() == Some(t.as_str()) => format!(
                                "{t} (internal, built-in clock: lag {} ms, a tick every {} ms)",
                                c.lag_ms, c.tick_interval_ms
                            ),
                            _ if s.is_global(t) => format!("{t} (global: every partition)"),
                            _ => internal(t, false),
                        })
                        .collect(),
                    sinks: s.sinks().iter().map(|t| internal(t, true)).collect(),
                    operators: s.operators().to_vec(),
                })
                .collect(),
        }
    }
}

impl fmt::Display for TopologyDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Topology {}", self.application_id)?;
        for s in &self.stages {
            writeln!(
                f,
                "  Stage {} (consumer group {}, changelog {})",
                s.name, s.group, s.changelog
            )?;
            writeln!(f, "    sources: {}", s.sources.join(", "))?;
            if !s.operators.is_empty() {
                writeln!(f, "    operators:")?;
                for line in &s.operators {
                    writeln!(f, "      {line}")?;
                }
            }
            if s.sinks.is_empty() {
                writeln!(f, "    sinks: none")?;
            } else {
                writeln!(f, "    sinks: {}", s.sinks.join(", "))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::handler::{HandlerError, Record, Step};
    use crate::{EventTimeOrder, Handler, InternalTopic, Topology};

    struct Pass;
    impl Handler for Pass {
        type Key = String;
        type Value = u32;
        type Output = u32;
        type State = ();
        fn handle(
            &self,
            r: Record<'_, String, u32>,
            _: Option<()>,
        ) -> Result<Step<String, u32, ()>, HandlerError> {
            Ok(Step::none().emit("app-x-repartition", r.key, r.value))
        }
    }

    #[test]
    fn describe_lists_stages_topics_and_internal_topics() {
        let t = Topology::builder("app")
            .stage("first", Pass, |s| s.source("in").sink("app-x-repartition"))
            .stage("second", Pass, |s| s.source("app-x-repartition"))
            .internal_topic(InternalTopic::new("app-x-repartition", ["in".to_string()]))
            .build()
            .unwrap();
        assert_eq!(
            t.describe().to_string(),
            "Topology app\n\
             \x20 Stage first (consumer group app.first, changelog app.first.changelog)\n\
             \x20   sources: in\n\
             \x20   sinks: app-x-repartition (internal, partitions as in)\n\
             \x20 Stage second (consumer group app.second, changelog app.second.changelog)\n\
             \x20   sources: app-x-repartition (internal)\n\
             \x20   sinks: none\n"
        );
    }

    #[test]
    fn describe_shows_a_built_in_clock_with_its_lag_and_interval() {
        let t = Topology::builder("app")
            .stage("first", Pass, |s| s.source("in").sink("app-x-repartition"))
            .stage("second", Pass, |s| {
                s.source("app-x-repartition")
                    .order_by_event_time(EventTimeOrder::new().clock(500).tick_interval_ms(50))
            })
            .internal_topic(InternalTopic::new("app-x-repartition", ["in".to_string()]))
            .build()
            .unwrap();
        let text = t.describe().to_string();
        assert!(
            text.contains(
                "  Stage second (consumer group app.second, changelog app.second.changelog)\n\
                 \x20   sources: app-x-repartition (internal), app-second-clock (internal, \
                 built-in clock: lag 500 ms, a tick every 50 ms)\n"
            ),
            "{text}"
        );
    }
}
