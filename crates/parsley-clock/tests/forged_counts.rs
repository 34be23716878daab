//! A forged stamp that announces a million topic groups, or a million entries in one group, is
//! a bounded typed error: the decoder trusts no count for allocation. A counting allocator
//! measures what the decode allocates, on the decoding thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use parsley_clock::codec::{decode, encode_version};
use parsley_clock::{Channel, Clock, DecodeErrorKind, Error, Stamp, TopicId};

/// The system allocator, counting the bytes each thread asks for.
struct Counting;

thread_local! {
    /// Bytes this thread has asked for (other tests of this binary, and the test harness,
    /// allocate on other threads at the same time).
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn allocated() -> usize {
    ALLOCATED.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // Not counted while the thread's storage is being torn down.
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// LEB128 of one million.
const MILLION: [u8; 3] = [0xC0, 0x84, 0x3D];

/// Decodes `bytes` and returns the error and the bytes this thread allocated meanwhile.
fn decode_counting(bytes: &[u8]) -> (Error, usize) {
    let before = allocated();
    let result = decode(bytes);
    let during = allocated() - before;
    (result.expect_err("a forged count is refused"), during)
}

/// `bytes` is refused as truncated, and decoding them allocates less than a page.
fn assert_truncated_without_allocating(bytes: &[u8]) {
    let (e, allocated) = decode_counting(bytes);
    assert!(
        matches!(
            e,
            Error::Decode {
                kind: DecodeErrorKind::Truncated,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(allocated < 4_096, "{allocated} bytes allocated");
}

#[test]
fn a_million_topic_groups_announced_is_a_truncation_with_no_allocation() {
    // Version 1 (version byte, flags byte) and version 2 (one head byte), no flags, then the
    // clock's topic-group count.
    for head in [&[1u8, 0][..], &[0x20]] {
        let mut bytes = head.to_vec();
        bytes.extend_from_slice(&MILLION);
        assert_truncated_without_allocating(&bytes);
    }
}

#[test]
fn a_million_entries_announced_in_one_group_is_a_truncation_bounded_by_the_input() {
    // A real one-entry stamp, its entry count patched to a million.
    let topic = TopicId::from_halves(0x0102_0304_0506_0708, 0x090a_0b0c_0d0e_0f10);
    let mut clock = Clock::new();
    clock.observe(Channel::new(topic, 3).at(42));
    for (version, head) in [(1u8, &[1u8, 0][..]), (2, &[0x20])] {
        let real = encode_version(&Stamp::new(None, clock.clone()), version);
        // The head, group count 1, 16 bytes of topic id, then the entry count.
        let count_at = head.len() + 1 + 16;
        assert_eq!(&real[..head.len() + 1], [head, &[1]].concat());
        let mut forged = real[..count_at].to_vec();
        forged.extend_from_slice(&MILLION);
        forged.extend_from_slice(&real[count_at + 1..]);
        forged.extend_from_slice(&[0; 16]);
        assert_truncated_without_allocating(&forged);
    }
}
