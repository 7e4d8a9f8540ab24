//! Identity JSON: `CacheIdentity::from_json`. An accepted identity must
//! round-trip through its own JSON with the same namespace.
#![no_main]

use deltapack_format::CacheIdentity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = CacheIdentity::from_json(data) {
        let text = id.to_json_pretty();
        let back = CacheIdentity::from_json(text.as_bytes()).expect("own JSON parses");
        assert_eq!(back, id);
        assert_eq!(back.namespace(), id.namespace());
        assert_eq!(back.canonical_bytes(), id.canonical_bytes());
    }
});
