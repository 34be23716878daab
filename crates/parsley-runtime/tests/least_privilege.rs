//! Least privilege on the real broker, whose authorizer allows the secure listener's second
//! user nothing until an ACL does: an admin on the `PLAINTEXT` listener (a super user) grants
//! that principal exactly the ACLs the book's operations chapter lists, and a `CausalProducer`
//! and a counting stage (with a changelog) run as it over SASL_SSL and give the right output.
//! Then each listed ACL is left out in turn — fresh application id and topics per case, so no
//! state leaks between cases — and the producer or the stage must fail, within the configured
//! timeout, with `KafkaError::Authorization` naming the resource: the list is necessary (each
//! ACL is) and sufficient (all of them run the pipeline).
//!
//! With `$PARSLEY_BOOTSTRAP` pointing at another cluster there is no such user of ours: the
//! tests say so and pass.

use std::time::{Duration, Instant};

use parsley_runtime::{
    Acl, AclOperation, CausalProducer, CausalProducerConfig, ClientSettings, Error, KafkaError,
    Progress, ResourceType, Runtime, RuntimeConfig,
};
use parsley_stage::Topology;
use parsley_testkit::broker::{self, SecureListener};
use parsley_testkit::fixtures::{
    CountKeys, admin, committed_values, create_topic, unique_topic, utf8_stage,
};

/// The timeout of every blocking call of the producer and the stage in a case: a refusal must
/// be reported within it (a few seconds: the cases run one after another).
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a case may take to report its failure: the timeout, plus a stage's start (its
/// clients' first connection over TLS and SCRAM).
const REPORTED_WITHIN: Duration = Duration::from_secs(15);

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

/// Who needs an ACL: the producer writing the input, or the stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Producer,
    Stage,
}

/// One ACL of the list, who needs it, and the resource a refusal must name without it.
struct Needed {
    what: &'static str,
    part: Part,
    acl: Acl,
    refused: (ResourceType, String),
}

/// The names of one case: a fresh application id and topics.
struct Case {
    app: String,
    input: String,
    output: String,
}

impl Case {
    fn new() -> Self {
        Case {
            app: unique_topic("lp"),
            input: create_topic("lp-in", 1).name,
            output: create_topic("lp-out", 1).name,
        }
    }

    /// The stage's consumer group, changelog and transactional id (instance id `a`).
    fn group(&self) -> String {
        format!("{}.count", self.app)
    }

    /// The ACLs the book lists for a `CausalProducer` writing the input and a stage reading
    /// it, with state, for `principal`.
    fn needed(&self, principal: &str) -> Vec<Needed> {
        use AclOperation::{Create, Read, Write};
        use ResourceType::{Group, Topic, TransactionalId};
        let p = principal;
        let changelog = format!("{}.changelog", self.group());
        vec![
            Needed {
                what: "producer: Write on its topic",
                part: Part::Producer,
                acl: Acl::literal(Topic, &self.input, Write, p),
                refused: (Topic, self.input.clone()),
            },
            Needed {
                what: "stage: Read on its input",
                part: Part::Stage,
                acl: Acl::literal(Topic, &self.input, Read, p),
                refused: (Topic, self.input.clone()),
            },
            Needed {
                what: "stage: Write on its output",
                part: Part::Stage,
                acl: Acl::literal(Topic, &self.output, Write, p),
                refused: (Topic, self.output.clone()),
            },
            Needed {
                what: "stage: Create on its internal topics",
                part: Part::Stage,
                acl: Acl::prefixed(Topic, &self.app, Create, p),
                refused: (Topic, changelog.clone()),
            },
            Needed {
                what: "stage: Write on its internal topics",
                part: Part::Stage,
                acl: Acl::prefixed(Topic, &self.app, Write, p),
                refused: (Topic, changelog.clone()),
            },
            Needed {
                what: "stage: Read on its consumer groups",
                part: Part::Stage,
                acl: Acl::prefixed(Group, &self.app, Read, p),
                refused: (Group, self.group()),
            },
            Needed {
                what: "stage: Write on its transactional ids",
                part: Part::Stage,
                acl: Acl::prefixed(TransactionalId, &self.app, Write, p),
                refused: (TransactionalId, format!("{}-a-0", self.group())),
            },
        ]
    }

    fn topology(&self) -> Topology {
        let (input, output) = (self.input.as_str(), self.output.as_str());
        Topology::builder(&self.app)
            .stage("count", CountKeys::new(output), |s| {
                utf8_stage(s, &[input], &[output])
            })
            .build()
            .unwrap()
    }
}

