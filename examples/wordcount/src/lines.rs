//! The line generator: seeded, Zipf-like word frequencies over a fixed vocabulary.
//!
//! The `r`-th word of [`VOCABULARY`] (0-based) is drawn with a weight proportional to
//! `1 / (r + 1)`, so a few words are very frequent and most are rare, as in text. A line has
//! 3 to 12 words (uniformly), separated by one space. The same seed gives the same lines.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The vocabulary: 200 distinct lowercase words, most frequent first.
pub const VOCABULARY: [&str; 200] = [
    "the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "with", "as",
    "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word",
    "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up",
    "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if",
    "will", "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her",
    "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go",
    "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water",
    "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "any", "new",
    "work", "part", "take", "get", "place", "made", "live", "where", "after", "back", "little",
    "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our", "under",
    "name", "very", "through", "just", "form", "sentence", "great", "think", "say", "help", "low",
    "line", "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old",
    "too", "same", "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small",
    "end", "put", "home", "read", "hand", "port", "large", "spell", "add", "even", "land", "here",
    "must", "big", "high", "such", "follow", "act", "why", "ask", "men", "change", "went", "light",
    "kind", "off", "need", "house", "picture", "try", "us", "again", "animal", "point", "mother",
    "world", "near", "build", "self", "earth", "father", "head", "stand", "own", "page",
];

/// The fewest words in a line.
pub const MIN_WORDS: usize = 3;
/// The most words in a line.
pub const MAX_WORDS: usize = 12;

/// A seeded source of lines.
#[derive(Debug, Clone)]
pub struct LineGenerator {
    rng: StdRng,
    /// Cumulative Zipf weights of the vocabulary, normalised to end at 1.
    cumulative: Vec<f64>,
}

impl LineGenerator {
    /// A generator whose lines depend on `seed` only.
    pub fn new(seed: u64) -> Self {
        let weights: Vec<f64> = (0..VOCABULARY.len())
            .map(|r| 1.0 / (r + 1) as f64)
            .collect();
        let total: f64 = weights.iter().sum();
        let cumulative = weights
            .iter()
            .scan(0.0, |sum, w| {
                *sum += w / total;
                Some(*sum)
            })
            .collect();
        LineGenerator {
            rng: StdRng::seed_from_u64(seed),
            cumulative,
        }
    }

    /// One word, drawn by its Zipf weight.
    pub fn word(&mut self) -> &'static str {
        let u: f64 = self.rng.random();
        let rank = self.cumulative.partition_point(|c| *c < u);
        VOCABULARY[rank.min(VOCABULARY.len() - 1)]
    }

    /// The next line: [`MIN_WORDS`] to [`MAX_WORDS`] words separated by single spaces.
    pub fn line(&mut self) -> String {
        let n = self.rng.random_range(MIN_WORDS..=MAX_WORDS);
        let words: Vec<&str> = (0..n).map(|_| self.word()).collect();
        words.join(" ")
    }
}

impl Iterator for LineGenerator {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        Some(self.line())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    #[test]
    fn the_vocabulary_is_200_distinct_lowercase_words() {
        let distinct: HashSet<&str> = VOCABULARY.iter().copied().collect();
        assert_eq!(distinct.len(), 200);
        assert!(
            VOCABULARY
                .iter()
                .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_lines_and_another_seed_other_lines() {
        let a: Vec<String> = LineGenerator::new(7).take(500).collect();
        let b: Vec<String> = LineGenerator::new(7).take(500).collect();
        let c: Vec<String> = LineGenerator::new(8).take(500).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn lines_have_3_to_12_vocabulary_words_separated_by_single_spaces() {
        let vocabulary: HashSet<&str> = VOCABULARY.iter().copied().collect();
        for line in LineGenerator::new(1).take(2_000) {
            let words: Vec<&str> = line.split(' ').collect();
            assert!((MIN_WORDS..=MAX_WORDS).contains(&words.len()), "{line}");
            assert!(words.iter().all(|w| vocabulary.contains(w)), "{line}");
            assert_eq!(line.split_whitespace().count(), words.len());
        }
    }

    #[test]
    fn frequencies_fall_with_rank_like_zipf() {
        let mut generator = LineGenerator::new(3);
        let mut counts: HashMap<&str, u64> = HashMap::new();
        for _ in 0..200_000 {
            *counts.entry(generator.word()).or_default() += 1;
        }
        let count = |r: usize| counts.get(VOCABULARY[r]).copied().unwrap_or(0) as f64;
        // Weight 1/(r+1): the first word about twice the second and ten times the tenth.
        assert!((1.7..2.3).contains(&(count(0) / count(1))), "{counts:?}");
        assert!((8.0..12.0).contains(&(count(0) / count(9))), "{counts:?}");
        assert!(
            counts.len() > 190,
            "almost every word occurs: {}",
            counts.len()
        );
    }
}
