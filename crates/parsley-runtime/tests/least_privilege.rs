//! Least privilege on the real broker, whose authorizer allows the secure listener's second
//! user nothing until an ACL does: an admin on the `PLAINTEXT` listener (a super user) grants
//! that principal exactly the ACLs the book's operations chapter lists, and a `CausalProducer`
//! and a two-stage pipeline — a repartition topic between the stages, a changelog, restored by
//! a second run — run as it over SASL_SSL and give the right output. Then each listed ACL is
//! left out in turn — a fresh application id and topics per case, so no state leaks between
//! cases — and the producer or a stage must fail, within the configured timeout, with
//! `KafkaError::Authorization` naming a resource that ACL covers: the list is necessary (each
//! ACL is) and sufficient (all of them run the pipeline). Where a `Read` or `Write` left out is
//! replaced by `Describe` on the same resource, the refusal comes later — at the fetch, the
//! send — and must be named the same way.
//!
//! With `$PARSLEY_BOOTSTRAP` pointing at another cluster there is no such user of ours: the
//! tests say so and pass.

use std::time::{Duration, Instant};

use parsley_runtime::{
    Acl, AclOperation, AclResource, CausalProducer, CausalProducerConfig, ClientSettings, Error,
    PatternType, Progress, ResourceType, Runtime, RuntimeConfig,
};
use parsley_stage::{InternalTopic, Topology};
use parsley_testkit::broker::{self, SecureListener};
use parsley_testkit::fixtures::{
    CountKeys, Forward, admin, committed_values, create_topic, unique_topic, utf8_stage,
};

/// The timeout of every blocking call of the producer and the stages in a case: a refusal
/// must be reported within it (a few seconds: the cases run one after another).
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a round may take to report its output or its failure: the timeout, plus the
/// stages' start (their clients' first connections over TLS and SCRAM).
const REPORTED_WITHIN: Duration = Duration::from_secs(15);

