//! The comparison's pure part: decoding the two sides' output values, the final value per key,
//! the answers expected from the inputs, key-by-key comparison and the verdict.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result, bail};
use shop::model::{Order, Payment};

/// The final value of every key of one output (or of an expected answer).
pub type Finals = BTreeMap<String, i64>;

/// At most this many differing keys are listed in a summary.
pub const LISTED: usize = 10;

/// One record read from a topic: what the comparison looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes (`None`: a null key).
    pub key: Option<Vec<u8>>,
    /// Value bytes (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Record timestamp, ms since the epoch.
    pub timestamp: Option<i64>,
    /// Its headers, in order (`None`: a null value), Parsley's stamp included.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A Kafka Streams output value: a `Long` in `Serdes.Long()`'s encoding, 8 bytes big-endian.
///
/// # Errors
/// A value that is not 8 bytes long.
pub fn decode_ks_long(value: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = value
        .try_into()
        .with_context(|| format!("a Long is 8 bytes, this value has {}", value.len()))?;
    Ok(i64::from_be_bytes(bytes))
}

/// A Parsley output value: a JSON number that is an integer (`42`, or `42.0`).
///
/// # Errors
/// A value that is not JSON, not a number, or not an integer that fits an `i64`.
pub fn decode_json_number(value: &[u8]) -> Result<i64> {
    let number: serde_json::Number = serde_json::from_slice(value).with_context(|| {
        format!(
            "not a JSON number: {:?}",
            String::from_utf8_lossy(&value[..value.len().min(40)])
        )
    })?;
    if let Some(n) = number.as_i64() {
        return Ok(n);
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
        _ => bail!("not an integer that fits 64 bits: {number}"),
    }
}

/// The last value of every key of `records` (read partition by partition in offset order; a
/// key lives in one partition), each decoded by `decode`; a tombstone removes its key.
///
/// # Errors
/// A record without a key, a key that is not UTF-8, or a value `decode` refuses (the record is
/// named).
pub fn last_values(records: &[Record], decode: impl Fn(&[u8]) -> Result<i64>) -> Result<Finals> {
    let mut finals = Finals::new();
    for r in records {
        let at = || {
            format!(
                "the record at partition {} offset {}",
                r.partition, r.offset
            )
        };
        let key = r
            .key
            .as_deref()
            .with_context(|| format!("{} has no key", at()))?;
        let key = std::str::from_utf8(key)
            .with_context(|| format!("{}: its key is not UTF-8", at()))?
            .to_string();
        match &r.value {
            Some(v) => {
                finals.insert(key, decode(v).with_context(at)?);
            }
            None => {
                finals.remove(&key);
            }
        }
    }
    Ok(finals)
}

/// The word counts `lines` (the values of the input topic) give: each line lowercased and
/// split on whitespace.
///
/// # Errors
/// A record without a value or with a value that is not UTF-8.
pub fn expected_word_counts(lines: &[Record]) -> Result<Finals> {
    let mut counts = Finals::new();
    for r in lines {
        let value = r.value.as_deref().with_context(|| {
            format!(
                "the line at partition {} offset {} is null",
                r.partition, r.offset
            )
        })?;
        let line = std::str::from_utf8(value).with_context(|| {
            format!(
                "the line at partition {} offset {} is not UTF-8",
                r.partition, r.offset
            )
        })?;
        for word in line.split_whitespace() {
            *counts.entry(word.to_lowercase()).or_default() += 1;
        }
    }
    Ok(counts)
}

/// The shop's expected answer, computed from its input topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedRevenue {
    /// Per customer: the amounts of every paid order (each payment whose key is an order).
    pub revenue: Finals,
    /// Orders read.
    pub orders: u64,
    /// Payments read.
    pub payments: u64,
    /// Payments whose key is no order: an inner join drops them, so they count nowhere.
    pub orphans: u64,
    /// Payments whose record timestamp is before their order's: a join that goes by event
    /// time sees them before the order.
    pub early: u64,
    /// The amounts of those early payments, in cents.
    pub early_cents: i64,
}

