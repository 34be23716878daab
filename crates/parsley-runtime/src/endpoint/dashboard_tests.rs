//! The Grafana dashboard `ops/grafana/parsley.json` against what the exposition exports: every
//! PromQL expression of every panel names only families a scrape has, with their labels; a
//! counter only under `rate`, `irate` or `increase` (over a range), a gauge never there. The
//! families, kinds and labels come from the in-memory exposition (no listener, no broker, no
//! Prometheus). The runtime exports no histograms, so a `_bucket`, `_sum` or `_count` series
//! is an unknown family here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value as Json;

use super::{Kind, families};

/// The dashboard, as committed.
const DASHBOARD: &str = include_str!("../../../../ops/grafana/parsley.json");

/// Labels Prometheus adds to every series it scrapes.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Functions that take a counter's range vector.
const RATE_FUNCTIONS: [&str; 3] = ["rate", "irate", "increase"];

/// PromQL's aggregation operators and the functions a panel may call.
const CALLABLE: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "rate",
    "irate",
    "increase",
    "delta",
    "deriv",
    "time",
    "clamp_min",
    "clamp_max",
    "abs",
    "vector",
    "scalar",
    "histogram_quantile",
    "max_over_time",
    "min_over_time",
    "avg_over_time",
    "last_over_time",
    "changes",
    "resets",
    "label_values",
];

/// Aggregation operators: their clause (`by (…)`, `without (…)`) may come before their
/// parenthesis.
const AGGREGATIONS: [&str; 9] = [
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev",
];

/// Keywords followed by a list of label names in parentheses.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// What the runtime exports: each family's kind and the labels its series carry.
struct Exposed {
    kinds: BTreeMap<String, Kind>,
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Exposed {
    fn new() -> Exposed {
        let scraped = super::tests::scrape();
        let kinds: BTreeMap<String, Kind> = families()
            .iter()
            .map(|f| (f.exported_name(), f.kind))
            .collect();
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for sample in &scraped.samples {
            labels
                .entry(sample.name.clone())
                .or_default()
                .extend(sample.labels.keys().cloned());
        }
        for name in kinds.keys() {
            assert!(
                labels.contains_key(name),
                "the in-memory scrape has no series of {name}: its labels are not known"
            );
        }
        Exposed { kinds, labels }
    }

    /// Whether `label` may appear on a series of `family`.
    fn has_label(&self, family: &str, label: &str) -> bool {
        TARGET_LABELS.contains(&label) || self.labels.get(family).is_some_and(|l| l.contains(label))
    }
}

/// A PromQL token, as far as the check needs one.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str,
    Num,
    /// `[…]`: a range (or a subquery's range and step).
    Range,
    /// A Grafana variable: `$name`, `${name}`.
    Var,
    Punct(char),
    Op,
}

fn tokens(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            if i >= chars.len() {
                return Err(format!("unterminated string in {expr:?}"));
            }
            i += 1;
            out.push(Token::Str);
        } else if c == '[' {
            let end = chars[i..]
                .iter()
                .position(|&c| c == ']')
                .ok_or_else(|| format!("unterminated range in {expr:?}"))?;
            i += end + 1;
            out.push(Token::Range);
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            out.push(Token::Var);
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Num);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if "(){},".contains(c) {
            out.push(Token::Punct(c));
            i += 1;
        } else if "=!<>~".contains(c) {
            while i < chars.len() && "=!<>~".contains(chars[i]) {
                i += 1;
            }
            out.push(Token::Op);
        } else if "+-*/%^".contains(c) {
            i += 1;
            out.push(Token::Op);
        } else {
            return Err(format!("unexpected {c:?} in {expr:?}"));
        }
    }
    Ok(out)
}

/// What one expression references, and what is wrong with it.
#[derive(Debug, Default)]
struct Checked {
    families: BTreeSet<String>,
    /// Label names of its `by (…)`, `without (…)`, `on (…)` … lists.
    grouping: BTreeSet<String>,
    problems: Vec<String>,
}

