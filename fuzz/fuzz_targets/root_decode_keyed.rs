//! Root decoder with a MAC key: `root::decode(data, Some(key))` on the raw
//! input (nearly always refused at the MAC), and on the input re-sealed with
//! the key — which must then decode exactly as it does without a key.
#![no_main]

use deltapack_format::root;
use deltapack_fuzz::{check_decoded, envelope, fix_up, fuzz_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = fuzz_key();
    if let Ok(d) = root::decode(data, Some(&key)) {
        check_decoded(&d, Some(&key));
    }
    for sealed in [fix_up(data, Some(&key)), Some(envelope(data, Some(&key)))]
        .into_iter()
        .flatten()
    {
        let keyed = root::decode(&sealed, Some(&key));
        let plain = root::decode(&sealed, None);
        match (&keyed, &plain) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "a valid MAC must not change what decodes");
                check_decoded(a, Some(&key));
            }
            (Err(_), Err(_)) => {}
            _ => panic!("keyed {keyed:?} vs unkeyed {plain:?} disagree on a correctly sealed root"),
        }
        // Any other key must be refused as unauthenticated.
        let other = root::mac_key(b"another key");
        assert!(
            matches!(
                root::decode(&sealed, Some(&other)),
                Err(deltapack_format::Error::Unauthenticated(_))
                    | Err(deltapack_format::Error::Root(_))
                    | Err(deltapack_format::Error::Bounds(_))
                    | Ok(deltapack_format::DecodedRoot::Incompatible { .. })
            ),
            "a root sealed with one key was accepted under another"
        );
    }
});
