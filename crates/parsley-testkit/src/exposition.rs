//! A strict reader of the Prometheus text exposition format (version 0.0.4), for tests that
//! scrape the runtime's metrics endpoint: every line must be a `# HELP`, a `# TYPE`, another
//! comment, blank, or a sample `name[{label="value",…}] value`, and every sample's name must
//! have been typed before it (the runtime writes counters, gauges and nothing else, so a
//! sample's name is its family's).
//!
//! ```
//! use parsley_testkit::exposition::Exposition;
//! let text = "# HELP parsley_x_total X.\n# TYPE parsley_x_total counter\nparsley_x_total{stage=\"a\\\"b\"} 3\n";
//! let scraped = Exposition::parse(text).unwrap();
//! assert_eq!(scraped.kind("parsley_x_total"), Some("counter"));
//! assert_eq!(scraped.value("parsley_x_total", &[("stage", "a\"b")]), Some(3.0));
//! ```

use std::collections::BTreeMap;

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels, unescaped.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// `# HELP` text by name.
    pub help: BTreeMap<String, String>,
    /// `# TYPE` by name (`counter`, `gauge`, …), in the order given.
    pub types: Vec<(String, String)>,
    /// Every sample, in the order given.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Parses `text`.
    ///
    /// # Errors
    /// The first line that is not in the format, by number, and a sample whose name was not
    /// typed before it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Exposition::default();
        for (n, line) in text.lines().enumerate() {
            let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
            if line.trim().is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').ok_or_else(|| bad("no help text"))?;
                out.help.insert(name.to_string(), help.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or_else(|| bad("no type"))?;
                if out.types.iter().any(|(n, _)| n == name) {
                    return Err(bad("typed twice"));
                }
                out.types.push((name.to_string(), kind.to_string()));
            } else if line.starts_with('#') {
                continue;
            } else {
                let sample = sample(line).map_err(|why| bad(&why))?;
                if out.kind(&sample.name).is_none() {
                    return Err(bad("a sample of an untyped name"));
                }
                out.samples.push(sample);
            }
        }
        Ok(out)
    }

    /// The type of `name`, when typed.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.types
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, k)| k.as_str())
    }

    /// The samples of `name` that carry every label of `labels` (and maybe others).
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the one sample of `name` that carries every label of `labels`; `None` when
    /// there is none.
    ///
    /// # Panics
    /// When several samples match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found = self.samples(name, labels);
        assert!(
            found.len() <= 1,
            "{} samples of {name} with {labels:?}: {found:?}",
            found.len()
        );
        found.first().map(|s| s.value)
    }
}

/// One sample line.
fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    let valid_name = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    });
    if name.is_empty() || !valid_name {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        loop {
            // A label name, `=`, a quoted value, then `,` or `}`.
            let start = chars.peek().map(|(i, _)| *i).ok_or("unclosed labels")?;
            if after[start..].starts_with('}') {
                rest = &after[start + 1..];
                break;
            }
            let eq = after[start..].find('=').ok_or("a label without a value")? + start;
            let key = &after[start..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("invalid label name {key:?}"));
            }
            while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {key}: the value is not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next().ok_or("an unterminated label value")? {
                    (_, '"') => break,
                    (_, '\\') => match chars.next().ok_or("a dangling escape")?.1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        c => return Err(format!("an unknown escape \\{c}")),
                    },
                    (_, c) => value.push(c),
                }
            }
            if labels.insert(key.to_string(), value).is_some() {
                return Err(format!("label {key} twice"));
            }
            match chars.next().ok_or("unclosed labels")? {
                (_, ',') => {}
                (i, '}') => {
                    rest = &after[i + 1..];
                    break;
                }
                (_, c) => return Err(format!("{c:?} after a label value")),
            }
        }
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|e| format!("timestamp {ts:?}: {e}"))?;
    }
    if fields.next().is_some() {
        return Err("more than a value and a timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels_are_read_with_their_escapes() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n\
                    # TYPE b gauge\nb{x=\"1\",y=\"q\\\"\\\\\\n,}\"} -2.5\nb{x=\"2\"} 7 1700000000000\n";
        let e = Exposition::parse(text).unwrap();
        assert_eq!(e.help["a_total"], "A.");
        assert_eq!(e.value("a_total", &[]), Some(1.0));
        assert_eq!(e.value("b", &[("y", "q\"\\\n,}")]), Some(-2.5));
        assert_eq!(e.value("b", &[("x", "2")]), Some(7.0));
        assert_eq!(e.samples("b", &[]).len(), 2);
    }

    #[test]
    fn what_is_not_in_the_format_is_refused() {
        for bad in [
            "untyped 1\n",
            "# TYPE a gauge\na{x=1} 1\n",
            "# TYPE a gauge\na{x=\"1\" 1\n",
            "# TYPE a gauge\na one\n",
            "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n",
            "# TYPE a gauge\n# TYPE a counter\n",
            "# TYPE a gauge\n1a 1\n",
        ] {
            assert!(Exposition::parse(bad).is_err(), "{bad:?}");
        }
    }
}
