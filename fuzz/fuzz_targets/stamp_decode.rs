//! The stamp decoder on arbitrary bytes: it never panics, and it accepts only the canonical
//! encoding of a valid stamp, so whatever it accepts encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parsley_clock::codec::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(stamp) = decode(data) {
        assert_eq!(
            encode(&stamp),
            data,
            "a stamp decoded from bytes that are not its canonical encoding: {stamp:?}"
        );
    }
});
