//! Snapshot decoder: `Snapshot::from_encoded`. Anything it accepts must be
//! canonical: rebuilding it from its header and payload gives the same bytes.
#![no_main]

use deltapack_format::snapshot::{self, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = snapshot::decode_prefix(data);
    if let Ok(s) = Snapshot::from_encoded(data.to_vec()) {
        let again = Snapshot::from_parts(s.header().clone(), s.payload()).expect("re-encode");
        // The CBOR header may be written non-canonically in the input; the
        // decoded header and payload must still round-trip.
        let back = Snapshot::from_encoded(again.encoded().to_vec()).expect("decode again");
        assert_eq!(back.header(), s.header());
        assert_eq!(back.payload(), s.payload());
        for (gi, g) in s.layout().groups.iter().enumerate() {
            for li in 0..g.layers.len() {
                assert!(s.layer_range(gi, li).is_some());
            }
        }
    }
});
