//! Root envelope + body decoder, unkeyed: `root::decode(data, None)` on the
//! raw input, on the input with its envelope length/hash fixed up (so body
//! mutations get past the BLAKE3 check), and on the input wrapped as a body.
#![no_main]

use deltapack_format::root;
use deltapack_fuzz::{check_decoded, envelope, fix_up};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = root::decode(data, None) {
        check_decoded(&d, None);
    }
    if let Some(fixed) = fix_up(data, None) {
        if let Ok(d) = root::decode(&fixed, None) {
            check_decoded(&d, None);
        }
    }
    if let Ok(d) = root::decode(&envelope(data, None), None) {
        check_decoded(&d, None);
    }
});
