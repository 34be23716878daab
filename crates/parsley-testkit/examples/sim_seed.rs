//! Replays one simulator history and prints its outcome: `cargo run -p parsley-testkit --example sim_seed -- SEED`.
use parsley_testkit::sim::{self, SimConfig};
fn main() {
    let seed: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let out = sim::run(seed, &SimConfig::default());
    println!("{out:#?}");
    if let Some(s) = &out.stall {
        println!("{s}");
    }
    if let Some(v) = &out.violation {
        println!("{v}");
    }
}