/// The revenue per customer that `orders` and `payments` (the records of the two input
/// topics) give: each payment's amount goes to the customer of the order its key names (the
/// order's last value).
///
/// # Errors
/// A record without a key or value, or one that does not decode.
pub fn expected_revenue(orders: &[Record], payments: &[Record]) -> Result<ExpectedRevenue> {
    fn decoded<T: serde::de::DeserializeOwned>(r: &Record, what: &str) -> Result<(String, T)> {
        let at = || {
            format!(
                "the {what} at partition {} offset {}",
                r.partition, r.offset
            )
        };
        let key = r
            .key
            .as_deref()
            .with_context(|| format!("{} has no key", at()))?;
        let key = String::from_utf8(key.to_vec()).with_context(|| format!("{}'s key", at()))?;
        let value = r
            .value
            .as_deref()
            .with_context(|| format!("{} is null", at()))?;
        let value = serde_json::from_slice(value).with_context(|| format!("decoding {}", at()))?;
        Ok((key, value))
    }
    let mut by_id: HashMap<String, (Order, Option<i64>)> = HashMap::new();
    for r in orders {
        let (id, order) = decoded::<Order>(r, "order")?;
        by_id.insert(id, (order, r.timestamp));
    }
    let mut expected = ExpectedRevenue {
        revenue: Finals::new(),
        orders: orders.len() as u64,
        payments: payments.len() as u64,
        orphans: 0,
        early: 0,
        early_cents: 0,
    };
    for r in payments {
        let (id, payment) = decoded::<Payment>(r, "payment")?;
        let Some((order, ordered_at)) = by_id.get(&id) else {
            expected.orphans += 1;
            continue;
        };
        *expected.revenue.entry(order.customer.clone()).or_default() += payment.amount_cents;
        if let (Some(paid), Some(ordered)) = (r.timestamp, ordered_at)
            && paid < *ordered
        {
            expected.early += 1;
            expected.early_cents += payment.amount_cents;
        }
    }
    Ok(expected)
}

/// Two sets of final values compared key by key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Comparison {
    /// Keys in either side.
    pub keys: usize,
    /// Keys with the same value on both sides.
    pub equal: usize,
    /// Keys only the left side has.
    pub only_left: Vec<String>,
    /// Keys only the right side has.
    pub only_right: Vec<String>,
    /// Keys with two different values: `(key, left, right)`.
    pub differing: Vec<(String, i64, i64)>,
}

impl Comparison {
    /// Whether both sides have the same keys with the same values.
    pub fn agrees(&self) -> bool {
        self.only_left.is_empty() && self.only_right.is_empty() && self.differing.is_empty()
    }

    /// Whether the right side only falls short of the left: no key of its own, and every
    /// differing value below the left's.
    pub fn right_only_falls_short(&self) -> bool {
        self.only_right.is_empty() && self.differing.iter().all(|(_, l, r)| r < l)
    }

    /// A summary: the counts, then up to [`LISTED`] keys of each kind of difference, with
    /// `left` and `right` naming the sides.
    pub fn summary(&self, left: &str, right: &str) -> String {
        let mut s = format!(
            "{} keys compared: {} equal, {} only in {left}, {} only in {right}, {} differing",
            self.keys,
            self.equal,
            self.only_left.len(),
            self.only_right.len(),
            self.differing.len()
        );
        let list = |keys: &[String]| {
            let mut l = keys[..keys.len().min(LISTED)].join(", ");
            if keys.len() > LISTED {
                l += &format!(", … ({} more)", keys.len() - LISTED);
            }
            l
        };
        if !self.only_left.is_empty() {
            s += &format!("\n      only in {left}: {}", list(&self.only_left));
        }
        if !self.only_right.is_empty() {
            s += &format!("\n      only in {right}: {}", list(&self.only_right));
        }
        for (key, l, r) in self.differing.iter().take(LISTED) {
            s += &format!("\n      {key}: {left} {l}, {right} {r} ({:+})", r - l);
        }
        if self.differing.len() > LISTED {
            s += &format!(
                "\n      … {} more differing keys",
                self.differing.len() - LISTED
            );
        }
        s
    }
}

/// Compares `left` and `right` key by key.
pub fn compare(left: &Finals, right: &Finals) -> Comparison {
    let mut c = Comparison::default();
    for (key, l) in left {
        match right.get(key) {
            Some(r) if r == l => c.equal += 1,
            Some(r) => c.differing.push((key.clone(), *l, *r)),
            None => c.only_left.push(key.clone()),
        }
    }
    c.only_right = right
        .keys()
        .filter(|k| !left.contains_key(*k))
        .cloned()
        .collect();
    c.keys = left.len() + c.only_right.len();
    c
}

