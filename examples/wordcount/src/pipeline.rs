//! The word count in Parsley's DSL: each line lowercased and split on whitespace, regrouped by
//! word, counted; every update of a count goes to the output (UTF-8 key: the word; value: the
//! count as a JSON number).
//!
//! The same pipeline in Kafka Streams, as `cargo xtask compare` runs it
//! (`compare/kafka-streams/src/main/java/dev/parsley/compare/Pipelines.java`):
//!
//! ```java
//! static Topology wordCount(String input, String output) {
//!     StreamsBuilder builder = new StreamsBuilder();
//!     KStream<String, String> lines =
//!             builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
//!     lines.flatMapValues(line -> Arrays.stream(line.toLowerCase(Locale.ROOT).split("\\s+"))
//!                     .filter(word -> !word.isEmpty())
//!                     .toList())
//!             .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
//!             .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("word-counts")
//!                     .withKeySerde(Serdes.String())
//!                     .withValueSerde(Serdes.Long()))
//!             .toStream()
//!             .to(output, Produced.with(Serdes.String(), Serdes.Long()));
//!     return builder.build();
//! }
//! ```
//!
//! Lines of the pipeline definition: **Parsley 14, Kafka Streams 13** (1.08×). Counted on each
//! side: the non-blank, non-comment lines of the body of the function that builds the topology
//! (its signature and closing brace left out), as the project's formatters leave them
//! (`rustfmt` here; `Pipelines.java` as it is). The test `line_counts_are_the_documented_ones`
//! recounts both and checks that the Java above is the one in `Pipelines.java`.
//!
//! The differences: Parsley's `Auto` codec reads and writes a `String` as UTF-8 and other values
//! as JSON, so no serde is named (the counts go out as JSON numbers, Kafka Streams' as 8-byte
//! `Long`s); `count` keeps its table in the stage's state, so no store is materialized by name;
//! `named("words")` names the repartition topic, `{application}-words-repartition`, and the
//! count's state, as `Grouped.with("words", …)` names Kafka Streams' repartition topic.

use parsley::prelude::*;

/// The word count from `input` (keyless lines) to `output` (word → count), as the application
/// `application_id` (the prefix of its consumer groups, transactional ids and internal topics).
///
/// # Errors
/// An invalid topology (an empty or repeated topic name).
pub fn topology(
    application_id: &str,
    input: &str,
    output: &str,
) -> Result<Topology, parsley::stage::Error> {
    let builder = StreamsBuilder::new(application_id);
    builder
        .stream::<(), String>(input)
        .flat_map_values(|line| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, word| word.clone())
        .named("words")
        .count()
        .to_stream()
        .to(output);
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of the function in `source` whose signature starts with `signature` (after
    /// indentation), up to its closing brace: the line `end`.
    fn function<'a>(source: &'a str, signature: &str, end: &str) -> Vec<&'a str> {
        let mut lines: Vec<&str> = source
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(signature))
            .collect();
        let closing = lines.iter().position(|l| *l == end).expect(signature);
        lines.truncate(closing + 1);
        lines
    }

    /// How the line counts in the module docs are counted: the non-blank, non-comment lines of
    /// a function's body (after the line that ends its signature with `{`, before its closing
    /// brace).
    fn counted(function: &[&str]) -> usize {
        let opened = function.iter().position(|l| l.ends_with('{')).unwrap();
        function[opened + 1..function.len() - 1]
            .iter()
            .map(|l| l.trim())
            .filter(|t| {
                !t.is_empty() && !t.starts_with("//") && !t.starts_with("/*") && !t.starts_with('*')
            })
            .count()
    }

    #[test]
    fn line_counts_are_the_documented_ones() {
        let rust = include_str!("pipeline.rs");
        let java = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../compare/kafka-streams/src/main/java/dev/parsley/compare/Pipelines.java"
        ))
        .unwrap();
        let parsley = function(rust, "pub fn topology(", "}");
        let kafka_streams = function(&java, "static Topology wordCount(", "    }");
        // The Java in the module docs is the method in Pipelines.java, dedented.
        let documented: Vec<&str> = rust
            .lines()
            .skip_while(|l| *l != "//! ```java")
            .skip(1)
            .take_while(|l| *l != "//! ```")
            .map(|l| l.strip_prefix("//! ").unwrap_or(""))
            .collect();
        let in_file: Vec<&str> = kafka_streams
            .iter()
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect();
        assert_eq!(documented, in_file);
        let (p, k) = (counted(&parsley), counted(&kafka_streams));
        let stated = format!(
            "**Parsley {p}, Kafka Streams {k}** ({:.2}×)",
            p as f64 / k as f64
        );
        assert!(rust.contains(&stated), "the docs should say {stated}");
        assert!(p * 10 <= k * 13, "{p} lines against {k}: above 1.3×");
    }

    #[test]
    fn the_pipeline_repartitions_by_word_into_a_named_topic() {
        let t = topology("wc", "lines", "counts").unwrap();
        assert_eq!(t.stages().len(), 2, "{}", t.describe());
        assert_eq!(t.internal_topics()[0].name, "wc-words-repartition");
    }

    #[test]
    fn counts_words_in_memory_across_partitions_and_a_restart() {
        use parsley::TopologyTestDriver;

        let t = topology("wc", "lines", "counts").unwrap();
        let driver = TopologyTestDriver::builder(t)
            .partitions("lines", 3)
            .build()
            .unwrap();
        let lines = driver.input_topic("lines", Auto, Utf8).unwrap();
        for (p, line) in ["The cat", "the HAT", "a cat"].into_iter().enumerate() {
            let record = parsley::driver::RawInput::new(None, Some(line.as_bytes()));
            driver
                .pipe_raw("lines", record.partition(p as i32))
                .unwrap();
        }
        driver.restart().unwrap();
        lines.pipe((), "cat".into()).unwrap();
        let counts = driver
            .output_topic("counts", Utf8, Json)
            .unwrap()
            .read_key_values_to_map();
        let expected = [("a", 1i64), ("cat", 3), ("hat", 1), ("the", 2)];
        assert_eq!(
            counts,
            expected
                .map(|(w, n)| (w.to_string(), n))
                .into_iter()
                .collect()
        );
    }
}
