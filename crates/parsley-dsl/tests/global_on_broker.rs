//! A global table on the real broker: orders (2 partitions) named by a global table of
//! customers (3 partitions, not co-partitioned with them). Each task reads every partition of
//! the customers with its own reader, reads them to their end before its first join, resumes
//! them from its changelog after a restart and on the instance it moves to, and joins an order
//! stamped after a rename with that rename or a later one.

use std::collections::BTreeMap;

use parsley_dsl::StreamsBuilder;
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Running, Runtime, RuntimeConfig, TaskPhase,
};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, create_topic, next_failure, raw_producer, read_committed,
    unique_topic, wait_committed, wait_metrics, wait_tasks,
};
use rdkafka::producer::{BaseRecord, Producer};

/// Customers.
const CUSTOMERS: usize = 9;

fn start(app: &str, customers: &str, orders: &str, out: &str) -> Running {
    start_as(app, customers, orders, out, RuntimeConfig::new(bootstrap()))
}

fn start_as(app: &str, customers: &str, orders: &str, out: &str, config: RuntimeConfig) -> Running {
    let builder = StreamsBuilder::new(app);
    let names = builder.global_table::<String, String>(customers);
    builder
        .stream::<String, String>(orders)
        .join_global(
            &names,
            |_, order| order.split_once(':').map(|(c, _)| c.to_string()),
            |order, name| format!("{order}|{name}"),
        )
        .to(out);
    Runtime::new(builder.build().unwrap(), config)
        .start()
        .unwrap()
}

/// What the join wrote: order id → every value written for it.
fn joined(out: &parsley_runtime::TopicInfo) -> BTreeMap<String, Vec<String>> {
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in read_committed(out) {
        got.entry(String::from_utf8(r.key.unwrap()).unwrap())
            .or_default()
            .push(String::from_utf8(r.value.unwrap()).unwrap());
    }
    got
}

