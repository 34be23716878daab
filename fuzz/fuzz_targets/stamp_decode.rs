//! The stamp decoder on arbitrary bytes: it never panics, and it accepts only the canonical
//! encoding of a valid stamp in the version the bytes name, so whatever it accepts encodes back
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parsley_clock::codec::{decode, encode_version};

fuzz_target!(|data: &[u8]| {
    if let Ok(stamp) = decode(data) {
        // Version 1 wrote a whole version byte; version 2 puts it in the high four bits.
        let version = if data[0] == 1 { 1 } else { data[0] >> 4 };
        assert_eq!(
            encode_version(&stamp, version),
            data,
            "a stamp decoded from bytes that are not its canonical encoding: {stamp:?}"
        );
    }
});