/// What one pipeline's outputs came to, against the answer expected from the inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Kafka Streams against the expected answer.
    pub kafka_streams: Comparison,
    /// Parsley against the expected answer.
    pub parsley: Comparison,
    /// Kafka Streams against Parsley.
    pub between: Comparison,
}

impl Outcome {
    /// Compares the sides' final values with `expected` and with each other.
    pub fn new(expected: &Finals, kafka_streams: &Finals, parsley: &Finals) -> Self {
        Outcome {
            kafka_streams: compare(expected, kafka_streams),
            parsley: compare(expected, parsley),
            between: compare(kafka_streams, parsley),
        }
    }

    /// Whether both sides agree with the expected answer (and so with each other).
    pub fn all_right(&self) -> bool {
        self.kafka_streams.agrees() && self.parsley.agrees()
    }
}

/// The answers side by side: one row per key for the first `rows` keys (in key order) of the
/// expected answer and both sides (`-` where a side has no value), then a row of totals and a
/// row counting the keys each side has right, e.g.
///
/// ```text
///   customer-00    expected  Kafka Streams  Parsley
///   …
///   total         3617391         0        3617391
///   right         50 of 50    0 of 50     50 of 50
/// ```
pub fn side_by_side(
    key_name: &str,
    expected: &Finals,
    kafka_streams: &Finals,
    parsley: &Finals,
    rows: usize,
) -> String {
    let keys: std::collections::BTreeSet<&String> = expected
        .keys()
        .chain(kafka_streams.keys())
        .chain(parsley.keys())
        .collect();
    let cell = |f: &Finals, k: &str| f.get(k).map_or_else(|| "-".to_string(), i64::to_string);
    let width = keys
        .iter()
        .map(|k| k.len())
        .chain([key_name.len(), "total".len()])
        .max()
        .unwrap_or(0);
    let mut out = format!(
        "  {key_name:<width$}  {:>14}  {:>14}  {:>14}\n",
        "expected", "Kafka Streams", "Parsley"
    );
    for k in keys.iter().take(rows) {
        out += &format!(
            "  {k:<width$}  {:>14}  {:>14}  {:>14}\n",
            cell(expected, k),
            cell(kafka_streams, k),
            cell(parsley, k)
        );
    }
    if keys.len() > rows {
        out += &format!("  … {} more\n", keys.len() - rows);
    }
    let total = |f: &Finals| f.values().sum::<i64>().to_string();
    out += &format!(
        "  {:<width$}  {:>14}  {:>14}  {:>14}\n",
        "total",
        total(expected),
        total(kafka_streams),
        total(parsley)
    );
    let right = |f: &Finals| {
        let n = expected
            .iter()
            .filter(|(k, v)| f.get(*k) == Some(v))
            .count();
        format!("{n} of {}", expected.len())
    };
    out += &format!(
        "  {:<width$}  {:>14}  {:>14}  {:>14}",
        "right",
        right(expected),
        right(kafka_streams),
        right(parsley)
    );
    out
}

/// The verdict on one pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Both sides match the expected answer.
    Agree,
    /// A difference the setup makes expected (a clock skew before a stream–table join): Kafka
    /// Streams misses what the expected answer has, Parsley does not.
    ExpectedDifference,
    /// A difference that should not be there.
    Fail,
}