#[test]
fn every_task_reads_the_whole_global_table_before_its_first_join_and_after_a_restart() {
    let customers = create_topic("dsl-global-customers", 3);
    let orders = create_topic("dsl-global-orders", 2);
    let out = create_topic("dsl-global-named", 2);
    let app = unique_topic("dsl-global");

    // Before the start, plain writers: every customer named twice, then orders of each —
    // written before the renames' end, so only reading the table first joins them right.
    // The customers with librdkafka's default partitioner (a global table's keys are not
    // checked: every task reads every partition), the orders by murmur2.
    let plain = raw_producer(None);
    for version in 0..2 {
        for c in 0..CUSTOMERS {
            let (key, value) = (format!("c-{c}"), format!("c-{c}#{version}"));
            plain
                .send(BaseRecord::to(&customers.name).key(&key).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    for o in 0..20 {
        let (key, value) = (format!("o-{o}"), format!("c-{}:1", o % CUSTOMERS));
        let partition = parsley_runtime::partition_for(key.as_bytes(), orders.partitions);
        plain
            .send(
                BaseRecord::to(&orders.name)
                    .key(&key)
                    .payload(&value)
                    .partition(partition),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    plain.flush(DEADLINE).unwrap();

    let running = start(&app, &customers.name, &orders.name, &out.name);
    // Each of the two tasks delivers every row, and its orders.
    let rows = 2 * CUSTOMERS as u64;
    wait_committed(&running, &orders.name, 20 + 2 * rows);
    running.stop().unwrap();
    let got = joined(&out);
    assert_eq!(got.len(), 20);
    for (order, values) in &got {
        let o: usize = order[2..].parse().unwrap();
        let c = o % CUSTOMERS;
        assert_eq!(values, &[format!("c-{c}:1|c-{c}#1")], "{order}");
    }

    // Restarted: each task resumes the table from its changelog and its own positions (it
    // does not read the table again: only the new rows are delivered). A stamped writer
    // renames every customer and then writes orders: each is joined with the rename it
    // claims.
    let running = start(&app, &customers.name, &orders.name, &out.name);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    for c in 0..CUSTOMERS {
        producer
            .send(
                &customers.name,
                format!("c-{c}").as_bytes(),
                format!("c-{c}#2").as_bytes(),
            )
            .unwrap();
    }
    for o in 20..40 {
        producer
            .send(
                &orders.name,
                format!("o-{o}").as_bytes(),
                format!("c-{}:2", o % CUSTOMERS).as_bytes(),
            )
            .unwrap();
    }
    producer.flush().unwrap();
    let renamed = wait_committed(&running, &orders.name, 20 + 2 * CUSTOMERS as u64);
    assert_eq!(
        renamed.committed_deliveries,
        20 + 2 * CUSTOMERS as u64,
        "the rows before the restart are not delivered again"
    );
    running.stop().unwrap();
    let got = joined(&out);
    assert_eq!(got.len(), 40);
    for (order, values) in &got {
        let o: usize = order[2..].parse().unwrap();
        let (c, v) = (o % CUSTOMERS, if o < 20 { 1 } else { 2 });
        assert_eq!(
            values,
            &[format!("c-{c}:{v}|c-{c}#{v}")],
            "{order}: exactly once"
        );
    }
}

#[test]
fn a_task_that_moves_to_a_joining_instance_reads_the_global_table_there_and_joins_once() {
    let customers = create_topic("dsl-global-move-customers", 3);
    let orders = create_topic("dsl-global-move-orders", 2);
    let out = create_topic("dsl-global-move-named", 2);
    let app = unique_topic("dsl-global-move");
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    let mut write = |version: usize, orders_from: usize| {
        for c in 0..CUSTOMERS {
            producer
                .send(
                    &customers.name,
                    format!("c-{c}").as_bytes(),
                    format!("c-{c}#{version}").as_bytes(),
                )
                .unwrap();
        }
        for o in orders_from..orders_from + 20 {
            producer
                .send(
                    &orders.name,
                    format!("o-{o}").as_bytes(),
                    format!("c-{}:{version}", o % CUSTOMERS).as_bytes(),
                )
                .unwrap();
        }
        producer.flush().unwrap();
    };
    let config = |instance: &str| {
        let mut c = RuntimeConfig::new(bootstrap());
        c.instance_id = instance.to_string();
        c
    };
    write(0, 0);
    let a = start_as(&app, &customers.name, &orders.name, &out.name, config("a"));
    wait_committed(&a, &orders.name, 20 + 2 * CUSTOMERS as u64);
    // A second instance joins: one task moves to it, with its copy of the table.
    let b = start_as(&app, &customers.name, &orders.name, &out.name, config("b"));
    wait_tasks(&b, &orders.name, "a task moved to b", |t| {
        t.len() == 1 && t[0].phase == TaskPhase::Running
    });
    wait_tasks(&a, &orders.name, "a kept the other task", |t| t.len() == 1);
    write(1, 20);
    let committed = |r: &Running| {
        r.metrics()
            .into_iter()
            .find(|(n, _)| *n == orders.name)
            .map_or(0, |(_, m)| m.committed_deliveries)
    };
    // Each instance's task delivers the renames, and together they deliver the new orders.
    wait_metrics(&b, &orders.name, "both tasks took the second round", |mb| {
        mb.committed_deliveries >= CUSTOMERS as u64
            && committed(&a) >= 20 + 2 * CUSTOMERS as u64 + CUSTOMERS as u64
            && mb.committed_deliveries + committed(&a)
                >= 20 + 2 * CUSTOMERS as u64 + 2 * CUSTOMERS as u64 + 20
    });
    a.stop().unwrap();
    b.stop().unwrap();
    let got = joined(&out);
    assert_eq!(got.len(), 40);
    for (order, values) in &got {
        let o: usize = order[2..].parse().unwrap();
        let (c, v) = (o % CUSTOMERS, usize::from(o >= 20));
        assert_eq!(
            values,
            &[format!("c-{c}:{v}|c-{c}#{v}")],
            "{order}: exactly once"
        );
    }
}

#[test]
fn rows_deleted_before_a_restored_task_read_them_stop_the_stage_naming_the_lost_range() {
    let customers = create_topic("dsl-global-lost-customers", 1);
    let orders = create_topic("dsl-global-lost-orders", 1);
    let out = create_topic("dsl-global-lost-named", 1);
    let app = unique_topic("dsl-global-lost");
    let plain = raw_producer(None);
    let write_rows = |range: std::ops::Range<usize>| {
        for c in range {
            let (key, value) = (format!("c-{c}"), format!("c-{c}#0"));
            plain
                .send(BaseRecord::to(&customers.name).key(&key).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
        }
        plain.flush(DEADLINE).unwrap();
    };
    write_rows(0..5);
    let running = start(&app, &customers.name, &orders.name, &out.name);
    wait_committed(&running, &orders.name, 5);
    running.stop().unwrap();

    // Rows 5..10 written while the stage is stopped; 5, 6 and 7 deleted before it reads them.
    write_rows(5..10);
    assert_eq!(admin().delete_records(&customers.name, 0, 8).unwrap(), 8);
    let running = start(&app, &customers.name, &orders.name, &out.name);
    let error = next_failure(&running);
    assert!(
        matches!(
            &*error,
            parsley_runtime::Error::Record(parsley_runtime::RecordError::RecordsLost {
                topic, partition: 0, from: 5, log_start: 8
            }) if *topic == customers.name
        ),
        "{error:?}"
    );
    let _ = running.stop();
}
