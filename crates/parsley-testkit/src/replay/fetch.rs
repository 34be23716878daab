//! Randomized fetch sizes for a replay's consumers: how much librdkafka asks the broker for at
//! once decides how a stage's inputs interleave when history is read, so a pipeline whose
//! output depends on that interleaving gives another output under other sizes.

use rand::Rng;

/// The consumer properties a replay's stages fetch with (librdkafka's names; librdkafka has
/// no `max.poll.records`: `queued.min.messages`, the records it keeps prefetched per
/// partition, is the nearest to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchSizes {
    /// `max.partition.fetch.bytes`: bytes per partition and fetch (librdkafka returns a larger
    /// first record batch whole).
    pub max_partition_fetch_bytes: u32,
    /// `fetch.max.bytes`: bytes per fetch response. librdkafka requires it to be at least the
    /// client's `message.max.bytes`, which is therefore set to the same value when it is below
    /// librdkafka's default (1,000,000).
    pub fetch_max_bytes: u32,
    /// `fetch.min.bytes`: the broker waits for this many bytes…
    pub fetch_min_bytes: u32,
    /// …or `fetch.wait.max.ms`, ms.
    pub fetch_wait_max_ms: u32,
    /// `queued.min.messages`: records per partition librdkafka tries to keep prefetched.
    pub queued_min_messages: u32,
}

impl FetchSizes {
    /// Sizes drawn from `rng`, each log-uniform over its range: `max.partition.fetch.bytes`
    /// 256 B–1 MiB, `fetch.max.bytes` 4 KiB–50 MiB, `fetch.min.bytes` 1 B–64 KiB,
    /// `queued.min.messages` 1–100,000; `fetch.wait.max.ms` uniform 1–200 ms.
    pub fn random(rng: &mut impl Rng) -> Self {
        FetchSizes {
            max_partition_fetch_bytes: log_uniform(rng, 256, 1 << 20),
            fetch_max_bytes: log_uniform(rng, 4 << 10, 50 << 20),
            fetch_min_bytes: log_uniform(rng, 1, 64 << 10),
            fetch_wait_max_ms: rng.random_range(1..=200),
            queued_min_messages: log_uniform(rng, 1, 100_000),
        }
    }

    /// The consumer properties, in the order they are set.
    pub fn properties(&self) -> Vec<(&'static str, String)> {
        let mut p = vec![
            (
                "max.partition.fetch.bytes",
                self.max_partition_fetch_bytes.to_string(),
            ),
            ("fetch.max.bytes", self.fetch_max_bytes.to_string()),
            ("fetch.min.bytes", self.fetch_min_bytes.to_string()),
            ("fetch.wait.max.ms", self.fetch_wait_max_ms.to_string()),
            ("queued.min.messages", self.queued_min_messages.to_string()),
        ];
        if self.fetch_max_bytes < 1_000_000 {
            p.push(("message.max.bytes", self.fetch_max_bytes.to_string()));
        }
        p
    }
}

impl std::fmt::Display for FetchSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max.partition.fetch.bytes={} fetch.max.bytes={} fetch.min.bytes={} fetch.wait.max.ms={} queued.min.messages={}",
            self.max_partition_fetch_bytes,
            self.fetch_max_bytes,
            self.fetch_min_bytes,
            self.fetch_wait_max_ms,
            self.queued_min_messages
        )
    }
}

/// A value in `low..=high` whose logarithm is uniform.
fn log_uniform(rng: &mut impl Rng, low: u32, high: u32) -> u32 {
    let (l, h) = (f64::from(low).ln(), f64::from(high).ln());
    let v = rng.random_range(l..=h).exp().round();
    (v as u32).clamp(low, high)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn sizes_are_seeded_in_range_and_keep_librdkafkas_rule() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..200)
                .map(|_| FetchSizes::random(&mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let sizes = draw(7);
        for s in &sizes {
            assert!(
                (256..=1 << 20).contains(&s.max_partition_fetch_bytes),
                "{s}"
            );
            assert!((4 << 10..=50 << 20).contains(&s.fetch_max_bytes), "{s}");
            assert!((1..=64 << 10).contains(&s.fetch_min_bytes), "{s}");
            assert!((1..=200).contains(&s.fetch_wait_max_ms), "{s}");
            assert!((1..=100_000).contains(&s.queued_min_messages), "{s}");
            let p = s.properties();
            let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
            // `fetch.max.bytes` >= `message.max.bytes` (librdkafka refuses the rest).
            let max = get("message.max.bytes").map_or(1_000_000, |v| v.parse().unwrap());
            assert!(s.fetch_max_bytes >= max, "{s}");
        }
        // Log-uniform: small and large sizes both come up.
        assert!(sizes.iter().any(|s| s.max_partition_fetch_bytes < 4 << 10));
        assert!(
            sizes
                .iter()
                .any(|s| s.max_partition_fetch_bytes > 256 << 10)
        );
    }
}
