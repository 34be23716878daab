//! With the default `jemalloc` feature on Linux, jemalloc serves both the Rust allocations of a
//! service and the C library's `malloc` (librdkafka's allocations).

#![cfg(all(feature = "jemalloc", target_os = "linux"))]

use std::ffi::c_void;

// Linking the crate installs its global allocator.
use parsley as _;

unsafe extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
}

/// The size class jemalloc gives the allocation at `ptr` (it must own it).
fn jemalloc_size(ptr: *const c_void) -> usize {
    // SAFETY: `ptr` is a live allocation; the caller's claim that jemalloc made it is what the
    // test checks: `sallocx` on a pointer it does not own would not return its size class.
    unsafe { tikv_jemalloc_sys::sallocx(ptr, 0) }
}

#[test]
fn jemalloc_serves_rust_and_c_allocations() {
    // jemalloc's size classes above 4 KiB step by a quarter of the power of two: a request of
    // 5,000 bytes gets 5,120.
    let rust = vec![0u8; 5_000];
    assert_eq!(jemalloc_size(rust.as_ptr().cast()), 5_120);
    // SAFETY: a plain malloc/free pair.
    unsafe {
        let c = malloc(5_000);
        assert!(!c.is_null());
        assert_eq!(jemalloc_size(c), 5_120);
        free(c);
    }
}
