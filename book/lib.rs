//! The book's chapters and the README, compiled as doctests so every Rust example in them
//! builds and runs with `cargo test --doc` (the way timely-dataflow checks its mdBook).
#![doc(test(attr(deny(warnings))))]
#![forbid(unsafe_code)]

macro_rules! chapter {
    ($name:ident, $file:literal) => {
        #[cfg(doctest)]
        #[doc = include_str!($file)]
        pub struct $name;
    };
}

chapter!(Readme, "../README.md");
chapter!(Introduction, "src/introduction.md");
chapter!(Tutorial, "src/tutorial.md");
chapter!(Guarantee, "src/guarantee.md");
chapter!(Clock, "src/clock.md");
chapter!(Gate, "src/gate.md");
chapter!(Stage, "src/stage.md");
chapter!(Dsl, "src/dsl.md");
chapter!(Testing, "src/testing.md");
chapter!(Runtime, "src/runtime.md");
chapter!(Queries, "src/queries.md");
chapter!(Recovery, "src/recovery.md");
chapter!(Ordering, "src/ordering.md");
chapter!(Operations, "src/operations.md");
chapter!(Testkit, "src/testkit.md");
chapter!(Verification, "src/verification.md");
chapter!(Benchmarks, "src/benchmarks.md");
chapter!(Demo, "src/demo.md");
chapter!(Interop, "src/interop.md");
chapter!(Specification, "src/specification.md");
chapter!(Comparison, "src/comparison.md");
chapter!(Decisions, "src/decisions.md");
chapter!(Lessons, "src/lessons.md");
