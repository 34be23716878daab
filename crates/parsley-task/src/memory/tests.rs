use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;

use super::*;

#[test]
fn shares_charge_and_release_the_difference_and_a_dropped_share_releases_all() {
    let budget = MemoryBudget::new(1_000);
    let mut a = budget.share();
    let mut b = budget.share();
    a.set(Holder::State, 300);
    b.set(Holder::Held, 200);
    assert_eq!(budget.used(), 500);
    a.set(Holder::State, 100);
    assert_eq!(budget.snapshot().of(Holder::State), 100);
    b.set(Holder::Store, 900);
    assert!(budget.over(), "1,200 of 1,000");
    assert_eq!(budget.snapshot().peak, 1_200);
    drop(b);
    assert_eq!(budget.used(), 100);
    assert!(!budget.over() && budget.may_resume());
    let snap = budget.snapshot();
    assert_eq!((snap.bound, snap.total(), snap.peak), (1_000, 100, 1_200));
}

#[test]
fn a_squeeze_lasts_until_use_is_back_under_seven_eighths_of_the_bound() {
    let budget = MemoryBudget::new(800);
    let mut s = budget.share();
    s.set(Holder::State, 799);
    assert_eq!(at_bound(&budget, false), AtBound::Free);
    s.set(Holder::State, 800);
    assert_eq!(at_bound(&budget, false), AtBound::Squeeze);
    s.set(Holder::State, 701);
    assert_eq!(
        at_bound(&budget, true),
        AtBound::Squeeze,
        "not under 700 yet"
    );
    assert_eq!(at_bound(&budget, false), AtBound::Free, "never squeezed");
    s.set(Holder::State, 700);
    assert_eq!(at_bound(&budget, true), AtBound::Free);
}

#[test]
fn a_store_under_a_bound_takes_an_eighth_for_its_cache_and_a_sixty_fourth_per_memtable() {
    assert_eq!(
        StoreMemory::of(64 << 20),
        StoreMemory {
            cache: 8 << 20,
            memtable: 1 << 20,
            through_cache: true,
        }
    );
    assert_eq!(
        StoreMemory::of(u64::MAX),
        StoreMemory {
            through_cache: true,
            ..StoreMemory::DEFAULT
        }
    );
    assert_eq!(StoreMemory::of(1).cache, 1 << 20, "at least 1 MiB each");
}

/// One stage of the model: records to read, records held (spilled or not), fold state not
/// committed, and what it counted.
#[derive(Default)]
struct Model {
    input: Vec<(u8, u64)>,
    read: usize,
    held: VecDeque<(u8, u64, bool)>,
    uncommitted: u64,
    counts: BTreeMap<u8, u64>,
    at: Option<AtBound>,
}

/// A delivered record's fold-state cost in the model.
const ENTRY: u64 = 32;
/// Records read per batch.
const BATCH: usize = 4;
/// The largest record.
const MAX_RECORD: u64 = 64;

impl Model {
    fn account(&self, share: &mut MemoryShare) {
        let held: u64 = self.held.iter().filter(|h| !h.2).map(|h| h.1).sum();
        share.set(Holder::Held, held);
        share.set(Holder::State, self.uncommitted);
    }

    fn done(&self) -> bool {
        self.read == self.input.len() && self.held.is_empty()
    }

    /// One turn: account, decide, read (all of a batch when free; squeezed, only when a claim
    /// `needs` reading, spilling what is held), deliver up to `deliver` records, commit when
    /// `commit`.
    fn turn(&mut self, share: &mut MemoryShare, needs: bool, deliver: usize, commit: bool) {
        self.account(share);
        let at = at_bound(share.budget(), self.at == Some(AtBound::Squeeze));
        self.at = Some(at);
        let read = match at {
            AtBound::Free => true,
            AtBound::Squeeze => needs,
        };
        if read {
            let end = (self.read + BATCH).min(self.input.len());
            for &(k, size) in &self.input[self.read..end] {
                self.held.push_back((k, size, false));
            }
            self.read = end;
            if at == AtBound::Squeeze {
                for h in &mut self.held {
                    h.2 = true;
                }
            }
            self.account(share);
        }
        for _ in 0..deliver {
            let Some((k, _, _)) = self.held.pop_front() else {
                break;
            };
            // A spilled record is re-fetched to be delivered.
            *self.counts.entry(k).or_default() += 1;
            self.uncommitted += ENTRY;
        }
        if commit {
            self.uncommitted = 0;
        }
        self.account(share);
    }
}

fn counts(input: &[(u8, u64)]) -> BTreeMap<u8, u64> {
    let mut c = BTreeMap::new();
    for &(k, _) in input {
        *c.entry(k).or_default() += 1;
    }
    c
}

/// What use may pass the bound by in the model: a batch per stage, and the fold state the
/// deliveries of a commit interval (8 turns of at most 6) add per stage.
const SLACK: u64 = 2 * BATCH as u64 * MAX_RECORD + 2 * 8 * 6 * ENTRY;

proptest! {
    /// Two stages share a bound: use never passes it by more than what one batch per stage
    /// and one commit interval's deliveries bring, nothing is lost, every record is counted as an unbounded run counts it, and
    /// the run ends (no pause waits for itself).
    #[test]
    fn two_stages_under_one_bound_never_pass_it_by_more_than_a_batch_each_and_lose_nothing(
        inputs in prop::collection::vec(
            prop::collection::vec((0u8..16, 1u64..=MAX_RECORD), 0..200), 2..=2),
        bound in 200u64..2_000,
        turns in prop::collection::vec((any::<bool>(), 0usize..6, any::<bool>()), 1..64),
    ) {
        let budget = MemoryBudget::new(bound);
        let mut shares = [budget.share(), budget.share()];
        let mut stages: Vec<Model> = inputs
            .iter()
            .map(|i| Model { input: i.clone(), ..Model::default() })
            .collect();
        let mut t = 0usize;
        while !stages.iter().all(Model::done) {
            t += 1;
            prop_assert!(t < 100_000, "the run must end");
            for (s, (stage, share)) in stages.iter_mut().zip(&mut shares).enumerate() {
                let (needs, deliver, commit) = turns[(t + s) % turns.len()];
                // Every few turns something is delivered and committed: the commit interval.
                let deliver = if t.is_multiple_of(8) { deliver.max(1) } else { deliver };
                stage.turn(share, needs, deliver, commit || t.is_multiple_of(8));
            }
            prop_assert!(
                budget.used() <= bound + SLACK,
                "use {} over bound {} + {}", budget.used(), bound, SLACK
            );
        }
        prop_assert!(budget.snapshot().peak <= bound + SLACK);
        for (stage, input) in stages.iter().zip(&inputs) {
            prop_assert_eq!(&stage.counts, &counts(input));
        }
    }
}
