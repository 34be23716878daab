//! DSL pipelines on the real broker: word count, the shop's revenue, a stream made a table, a
//! table re-grouped and counted, trace-context headers through a repartition, a foreign-key join of tables not co-partitioned, and a cogroup of two topics through repartition topics the
//! runtime creates, and the causal
//! stream–table join — a payment that claims an
//! order update is joined with that version, where the same pipeline with the gate switched
//! off (the negative control) joins an older one.

use std::collections::BTreeMap;

use parsley_dsl::StreamsBuilder;
use parsley_runtime::{CausalProducer, CausalProducerConfig, GateMode, Runtime, RuntimeConfig};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, create_topic, raw_producer, read_committed, unique_topic,
    wait_committed,
};
use rdkafka::producer::{BaseRecord, Producer};
use serde::{Deserialize, Serialize};

/// The last value of each key in `records` (keys UTF-8, values JSON).
fn last_values<V: serde::de::DeserializeOwned>(
    records: Vec<parsley_testkit::fixtures::ReadRecord>,
) -> BTreeMap<String, V> {
    records
        .into_iter()
        .map(|r| {
            (
                String::from_utf8(r.key.unwrap()).unwrap(),
                serde_json::from_slice(&r.value.unwrap()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn word_count_counts_every_word_through_a_repartition_topic_it_creates() {
    let lines = create_topic("dsl-lines", 3);
    let counts = create_topic("dsl-counts", 3);
    let words = ["apple", "pear", "fig", "plum", "kiwi", "lime", "date"];
    let mut expected = BTreeMap::<String, i64>::new();
    let producer = raw_producer(None);
    let mut total = 0u64;
    for i in 0..300usize {
        let line: Vec<&str> = (0..(i % 5 + 1))
            .map(|j| words[(i * 7 + j * 3) % words.len()])
            .collect();
        for w in &line {
            *expected.entry(w.to_string()).or_default() += 1;
            total += 1;
        }
        let text = line.join(" ").to_uppercase();
        producer
            .send(
                BaseRecord::<(), str>::to(&lines.name)
                    .partition((i % 3) as i32)
                    .payload(&text),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();

    let app = unique_topic("dsl-wc");
    let builder = StreamsBuilder::new(app.clone());
    builder
        .stream::<(), String>(&lines.name)
        .flat_map_values(|l| {
            l.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, w| w.clone())
        .named("words")
        .count()
        .to_stream()
        .to(&counts.name);
    let topology = builder.build().unwrap();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "words", total);
    running.stop().unwrap();

    let repartition = admin()
        .describe_topics(&[format!("{app}-words-repartition").as_str()])
        .unwrap();
    assert_eq!(
        repartition[0].partitions, 3,
        "co-partitioned with the lines"
    );
    let got: BTreeMap<String, i64> = last_values(read_committed(&counts));
    assert_eq!(got, expected);
}

#[test]
fn to_table_keeps_each_keys_latest_value_through_a_repartition_and_deletes_on_none() {
    let readings = create_topic("dsl-readings", 3);
    let table = create_topic("dsl-latest", 3);
    let producer = raw_producer(None);
    // Keyless readings, each sensor's in one partition, so their order survives the
    // repartition by sensor.
    let mut expected = BTreeMap::<String, Option<i64>>::new();
    let total = 200u64;
    for i in 0..total {
        let sensor = i % 11;
        // Every seventh reading withdraws the sensor: a deletion of its row.
        let reading = if i % 7 == 3 {
            "-".to_string()
        } else {
            i.to_string()
        };
        let parsed = reading.parse::<i64>().ok();
        if parsed.is_some() || expected.contains_key(&format!("s-{sensor}")) {
            expected.insert(format!("s-{sensor}"), parsed);
        }
        let line = format!("s-{sensor}:{reading}");
        producer
            .send(
                BaseRecord::<(), str>::to(&readings.name)
                    .partition((sensor % 3) as i32)
                    .payload(&line),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();

    let app = unique_topic("dsl-to-table");
    let builder = StreamsBuilder::new(app.clone());
    builder
        .stream::<(), String>(&readings.name)
        .select_key(|_, line| line.split(':').next().unwrap_or("").to_string())
        .map_values(|line| line.split(':').nth(1).and_then(|c| c.parse::<i64>().ok()))
        .named("latest")
        .to_table()
        .to_change_stream()
        .to(&table.name);
    let topology = builder.build().unwrap();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "latest", total);
    running.stop().unwrap();

    let repartition = admin()
        .describe_topics(&[format!("{app}-latest-repartition").as_str()])
        .unwrap();
    assert_eq!(repartition[0].partitions, 3);
    // The last change of each key: its value, or a tombstone when its last reading was "-".
    let got: BTreeMap<String, Option<i64>> = read_committed(&table)
        .into_iter()
        .map(|r| {
            (
                String::from_utf8(r.key.unwrap()).unwrap(),
                r.value.map(|v| serde_json::from_slice(&v).unwrap()),
            )
        })
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_regrouped_table_counts_each_group_as_rows_move_and_disappear() {
    let cities = ["oslo", "rome", "lima", "kyiv", "baku"];
    let customers = create_topic("dsl-customer-city", 3);
    let sizes = create_topic("dsl-city-sizes", 2);
    let producer = raw_producer(None);
    // Customers move between cities; every ninth update deletes the customer. The expected
    // count per city is the last state's, and the aggregation's deliveries are the records
    // the re-grouping sends: one for an update within its city, a retraction and an addition
    // for a move, a retraction for a deletion.
    let mut city_of = BTreeMap::<String, &str>::new();
    let mut regrouped = 0u64;
    let total = 240usize;
    for i in 0..total {
        let customer = format!("c-{}", i % 23);
        let city = (i % 9 != 4).then(|| cities[(i * 7 + i / 23) % cities.len()]);
        let before = city_of.get(&customer).copied();
        regrouped += match (before, city) {
            (Some(a), Some(b)) if a == b => 1,
            (a, b) => u64::from(a.is_some()) + u64::from(b.is_some()),
        };
        match city {
            Some(c) => city_of.insert(customer.clone(), c),
            None => city_of.remove(&customer),
        };
        let partition = parsley_runtime::partition_for(customer.as_bytes(), 3);
        let mut record = BaseRecord::<str, str>::to(&customers.name)
            .key(&customer)
            .partition(partition);
        if let Some(c) = city {
            record = record.payload(c);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(DEADLINE).unwrap();
    let mut expected: BTreeMap<String, i64> = cities.iter().map(|c| (c.to_string(), 0)).collect();
    for city in city_of.values() {
        *expected.get_mut(*city).unwrap() += 1;
    }

    let app = unique_topic("dsl-regroup");
    let builder = StreamsBuilder::new(app.clone());
    builder
        .table::<String, String>(&customers.name)
        .group_by(|_customer, city| (city.clone(), ()))
        .named("per-city")
        .count()
        .to_stream()
        .to(&sizes.name);
    let topology = builder.build().unwrap();
    assert_eq!(topology.stages().len(), 2, "{}", topology.describe());
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    running.wait_until_caught_up(DEADLINE).unwrap();
    let metrics = running.stop().unwrap();
    let per_city = metrics.iter().find(|(n, _)| n == "per-city").unwrap();
    assert_eq!(
        per_city.1.committed_deliveries, regrouped,
        "each retraction and addition folded once"
    );
    let repartition = admin()
        .describe_topics(&[format!("{app}-per-city-repartition").as_str()])
        .unwrap();
    assert_eq!(repartition[0].partitions, 3);
    // Every city that ever held a customer, with the count its rows leave it.
    let got: BTreeMap<String, i64> = last_values(read_committed(&sizes));
    assert_eq!(got, expected);
}

/// Writes `(key, value)` to `topic` keyed as Kafka Streams partitions (murmur2); `None` is a
/// tombstone.
fn send_keyed(
    producer: &rdkafka::producer::BaseProducer,
    topic: &parsley_runtime::TopicInfo,
    key: &str,
    value: Option<&str>,
) {
    let partition = parsley_runtime::partition_for(key.as_bytes(), topic.partitions);
    let mut record = BaseRecord::<str, str>::to(&topic.name)
        .key(key)
        .partition(partition);
    if let Some(v) = value {
        record = record.payload(v);
    }
    producer.send(record).map_err(|(e, _)| e).unwrap();
}

#[test]
fn a_foreign_key_join_follows_orders_across_customers_that_are_not_co_partitioned() {
    // Orders `o-N → "c-M:N"` (3 partitions) name customers `c-M → "c-M#N"` (2 partitions).
    let orders = create_topic("dsl-fk-orders", 3);
    let customers = create_topic("dsl-fk-customers", 2);
    let out = create_topic("dsl-fk-out", 3);
    let producer = raw_producer(None);
    let mut order_of = BTreeMap::<String, String>::new();
    let mut name_of = BTreeMap::<String, String>::new();
    // Orders move between customers, every eleventh update deletes one; customers are renamed
    // and every seventh update deletes one. `round` writes a batch of both.
    let mut round = |from: usize, to: usize| {
        for i in from..to {
            let order = format!("o-{}", i % 17);
            let value = (i % 11 != 5).then(|| format!("c-{}:{i}", (i * 5 + i / 17) % 9));
            send_keyed(&producer, &orders, &order, value.as_deref());
            match value {
                Some(v) => order_of.insert(order, v),
                None => order_of.remove(&order),
            };
            if i % 2 == 0 {
                let customer = format!("c-{}", (i / 2) % 9);
                let name = (i % 7 != 3).then(|| format!("{customer}#{i}"));
                send_keyed(&producer, &customers, &customer, name.as_deref());
                match name {
                    Some(n) => name_of.insert(customer, n),
                    None => name_of.remove(&customer),
                };
            }
        }
        producer.flush(DEADLINE).unwrap();
    };
    round(0, 200);

    let app = unique_topic("dsl-fk");
    let builder = StreamsBuilder::new(app.clone());
    let customers_table = builder.table::<String, String>(&customers.name);
    builder
        .table::<String, String>(&orders.name)
        .named("order-customer")
        .join_on_foreign_key(
            &customers_table,
            |order| order.split_once(':').map(|(c, _)| c.to_string()),
            |order, name| format!("{order}|{name}"),
        )
        .to_change_stream()
        .to(&out.name);
    let topology = builder.build().unwrap();
    assert_eq!(topology.stages().len(), 2, "{}", topology.describe());
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    running.wait_until_caught_up(DEADLINE).unwrap();
    // A second batch while it runs.
    round(200, 320);
    running.wait_until_caught_up(DEADLINE).unwrap();
    running.stop().unwrap();

    let topics = [
        format!("{app}-order-customer-subscription-registration"),
        format!("{app}-order-customer-subscription-response"),
    ];
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let partitions: Vec<i32> = admin()
        .describe_topics(&names)
        .unwrap()
        .iter()
        .map(|t| t.partitions)
        .collect();
    assert_eq!(
        partitions,
        [2, 3],
        "co-partitioned with customers, then with orders"
    );

    let mut last = BTreeMap::<String, Option<String>>::new();
    for r in read_committed(&out) {
        let key = String::from_utf8(r.key.unwrap()).unwrap();
        let value = r.value.map(|v| {
            serde_json::from_slice::<String>(&v).unwrap_or_else(|_| String::from_utf8(v).unwrap())
        });
        if let Some(v) = &value {
            // Every result joins an order's value with the customer that value names.
            let (order, name) = v.split_once('|').unwrap();
            let customer = order.split_once(':').unwrap().0;
            assert_eq!(name.split_once('#').unwrap().0, customer, "{key}: {v}");
        }
        last.insert(key, value);
    }
    let expected: BTreeMap<String, String> = order_of
        .iter()
        .filter_map(|(order, v)| {
            let customer = v.split_once(':').unwrap().0;
            name_of
                .get(customer)
                .map(|n| (order.clone(), format!("{v}|{n}")))
        })
        .collect();
    let got: BTreeMap<String, String> = last
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn trace_context_headers_travel_end_to_end_through_a_repartition() {
    use rdkafka::message::{Header, OwnedHeaders};
    let orders = create_topic("dsl-trace-orders", 2);
    let out = create_topic("dsl-trace-out", 3);
    let producer = raw_producer(None);
    let total = 60u32;
    for i in 0..total {
        let key = format!("o-{i}");
        let trace = format!("00-{i:032x}-{:016x}-01", i + 1);
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "traceparent",
                value: Some(trace.as_str()),
            })
            .insert(Header {
                key: "tenant",
                value: Some(if i % 2 == 0 { "acme" } else { "globex" }),
            });
        let partition = parsley_runtime::partition_for(key.as_bytes(), 2);
        producer
            .send(
                BaseRecord::to(&orders.name)
                    .key(&key)
                    .payload(&format!("customer-{}", i % 7))
                    .partition(partition)
                    .headers(headers),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();

    // Re-keyed by customer through a repartition topic into a second stage: each output must
    // carry its input's trace context, unchanged, beside the stage's own stamp.
    let app = unique_topic("dsl-trace");
    let builder = StreamsBuilder::new(app);
    builder
        .stream::<String, String>(&orders.name)
        .select_key(|_, customer| customer.clone())
        .named("by-customer")
        .repartition()
        .map_values(|customer| customer.to_uppercase())
        .to(&out.name);
    let topology = builder.build().unwrap();
    assert_eq!(topology.stages().len(), 2, "{}", topology.describe());
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    running.wait_until_caught_up(DEADLINE).unwrap();
    running.stop().unwrap();

    let records = read_committed(&out);
    assert_eq!(records.len(), total as usize);
    let mut traces: Vec<String> = records
        .iter()
        .map(|r| {
            assert!(r.stamp.is_some(), "stamped by the second stage");
            let user: Vec<&str> = r
                .headers
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !parsley_stage::is_own_header(n))
                .collect();
            assert_eq!(user, ["traceparent", "tenant"], "in order, nothing added");
            r.header("traceparent").unwrap()
        })
        .collect();
    traces.sort();
    let mut expected: Vec<String> = (0..total)
        .map(|i| format!("00-{i:032x}-{:016x}-01", i + 1))
        .collect();
    expected.sort();
    assert_eq!(traces, expected);
}

#[test]
fn a_cogroup_folds_two_topics_into_one_total_per_key_through_their_repartitions() {
    let words = create_topic("dsl-cg-words", 3);
    let bonuses = create_topic("dsl-cg-bonuses", 2);
    let totals = create_topic("dsl-cg-totals", 3);
    let names = ["apple", "pear", "fig", "plum", "kiwi"];
    let mut expected = BTreeMap::<String, i64>::new();
    let producer = raw_producer(None);
    let total = 300u64;
    for i in 0..total as usize {
        let name = names[(i * 7) % names.len()];
        // Every third record is a bonus `name:points`, the others a word counting one.
        let (topic, payload, partitions) = if i % 3 == 0 {
            *expected.entry(name.to_string()).or_default() += (i % 10) as i64;
            (&bonuses, format!("{name}:{}", i % 10), 2)
        } else {
            *expected.entry(name.to_string()).or_default() += 1;
            (&words, name.to_string(), 3)
        };
        producer
            .send(
                BaseRecord::<(), str>::to(&topic.name)
                    .partition((i % partitions) as i32)
                    .payload(&payload),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();

    let app = unique_topic("dsl-cogroup");
    let builder = StreamsBuilder::new(app.clone());
    let bonus = builder
        .stream::<(), String>(&bonuses.name)
        .group_by(|_, b| b.split(':').next().unwrap_or("").to_string());
    builder
        .stream::<(), String>(&words.name)
        .group_by(|_, w| w.clone())
        .cogroup(|_, _word, total: i64| total + 1)
        .cogroup(bonus, |_, b, total| {
            total
                + b.split(':')
                    .nth(1)
                    .and_then(|p| p.parse::<i64>().ok())
                    .unwrap_or(0)
        })
        .named("tally")
        .aggregate(|| 0)
        .to_stream()
        .to(&totals.name);
    let topology = builder.build().unwrap();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    // The stage after both repartitions takes its name from the first: tally-0.
    wait_committed(&running, "tally-0", total);
    running.stop().unwrap();

    // Both repartitions are co-partitioned: the partition count of the widest input.
    for n in 0..2 {
        let topic = admin()
            .describe_topics(&[format!("{app}-tally-{n}-repartition").as_str()])
            .unwrap();
        assert_eq!(topic[0].partitions, 3);
    }
    let got: BTreeMap<String, i64> = last_values(read_committed(&totals));
    assert_eq!(got, expected);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    customer: String,
    amount_cents: i64,
    note: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    amount_cents: i64,
}

#[test]
fn revenue_per_customer_through_a_join_and_a_repartition() {
    let orders = create_topic("dsl-orders", 2);
    let payments = create_topic("dsl-payments", 2);
    let revenue = create_topic("dsl-revenue", 2);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    let mut expected = BTreeMap::<String, i64>::new();
    for i in 0..120i64 {
        let order = Order {
            customer: format!("c-{}", i % 7),
            amount_cents: 100 + i,
            note: String::new(),
        };
        let key = format!("o-{i:04}");
        producer
            .send(
                &orders.name,
                key.as_bytes(),
                &serde_json::to_vec(&order).unwrap(),
            )
            .unwrap();
        // Every third order stays unpaid.
        if i % 3 != 0 {
            *expected.entry(order.customer.clone()).or_default() += order.amount_cents;
            let payment = Payment {
                amount_cents: order.amount_cents,
            };
            producer
                .send(
                    &payments.name,
                    key.as_bytes(),
                    &serde_json::to_vec(&payment).unwrap(),
                )
                .unwrap();
        }
    }
    producer.flush().unwrap();

    let app = unique_topic("dsl-shop");
    let builder = StreamsBuilder::new(app.clone());
    let table = builder.table::<String, Order>(&orders.name);
    builder
        .stream::<String, Payment>(&payments.name)
        .join(&table, |_, order| order.clone())
        .select_key(|_, order| order.customer.clone())
        .group_by_key()
        .named("revenue")
        .aggregate(|| 0i64, |_, order, total| total + order.amount_cents)
        .to_stream()
        .to(&revenue.name);
    let topology = builder.build().unwrap();
    assert_eq!(topology.stages().len(), 2, "{}", topology.describe());
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    // Every input and every repartitioned record consumed and committed: the evidence is
    // offsets, not a count of the test's own.
    running.wait_until_caught_up(DEADLINE).unwrap();
    let metrics = running.stop().unwrap();
    let revenue_stage = metrics.iter().find(|(n, _)| n == "revenue").unwrap();
    assert_eq!(
        revenue_stage.1.committed_deliveries, 80,
        "one per paid order"
    );
    let got: BTreeMap<String, i64> = last_values(read_committed(&revenue));
    assert_eq!(got, expected);
}

/// Versions of one order the table holds before the payment.
const VERSIONS: usize = 300;

/// Runs `payments.join(orders)` with `gate` over the prepared topics and returns the customer
/// each payment was joined with.
fn joined_customers(gate: GateMode, orders: &str, payments: &str, total: u64) -> Vec<String> {
    let out = create_topic("dsl-joined", 1);
    let builder = StreamsBuilder::new(unique_topic("dsl-join"));
    let table = builder.table::<String, Order>(orders);
    builder
        .stream::<String, Payment>(payments)
        .named("settle")
        .join(&table, |_, order| order.customer.clone())
        .to(&out.name);
    let config = RuntimeConfig::new(bootstrap())
        .gate(gate)
        .consumer_property("max.partition.fetch.bytes", "65536")
        .consumer_property("fetch.max.bytes", "131072")
        .consumer_property("message.max.bytes", "131072");
    let running = Runtime::new(builder.build().unwrap(), config)
        .start()
        .unwrap();
    wait_committed(&running, orders, total);
    running.stop().unwrap();
    read_committed(&out)
        .into_iter()
        // A `String` value is written as its UTF-8 bytes (the `Auto` codec).
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect()
}

#[test]
fn a_payment_that_claims_an_order_update_joins_that_version_and_without_the_gate_it_does_not() {
    // The race is made by the data, not by timing (as in the runtime's gate test): the update
    // the payment claims is the last of many heavy versions on one partition, fetched 64 KiB
    // at a time, while the payment is the only, small record of the other topic.
    let orders = create_topic("dsl-order-versions", 1);
    let payments = create_topic("dsl-order-payments", 1);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    let note = "x".repeat(16 * 1024);
    for v in 0..VERSIONS {
        let order = Order {
            customer: format!("customer-v{v}"),
            amount_cents: 500,
            note: note.clone(),
        };
        producer
            .send(&orders.name, b"o-1", &serde_json::to_vec(&order).unwrap())
            .unwrap();
    }
    // Sent after every version was acknowledged: the payment claims the last one.
    producer
        .send(
            &payments.name,
            b"o-1",
            &serde_json::to_vec(&Payment { amount_cents: 500 }).unwrap(),
        )
        .unwrap();
    producer.flush().unwrap();
    let total = VERSIONS as u64 + 1;
    let latest = format!("customer-v{}", VERSIONS - 1);

    let joined = joined_customers(GateMode::Causal, &orders.name, &payments.name, total);
    assert_eq!(
        joined,
        std::slice::from_ref(&latest),
        "the payment joins the version it claims"
    );

    let joined = joined_customers(GateMode::Off, &orders.name, &payments.name, total);
    assert_ne!(
        joined,
        [latest],
        "negative control: without the gate the payment overtakes the update it claims and \
         joins an older version of the order (or none)"
    );
}

#[test]
fn waiting_to_catch_up_ends_with_the_error_of_a_stage_that_fails() {
    let input = create_topic("dsl-bad-in", 1);
    let out = create_topic("dsl-bad-out", 1);
    let producer = raw_producer(None);
    for value in ["1", "2", "three"] {
        producer
            .send(BaseRecord::to(&input.name).key("k").payload(value))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();
    let builder = StreamsBuilder::new(unique_topic("dsl-bad"));
    builder
        .stream::<String, i64>(&input.name)
        .group_by_key()
        .named("sum")
        .reduce(|a, b| a + b)
        .to_stream()
        .to(&out.name);
    let running = Runtime::new(builder.build().unwrap(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let err = running.wait_until_caught_up(DEADLINE).unwrap_err();
    let parsley_runtime::Error::StageFailed { stage, source } = &err else {
        panic!("expected the stage's failure, got {err}")
    };
    assert_eq!(stage, &input.name);
    assert!(
        matches!(
            &**source,
            parsley_runtime::Error::Processing(parsley_runtime::ProcessingError::Stage(
                parsley_stage::Error::Decode { offset: 2, .. }
            ))
        ),
        "{source}"
    );
    let _ = running.stop();
}
