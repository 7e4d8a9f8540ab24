//! Page-delta apply. The first input byte selects a small synthetic base
//! (see `deltapack_fuzz::base`); the rest is the delta encoding.
//!
//! * `PageDelta::apply(base, delta)` must never panic, and what it returns
//!   must be the result its header names, reproducible by re-encoding.
//! * The plan is also built and run without the base-digest check (so a
//!   mutated header is planned and reconstructed even though its digest no
//!   longer matches): no panic, no out-of-range copy, and `finish` refuses
//!   any result whose digest is not the header's.
#![no_main]

use deltapack_format::delta::{self, PageDelta};
use deltapack_fuzz::{base, CHUNK_TOKENS, MAX_HARNESS_RESULT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, delta_bytes)) = data.split_first() else {
        return;
    };
    let base = base(sel);
    if let Ok(result) = PageDelta::apply(&base, delta_bytes) {
        let (h, _) = delta::decode_header(delta_bytes).expect("applied delta has a header");
        assert_eq!(result.digest(), h.result_digest);
        assert!(result.boundary() > base.boundary());
        let again = delta::encode(CHUNK_TOKENS, &base, &result);
        if h.chunk_tokens == CHUNK_TOKENS {
            let again = again.expect("re-encode");
            let back = PageDelta::apply(&base, &again).expect("re-apply");
            assert_eq!(back, result);
        }
    }
    if let Ok((h, tails)) = delta::decode_header(delta_bytes) {
        let want = h.result_digest;
        if let Ok(plan) = PageDelta::plan(h, tails, base.header()) {
            if plan.delta_len == delta_bytes.len() as u64 && plan.result_len <= MAX_HARNESS_RESULT {
                let mut out = vec![0u8; plan.result_len as usize];
                plan.reconstruct(base.payload(), &mut out, |src, dst| {
                    dst.copy_from_slice(&delta_bytes[src]);
                })
                .expect("a plan that fits reconstructs");
                if let Ok(s) = plan.finish(out) {
                    assert_eq!(s.digest(), want);
                }
            }
        }
    }
});