/// Checks one PromQL expression against `exposed`.
fn check_expr(expr: &str, exposed: &Exposed) -> Checked {
    let mut checked = Checked::default();
    let tokens = match tokens(expr) {
        Ok(t) => t,
        Err(e) => {
            checked.problems.push(e);
            return checked;
        }
    };
    // The calls enclosing the current token (`None`: plain parentheses).
    let mut calls: Vec<Option<String>> = Vec::new();
    // A function or aggregation whose opening parenthesis is still to come.
    let mut call: Option<String> = None;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(name) if LABEL_LISTS.contains(&name.as_str()) => {
                i += 1;
                if tokens.get(i) == Some(&Token::Punct('(')) {
                    i += 1;
                    while let Some(t) = tokens.get(i) {
                        i += 1;
                        match t {
                            Token::Punct(')') => break,
                            Token::Ident(label) => {
                                checked.grouping.insert(label.clone());
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            Token::Ident(name)
                if tokens.get(i + 1) == Some(&Token::Punct('('))
                    || AGGREGATIONS.contains(&name.as_str()) =>
            {
                if !CALLABLE.contains(&name.as_str()) {
                    checked
                        .problems
                        .push(format!("{expr:?}: unknown function {name}"));
                }
                // Its parenthesis comes next, or after a `by (…)` / `without (…)` list.
                call = Some(name.clone());
            }
            Token::Ident(name) if ["bool", "and", "or", "unless"].contains(&name.as_str()) => {}
            Token::Ident(name) => {
                i = check_selector(expr, name, &tokens, i + 1, &calls, exposed, &mut checked);
                continue;
            }
            Token::Punct('(') => calls.push(call.take()),
            Token::Punct(')') => {
                calls.pop();
            }
            _ => {}
        }
        i += 1;
    }
    if checked.families.is_empty() {
        checked
            .problems
            .push(format!("{expr:?}: names no family the runtime exports"));
    }
    for label in &checked.grouping {
        if !checked.families.iter().any(|f| exposed.has_label(f, label)) {
            checked.problems.push(format!(
                "{expr:?}: groups by {label}, a label none of its families has"
            ));
        }
    }
    checked
}

/// Checks the selector of family `name` whose matchers (if any) start at `tokens[i]`; returns
/// the index after the selector and its range.
fn check_selector(
    expr: &str,
    name: &str,
    tokens: &[Token],
    mut i: usize,
    calls: &[Option<String>],
    exposed: &Exposed,
    checked: &mut Checked,
) -> usize {
    let kind = exposed.kinds.get(name).copied();
    if kind.is_some() {
        checked.families.insert(name.to_string());
    } else {
        checked.problems.push(format!(
            "{expr:?}: {name} is not a family the runtime exports"
        ));
    }
    if tokens.get(i) == Some(&Token::Punct('{')) {
        i += 1;
        while let Some(t) = tokens.get(i) {
            i += 1;
            match t {
                Token::Punct('}') => break,
                Token::Ident(label) if kind.is_some() && !exposed.has_label(name, label) => {
                    checked
                        .problems
                        .push(format!("{expr:?}: {name} has no label {label}"));
                }
                _ => {}
            }
        }
    }
    let ranged = tokens.get(i) == Some(&Token::Range);
    if ranged {
        i += 1;
    }
    let in_rate = matches!(calls.last(), Some(Some(f)) if RATE_FUNCTIONS.contains(&f.as_str()));
    match kind {
        None => {}
        Some(Kind::Counter) if !(ranged && in_rate) => checked.problems.push(format!(
            "{expr:?}: the counter {name} is used without rate, irate or increase over a range"
        )),
        Some(Kind::Gauge) if in_rate => checked.problems.push(format!(
            "{expr:?}: the gauge {name} is under a counter function"
        )),
        _ => {}
    }
    i
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("a panels array") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

fn dashboard() -> Json {
    serde_json::from_str(DASHBOARD).expect("ops/grafana/parsley.json is JSON")
}

const DATASOURCE: &str = "${DS_PROMETHEUS}";

#[test]
fn every_panel_queries_only_exported_families_and_labels_counters_under_rate() {
    let exposed = Exposed::new();
    let dashboard = dashboard();
    let mut problems = Vec::new();
    let mut queried = 0;
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if targets.is_empty() {
            problems.push(format!("panel {title:?} has no query"));
        }
        for target in targets {
            let Some(expr) = target["expr"].as_str() else {
                problems.push(format!("panel {title:?}: a target without expr"));
                continue;
            };
            queried += 1;
            let checked = check_expr(expr, &exposed);
            problems.extend(
                checked
                    .problems
                    .iter()
                    .map(|p| format!("panel {title:?}: {p}")),
            );
            // A legend names labels the series still have after the expression's grouping.
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            for placeholder in legend.split("{{").skip(1) {
                let label = placeholder.split("}}").next().unwrap_or_default().trim();
                let kept = checked.grouping.is_empty() || checked.grouping.contains(label);
                if !kept || !checked.families.iter().any(|f| exposed.has_label(f, label)) {
                    problems.push(format!(
                        "panel {title:?}: legend {legend:?} names {label}, which {expr:?} does not keep"
                    ));
                }
            }
        }
    }
    assert!(queried > 0, "the dashboard has no query");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_dashboard_imports_anywhere_and_every_panel_has_a_unit_and_a_place() {
    let dashboard = dashboard();
    let inputs = dashboard["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS"
            && i["type"] == "datasource"
            && i["pluginId"] == "prometheus"),
        "a DS_PROMETHEUS datasource input: {inputs:?}"
    );
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    assert!(dashboard["id"].is_null(), "an export has no id");
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "{title}: id"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && grid["h"].as_u64().unwrap() > 0,
            "{title}: {grid}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert!(titles.insert(title), "two panels are titled {title:?}");
        assert_eq!(panel["datasource"]["uid"], DATASOURCE, "{title}");
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(target["datasource"]["uid"], DATASOURCE, "{title}");
        }
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        assert!(unit.is_some_and(|u| !u.is_empty()), "{title}: no unit");
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}: no description"
        );
    }
}