/// Grants `acls` and waits until the broker's authorizer holds exactly them for the principal
/// (`DescribeAcls` answered by the broker: evidence, not a sleep).
fn grant_exactly(acls: &[Acl], principal: &str) {
    let admin = admin();
    let old = admin.acls_of(principal).unwrap();
    admin.delete_acls(&old).unwrap();
    admin.create_acls(acls).unwrap();
    let started = Instant::now();
    loop {
        let mut held = admin.acls_of(principal).unwrap();
        let mut wanted = acls.to_vec();
        let key = |a: &Acl| a.to_string();
        held.sort_by_key(key);
        wanted.sort_by_key(key);
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
    /// The stage committed its output.
    Ran,
    /// The producer or the stage failed with this error, after this long.
    Failed(Part, std::sync::Arc<Error>, Duration),
}

/// Runs the producer (3 records) and then the stage as the least-privilege user `l`, until the
/// stage has committed 3 deliveries or something failed.
fn run(case: &Case, l: &SecureListener) -> Outcome {
    let settings = ClientSettings::new().set_all(l.client_properties());
    let started = Instant::now();
    let mut config = CausalProducerConfig::new(&l.bootstrap).client_settings(settings.clone());
    config.timeout = TIMEOUT;
    let produced = CausalProducer::new(config).and_then(|mut p| {
        for key in ["a", "b", "a"] {
            p.send(&case.input, key.as_bytes(), b"x")?;
        }
        p.flush()
    });
    if let Err(e) = produced {
        return Outcome::Failed(Part::Producer, e.into(), started.elapsed());
    }
    let started = Instant::now();
    let mut config = RuntimeConfig::new(&l.bootstrap).client_settings(settings);
    config.timeout = TIMEOUT;
    config.instance_id = "a".into();
    let running = Runtime::new(case.topology(), config).start().unwrap();
    let outcome = loop {
        let left = REPORTED_WITHIN.saturating_sub(started.elapsed());
        match running.next_progress(left) {
            Some(Progress::Committed { metrics, .. }) if metrics.committed_deliveries >= 3 => {
                break Outcome::Ran;
            }
            Some(Progress::Failed { error, .. }) => {
                break Outcome::Failed(Part::Stage, error, started.elapsed());
            }
            Some(_) if !left.is_zero() => {}
            _ => panic!(
                "neither output nor a failure within {REPORTED_WITHIN:?}: metrics {:?}",
                running.metrics()
            ),
        }
    };
    let _ = running.stop();
    outcome
}

#[test]
fn the_listed_acls_run_the_pipeline_and_each_one_left_out_is_named_in_a_typed_error() {
    let Some(l) = least_privilege() else { return };
    let principal = l.principal();

    // All of them: the pipeline runs as the least-privilege user.
    let case = Case::new();
    let all: Vec<Acl> = case.needed(&principal).into_iter().map(|n| n.acl).collect();
    grant_exactly(&all, &principal);
    match run(&case, &l) {
        Outcome::Ran => {}
        Outcome::Failed(part, e, _) => panic!("{part:?} failed with every listed ACL: {e}"),
    }
    let output = parsley_testkit::fixtures::admin()
        .describe_topics(&[case.output.as_str()])
        .unwrap()
        .remove(0);
    assert_eq!(committed_values(&output), ["a=1", "b=1", "a=2"]);

    // Each one left out: every case runs, then every problem is reported together.
    let mut report = Vec::new();
    let mut problems = Vec::new();
    let count = case.needed(&principal).len();
    for i in 0..count {
        let case = Case::new();
        let mut needed = case.needed(&principal);
        let left_out = needed.remove(i);
        let acls: Vec<Acl> = needed.into_iter().map(|n| n.acl).collect();
        grant_exactly(&acls, &principal);
        let what = left_out.what;
        let (part, error, took) = match run(&case, &l) {
            Outcome::Failed(part, e, took) => (part, e, took),
            Outcome::Ran => {
                problems.push(format!("{what}: the pipeline ran without it"));
                continue;
            }
        };
        report.push(format!(
            "{what} left out: {part:?} failed after {took:?}: {error}"
        ));
        let (kind, name) = &left_out.refused;
        let named = matches!(error.stage_error(), Error::Kafka(KafkaError::Authorization { resource, .. })
            if resource.kind == *kind && resource.name.as_deref() == Some(name.as_str()));
        if part != left_out.part {
            problems.push(format!(
                "{what}: the {part:?} failed, not the {:?}",
                left_out.part
            ));
        }
        if !named {
            problems.push(format!(
                "{what}: not an authorization error naming {kind} {name}: {error:?}"
            ));
        }
        if !error.is_fatal() {
            problems.push(format!("{what}: not fatal: {error}"));
        }
        if took >= REPORTED_WITHIN {
            problems.push(format!("{what}: reported after {took:?}"));
        }
    }
    admin()
        .delete_acls(&admin().acls_of(&principal).unwrap())
        .unwrap();
    eprintln!("{}", report.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