/// The verdict on `outcome`. With `difference_expected` (the shop under a clock skew), a Kafka
/// Streams side that falls short of the expected answer (missed payments: lower totals, absent
/// customers) is what the setup predicts, and only a Parsley side that differs fails; otherwise
/// any difference fails.
pub fn verdict(outcome: &Outcome, difference_expected: bool) -> Verdict {
    if outcome.all_right() {
        return Verdict::Agree;
    }
    if difference_expected
        && outcome.parsley.agrees()
        && outcome.kafka_streams.right_only_falls_short()
    {
        Verdict::ExpectedDifference
    } else {
        Verdict::Fail
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_answers_are_printed_side_by_side_with_totals_and_keys_right() {
        let f = |pairs: &[(&str, i64)]| -> Finals {
            pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let expected = f(&[("c1", 10), ("c2", 20), ("c3", 30)]);
        let ks = f(&[("c1", 10), ("c2", 5)]);
        let parsley = expected.clone();
        let table = side_by_side("customer", &expected, &ks, &parsley, 2);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            ["customer", "expected", "Kafka", "Streams", "Parsley"]
        );
        assert_eq!(lines[1], ["c1", "10", "10", "10"]);
        assert_eq!(lines[2], ["c2", "20", "5", "20"]);
        assert_eq!(lines[3], ["…", "1", "more"]);
        assert_eq!(lines[4], ["total", "60", "15", "60"]);
        assert_eq!(
            lines[5],
            ["right", "3", "of", "3", "1", "of", "3", "3", "of", "3"]
        );
        assert_eq!(lines.len(), 6);
    }

    use super::*;

    fn finals(pairs: &[(&str, i64)]) -> Finals {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn record(offset: i64, key: Option<&str>, value: Option<&[u8]>, ts: i64) -> Record {
        Record {
            partition: 0,
            offset,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(<[u8]>::to_vec),
            timestamp: Some(ts),
            headers: Vec::new(),
        }
    }

    #[test]
    fn equal_sides_agree() {
        let a = finals(&[("the", 3), ("of", 1)]);
        let c = compare(&a, &a.clone());
        assert_eq!((c.keys, c.equal), (2, 2));
        assert!(c.agrees());
        assert_eq!(
            c.summary("expected", "Kafka Streams"),
            "2 keys compared: 2 equal, 0 only in expected, 0 only in Kafka Streams, 0 differing"
        );
    }

    #[test]
    fn missing_extra_and_differing_keys_are_each_reported() {
        let left = finals(&[("a", 1), ("b", 2), ("c", 3)]);
        let right = finals(&[("b", 2), ("c", 4), ("d", 5)]);
        let c = compare(&left, &right);
        assert_eq!(c.keys, 4);
        assert_eq!(c.equal, 1);
        assert_eq!(c.only_left, ["a"]);
        assert_eq!(c.only_right, ["d"]);
        assert_eq!(c.differing, [("c".to_string(), 3, 4)]);
        assert!(!c.agrees());
        let s = c.summary("L", "R");
        assert!(s.starts_with("4 keys compared: 1 equal, 1 only in L, 1 only in R, 1 differing"));
        assert!(
            s.contains("only in L: a") && s.contains("only in R: d"),
            "{s}"
        );
        assert!(s.contains("c: L 3, R 4 (+1)"), "{s}");
    }

    #[test]
    fn a_summary_lists_at_most_ten_keys_of_each_kind() {
        let left: Finals = (0..25).map(|i| (format!("k{i:02}"), i)).collect();
        let right: Finals = (0..25).map(|i| (format!("k{i:02}"), i + 1)).collect();
        let s = compare(&left, &right).summary("L", "R");
        assert_eq!(s.lines().count(), 1 + LISTED + 1, "{s}");
        assert!(s.ends_with("… 15 more differing keys"), "{s}");
        let only: Finals = (0..12).map(|i| (format!("x{i:02}"), i)).collect();
        let s = compare(&only, &Finals::new()).summary("L", "R");
        assert!(s.contains("x09, … (2 more)") && !s.contains("x10"), "{s}");
    }

    #[test]
    fn both_sides_values_decode() {
        assert_eq!(decode_ks_long(&42i64.to_be_bytes()).unwrap(), 42);
        assert_eq!(decode_ks_long(&(-7i64).to_be_bytes()).unwrap(), -7);
        assert_eq!(
            decode_ks_long(&[0, 0, 0, 0, 0, 0, 1, 0]).unwrap(),
            256,
            "big-endian"
        );
        assert!(decode_ks_long(&[0, 1]).is_err());
        assert!(decode_ks_long(b"42").is_err());
        assert_eq!(decode_json_number(b"42").unwrap(), 42);
        assert_eq!(decode_json_number(b" -3 ").unwrap(), -3);
        assert_eq!(decode_json_number(b"1250.0").unwrap(), 1250);
        assert!(decode_json_number(b"1.5").is_err());
        assert!(decode_json_number(b"\"42\"").is_err());
        assert!(decode_json_number(&42i64.to_be_bytes()).is_err());
    }

    #[test]
    fn the_last_value_of_a_key_wins_and_a_tombstone_removes_it() {
        let json = |n: i64| n.to_string().into_bytes();
        let records = [
            record(0, Some("the"), Some(&json(1)), 1),
            record(1, Some("of"), Some(&json(1)), 1),
            record(2, Some("the"), Some(&json(2)), 1),
            record(3, Some("gone"), Some(&json(9)), 1),
            record(4, Some("gone"), None, 1),
        ];
        let f = last_values(&records, decode_json_number).unwrap();
        assert_eq!(f, finals(&[("the", 2), ("of", 1)]));
        let ks = [record(0, Some("w"), Some(&5i64.to_be_bytes()), 1)];
        assert_eq!(
            last_values(&ks, decode_ks_long).unwrap(),
            finals(&[("w", 5)])
        );
        let e = last_values(&[record(7, None, Some(b"1"), 1)], decode_json_number).unwrap_err();
        assert!(e.to_string().contains("offset 7 has no key"), "{e}");
        let e =
            last_values(&[record(8, Some("k"), Some(b"x"), 1)], decode_json_number).unwrap_err();
        assert!(format!("{e:#}").contains("offset 8"), "{e:#}");
    }

    #[test]
    fn word_counts_are_expected_from_the_lines() {
        let lines = [
            record(0, None, Some(b"the cat and the hat"), 1),
            record(1, None, Some(b"  The  end "), 1),
        ];
        assert_eq!(
            expected_word_counts(&lines).unwrap(),
            finals(&[("the", 3), ("cat", 1), ("and", 1), ("hat", 1), ("end", 1)])
        );
        assert!(expected_word_counts(&[record(0, None, None, 1)]).is_err());
    }

    #[test]
    fn revenue_is_expected_from_every_paid_order() {
        let order = |c: &str, a: i64| format!(r#"{{"customer":"{c}","amount_cents":{a}}}"#);
        let payment = |o: &str, a: i64| format!(r#"{{"order":"{o}","amount_cents":{a}}}"#);
        let orders = [
            record(0, Some("o-1"), Some(order("c-1", 100).as_bytes()), 1_000),
            record(1, Some("o-2"), Some(order("c-2", 250).as_bytes()), 1_000),
            record(2, Some("o-3"), Some(order("c-1", 40).as_bytes()), 1_000),
            record(3, Some("o-4"), Some(order("c-3", 999).as_bytes()), 1_000),
        ];
        let payments = [
            // Paid on time.
            record(0, Some("o-1"), Some(payment("o-1", 100).as_bytes()), 2_000),
            // Paid with a timestamp before the order's.
            record(1, Some("o-2"), Some(payment("o-2", 250).as_bytes()), 500),
            record(2, Some("o-3"), Some(payment("o-3", 40).as_bytes()), 1_000),
            // A payment of no order; o-4 is unpaid.
            record(3, Some("o-9"), Some(payment("o-9", 7).as_bytes()), 2_000),
        ];
        let e = expected_revenue(&orders, &payments).unwrap();
        assert_eq!(e.revenue, finals(&[("c-1", 140), ("c-2", 250)]));
        assert_eq!((e.orders, e.payments, e.orphans), (4, 4, 1));
        assert_eq!((e.early, e.early_cents), (1, 250));
        let bad = [record(0, Some("o-1"), Some(b"{}"), 1)];
        assert!(expected_revenue(&bad, &[]).is_err());
    }

    #[test]
    fn verdicts() {
        let expected = finals(&[("c-1", 140), ("c-2", 250)]);
        let short = finals(&[("c-1", 140)]);
        let o = Outcome::new(&expected, &expected, &expected);
        assert_eq!(verdict(&o, false), Verdict::Agree);
        assert!(o.between.agrees());
        // Kafka Streams short, Parsley right: expected only under a skew.
        let o = Outcome::new(&expected, &short, &expected);
        assert_eq!(verdict(&o, false), Verdict::Fail);
        assert_eq!(verdict(&o, true), Verdict::ExpectedDifference);
        assert_eq!(o.between.only_right, ["c-2"]);
        // Kafka Streams above the expected answer: not what a skew explains.
        let more = finals(&[("c-1", 140), ("c-2", 251)]);
        assert_eq!(
            verdict(&Outcome::new(&expected, &more, &expected), true),
            Verdict::Fail
        );
        let extra = finals(&[("c-1", 140), ("c-2", 250), ("c-9", 1)]);
        assert_eq!(
            verdict(&Outcome::new(&expected, &extra, &expected), true),
            Verdict::Fail
        );
        // Parsley wrong: a failure even where Kafka Streams is expected to differ.
        let o = Outcome::new(&expected, &short, &short);
        assert_eq!(verdict(&o, true), Verdict::Fail);
        let o = Outcome::new(&expected, &expected, &short);
        assert_eq!(verdict(&o, true), Verdict::Fail);
    }
}