#[test]
fn the_stage_variable_lists_an_exported_label() {
    let exposed = Exposed::new();
    let dashboard = dashboard();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        assert_eq!(variable["datasource"]["uid"], DATASOURCE);
        let query = variable["definition"].as_str().unwrap();
        let args = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{query}"));
        let (family, label) = args.split_once(',').unwrap();
        assert!(exposed.has_label(family.trim(), label.trim()), "{query}");
    }
}

/// The check itself: what it must refuse, and what it must take.
#[test]
fn the_check_refuses_unknown_families_labels_and_counters_without_rate() {
    let exposed = Exposed::new();
    let problems = |expr: &str| check_expr(expr, &exposed).problems;
    for good in [
        r#"sum by (stage) (rate(parsley_records_delivered_total{stage=~"$stage"}[$__rate_interval]))"#,
        r#"sum(increase(parsley_bad_records_total{stage=~"$stage"}[$__range]))"#,
        r#"time() - min by (stage) (parsley_task_watermark_timestamp_seconds{stage=~"$stage"})"#,
        "sum by (stage, topic) (parsley_kafka_consumer_lag_offsets)",
        "sum by (stage) (rate(parsley_commit_seconds_total[1m])) / sum by (stage) (rate(parsley_transactions_committed_total[1m]))",
        r#"parsley_kafka_request_rtt_seconds{quantile="0.99", instance=~".+"}"#,
    ] {
        assert_eq!(problems(good), Vec::<String>::new(), "{good}");
    }
    for (bad, why) in [
        ("rate(parsley_records_nope_total[1m])", "not a family"),
        (
            "histogram_quantile(0.99, sum by (le) (rate(parsley_commit_seconds_bucket[1m])))",
            "not a family",
        ),
        ("sum(parsley_records_delivered_total)", "without rate"),
        (
            "max_over_time(parsley_records_delivered_total[5m])",
            "without rate",
        ),
        ("rate(parsley_blocked_heads[1m])", "gauge"),
        (r#"parsley_blocked_heads{topic="stock"}"#, "no label topic"),
        ("sum by (kind) (parsley_blocked_heads)", "groups by kind"),
        (
            "rat(parsley_records_delivered_total[1m])",
            "unknown function",
        ),
        ("time()", "names no family"),
    ] {
        let found = problems(bad);
        assert!(
            found.iter().any(|p| p.contains(why)),
            "{bad}: expected a problem with {why:?}, got {found:?}"
        );
    }
}