/// The tests of this file grant and revoke the one principal's ACLs: one at a time.
static PRINCIPAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The least-privilege listener, or `None` (said on stderr) on an external cluster.
fn least_privilege() -> Option<SecureListener> {
    match broker::least_privilege_listener() {
        Ok(Some(l)) => Some(l),
        Ok(None) if broker::uses_external_cluster() => {
            eprintln!("skipped: no least-privilege user on an external cluster");
            None
        }
        Ok(None) => panic!(
            "the local broker records no least-privilege user: restart it with \
             `cargo kafka down && cargo kafka up`"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Who needs an ACL: the producer writing the input, or the application's stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Producer,
    Stage,
}

/// One ACL of the list and who needs it.
struct Needed {
    what: &'static str,
    part: Part,
    acl: Acl,
}

/// Whether `acl` covers `resource`: same type, and the name equal (literal) or starting with
/// the ACL's (prefixed).
fn covers(acl: &Acl, resource: &AclResource) -> bool {
    let Some(name) = resource.name.as_deref() else {
        return acl.resource == ResourceType::Cluster && resource.kind == ResourceType::Cluster;
    };
    acl.resource == resource.kind
        && match acl.pattern {
            PatternType::Literal => name == acl.name,
            PatternType::Prefixed => name.starts_with(&acl.name),
        }
}

/// The names of one case: a fresh application id and topics.
struct Case {
    app: String,
    input: String,
    output: String,
    /// `route` before `count`, through a repartition topic; else `count` alone.
    two_stages: bool,
}

impl Case {
    fn new() -> Self {
        Case {
            app: unique_topic("lp"),
            input: create_topic("lp-in", 1).name,
            output: create_topic("lp-out", 1).name,
            two_stages: true,
        }
    }

    fn repartition(&self) -> String {
        format!("{}-route-repartition", self.app)
    }

    /// The ACLs the book lists for a `CausalProducer` writing the input and an application
    /// reading it, with a repartition topic and state, for `principal`.
    fn needed(&self, principal: &str) -> Vec<Needed> {
        use AclOperation::{Create, Read, Write};
        use ResourceType::{Group, Topic, TransactionalId};
        let (p, app) = (principal, self.app.as_str());
        let needed = |what, part, acl| Needed { what, part, acl };
        vec![
            needed(
                "producer: Write on its topic",
                Part::Producer,
                Acl::literal(Topic, &self.input, Write, p),
            ),
            needed(
                "application: Read on its input",
                Part::Stage,
                Acl::literal(Topic, &self.input, Read, p),
            ),
            needed(
                "application: Write on its output",
                Part::Stage,
                Acl::literal(Topic, &self.output, Write, p),
            ),
            needed(
                "application: Create on its internal topics",
                Part::Stage,
                Acl::prefixed(Topic, app, Create, p),
            ),
            needed(
                "application: Write on its internal topics",
                Part::Stage,
                Acl::prefixed(Topic, app, Write, p),
            ),
            needed(
                "application: Read on its internal topics",
                Part::Stage,
                Acl::prefixed(Topic, app, Read, p),
            ),
            needed(
                "application: Read on its consumer groups",
                Part::Stage,
                Acl::prefixed(Group, app, Read, p),
            ),
            needed(
                "application: Write on its transactional ids",
                Part::Stage,
                Acl::prefixed(TransactionalId, app, Write, p),
            ),
        ]
    }

    /// `route` forwards the input to the repartition topic; `count` counts its keys into the
    /// output, with a changelog.
    fn topology(&self) -> Topology {
        let (input, output, repartition) = (
            self.input.as_str(),
            self.output.as_str(),
            self.repartition(),
        );
        if !self.two_stages {
            return Topology::builder(&self.app)
                .stage("count", CountKeys::new(output), |s| {
                    utf8_stage(s, &[input], &[output])
                })
                .build()
                .unwrap();
        }
        Topology::builder(&self.app)
            .stage("route", Forward(repartition.clone()), |s| {
                utf8_stage(s, &[input], &[repartition.as_str()])
            })
            .stage("count", CountKeys::new(output), |s| {
                utf8_stage(s, &[repartition.as_str()], &[output])
            })
            .internal_topic(InternalTopic::new(&repartition, [self.input.clone()]))
            .build()
            .unwrap()
    }
}

/// Grants exactly `acls` to `principal` (its other ACLs deleted) and waits until the broker's
/// authorizer holds exactly them (`DescribeAcls` answered by the broker: evidence, not a sleep).
fn grant_exactly(acls: &[Acl], principal: &str) {
    let admin = admin();
    let old = admin.acls_of(principal).unwrap();
    admin.delete_acls(&old).unwrap();
    admin.create_acls(acls).unwrap();
    let mut wanted = acls.to_vec();
    wanted.sort_by_key(Acl::to_string);
    let started = Instant::now();
    loop {
        let mut held = admin.acls_of(principal).unwrap();
        held.sort_by_key(Acl::to_string);
        if held == wanted {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the broker holds {held:?}, not {wanted:?}"
        );
    }
}

/// What a case ended with.
enum Outcome {
    /// Both rounds committed their output.
    Ran,
    /// The producer or a stage failed in round `round` with this error, this long after the
    /// round's part started.
    Failed {
        part: Part,
        round: u32,
        error: std::sync::Arc<Error>,
        took: Duration,
    },
}

/// The settings that connect as the user of `l`.
fn settings(l: &SecureListener) -> ClientSettings {
    ClientSettings::new().set_all(l.client_properties())
}

/// Two rounds as the user of `l`: the producer sends three records, then the pipeline runs
/// until `count` has committed them (the second round restores its counts first).
fn run(case: &Case, l: &SecureListener) -> Outcome {
    for round in 1..=2 {
        let started = Instant::now();
        let mut config = CausalProducerConfig::new(&l.bootstrap).client_settings(settings(l));
        config.timeout = TIMEOUT;
        let produced = CausalProducer::new(config).and_then(|mut p| {
            for key in ["a", "b", "a"] {
                p.send(&case.input, key.as_bytes(), b"x")?;
            }
            p.flush()
        });
        if let Err(e) = produced {
            let (part, error, took) = (Part::Producer, e.into(), started.elapsed());
            return Outcome::Failed {
                part,
                round,
                error,
                took,
            };
        }
        let started = Instant::now();
        let mut config = RuntimeConfig::new(&l.bootstrap).client_settings(settings(l));
        config.timeout = TIMEOUT;
        config.instance_id = "a".into();
        let running = Runtime::new(case.topology(), config).start().unwrap();
        let failed = loop {
            let left = REPORTED_WITHIN.saturating_sub(started.elapsed());
            match running.next_progress(left) {
                Some(Progress::Committed { stage, metrics })
                    if stage == "count" && metrics.committed_deliveries >= 3 =>
                {
                    break None;
                }
                Some(Progress::Failed { error, .. }) => break Some(error),
                Some(_) if !left.is_zero() => {}
                _ => panic!(
                    "round {round}: neither output nor a failure within {REPORTED_WITHIN:?}: {:?}",
                    running.metrics()
                ),
            }
        };
        let took = started.elapsed();
        let _ = running.stop();
        if let Some(error) = failed {
            let part = Part::Stage;
            return Outcome::Failed {
                part,
                round,
                error,
                took,
            };
        }
    }
    Outcome::Ran
}

/// The resource of an authorization error, looking through `StageFailed`.
fn refused(error: &Error) -> Option<&AclResource> {
    match error.stage_error() {
        Error::Kafka(k) => k.refused_resource(),
        _ => None,
    }
}

/// Runs a case without `left_out` (replaced by `substitute`, if any) and returns what is wrong
/// with its failure, and a line for the report.
fn case_without(
    l: &SecureListener,
    index: usize,
    substitute: Option<AclOperation>,
) -> (Vec<String>, String) {
    let principal = l.principal();
    let case = Case::new();
    let mut acls = case.needed(&principal);
    let left_out = acls.remove(index);
    let mut acls: Vec<Acl> = acls.into_iter().map(|n| n.acl).collect();
    let what = match substitute {
        Some(op) => {
            acls.push(Acl {
                operation: op,
                ..left_out.acl.clone()
            });
            format!("{} (replaced by {op})", left_out.what)
        }
        None => left_out.what.to_string(),
    };
    grant_exactly(&acls, &principal);
    let (part, round, error, took) = match run(&case, l) {
        Outcome::Failed {
            part,
            round,
            error,
            took,
        } => (part, round, error, took),
        Outcome::Ran => return (vec![format!("{what}: ran without it")], String::new()),
    };
    let line = format!("{what}: {part:?} failed in round {round} after {took:?}: {error}");
    let mut problems = Vec::new();
    if part != left_out.part {
        problems.push(format!(
            "{what}: the {part:?} failed, not the {:?}",
            left_out.part
        ));
    }
    if !refused(&error).is_some_and(|r| covers(&left_out.acl, r)) {
        problems.push(format!(
            "{what}: not an authorization error on a resource {} covers: {error:?}",
            left_out.acl
        ));
    }
    if !error.is_fatal() {
        problems.push(format!("{what}: not fatal: {error}"));
    }
    if took >= REPORTED_WITHIN {
        problems.push(format!("{what}: reported after {took:?}"));
    }
    (problems, line)
}

#[test]
fn the_listed_acls_run_the_pipeline_and_each_one_left_out_is_named_in_a_typed_error() {
    let _one_at_a_time = PRINCIPAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = least_privilege() else { return };
    let principal = l.principal();

    // All of them: the pipeline runs, and restores, as the least-privilege user.
    let case = Case::new();
    let all: Vec<Acl> = case.needed(&principal).into_iter().map(|n| n.acl).collect();
    grant_exactly(&all, &principal);
    if let Outcome::Failed {
        part, round, error, ..
    } = run(&case, &l)
    {
        panic!("{part:?} failed in round {round} with every listed ACL: {error}");
    }
    let output = admin()
        .describe_topics(&[case.output.as_str()])
        .unwrap()
        .remove(0);
    assert_eq!(
        committed_values(&output),
        ["a=1", "b=1", "a=2", "a=3", "b=2", "a=4"]
    );

    // Each one left out; then each Read or Write left out with Describe in its place. Every
    // case runs, then every problem is reported together.
    let mut report = Vec::new();
    let mut problems = Vec::new();
    let needed = case.needed(&principal);
    for (i, n) in needed.iter().enumerate() {
        let mut substitutes = vec![None];
        if matches!(n.acl.operation, AclOperation::Read | AclOperation::Write)
            && n.acl.resource == ResourceType::Topic
        {
            substitutes.push(Some(AclOperation::Describe));
        }
        for substitute in substitutes {
            let (found, line) = case_without(&l, i, substitute);
            eprintln!("{line}");
            report.push(line);
            problems.extend(found);
        }
    }
    grant_exactly(&[], &principal);
    eprintln!("{}", report.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_restore_needs_read_on_its_changelog() {
    let _one_at_a_time = PRINCIPAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = least_privilege() else { return };
    let principal = l.principal();
    // One stage with state and no repartition topic: nothing but a restore reads an internal
    // topic, and the first run restores nothing.
    let case = Case {
        two_stages: false,
        ..Case::new()
    };
    let (read_internal, others): (Vec<Needed>, Vec<Needed>) =
        case.needed(&principal).into_iter().partition(|n| {
            n.acl.resource == ResourceType::Topic
                && n.acl.pattern == PatternType::Prefixed
                && n.acl.operation == AclOperation::Read
        });
    let others: Vec<Acl> = others.into_iter().map(|n| n.acl).collect();
    grant_exactly(&others, &principal);
    let Outcome::Failed {
        part,
        round,
        error,
        took,
    } = run(&case, &l)
    else {
        panic!("the restore read the changelog without Read on it");
    };
    eprintln!(
        "restore without {}: {took:?}: {error}",
        read_internal[0].acl
    );
    assert_eq!((part, round), (Part::Stage, 2), "{error}");
    let changelog =
        AclResource::named(ResourceType::Topic, format!("{}.count.changelog", case.app));
    assert_eq!(refused(&error), Some(&changelog), "{error:?}");
    assert!(error.is_fatal() && took < REPORTED_WITHIN, "{took:?}");
    grant_exactly(&[], &principal);
}

#[test]
fn a_transactional_causal_producer_needs_write_on_its_transactional_id_and_its_topic() {
    let _one_at_a_time = PRINCIPAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = least_privilege() else { return };
    let principal = l.principal();
    let id = unique_topic("lp-txn");
    let topic = create_topic("lp-txn-out", 1);
    let write_topic = Acl::literal(
        ResourceType::Topic,
        &topic.name,
        AclOperation::Write,
        &principal,
    );
    let write_id = Acl::literal(
        ResourceType::TransactionalId,
        &id,
        AclOperation::Write,
        &principal,
    );
    let send = |value: &[u8]| -> Result<(), Error> {
        let mut config = CausalProducerConfig::new(&l.bootstrap)
            .client_settings(settings(&l))
            .transactional(&id);
        config.timeout = TIMEOUT;
        let mut p = CausalProducer::new(config)?;
        p.begin()?;
        p.send(&topic.name, b"k", value)?;
        p.commit().map(drop)
    };
    grant_exactly(&[write_topic.clone(), write_id.clone()], &principal);
    send(b"v").unwrap();
    assert_eq!(committed_values(&topic), ["v"]);
    for (left_out, kept) in [(&write_id, &write_topic), (&write_topic, &write_id)] {
        grant_exactly(std::slice::from_ref(kept), &principal);
        let started = Instant::now();
        let error = send(b"w").unwrap_err();
        let took = started.elapsed();
        eprintln!("transactional producer without {left_out}: {took:?}: {error}");
        assert!(
            refused(&error).is_some_and(|r| covers(left_out, r)),
            "{left_out}: {error:?}"
        );
        assert!(error.is_fatal() && took < REPORTED_WITHIN, "{took:?}");
    }
    grant_exactly(&[], &principal);
    assert_eq!(committed_values(&topic), ["v"]);
}
