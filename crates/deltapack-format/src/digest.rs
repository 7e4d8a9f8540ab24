//! Algorithm-tagged digests and typed 32-byte identifiers.
//!
//! A [`Digest`] is 32 bytes plus the algorithm that produced them. Its text
//! form is `blake3:<64 lowercase hex>` or `sha256:<64 lowercase hex>`; parsing
//! accepts nothing else (no uppercase, no whitespace, no other lengths), so a
//! digest string can be used as a map key or a path component without
//! normalisation. In CBOR and JSON a digest is that text string.
//!
//! [`Namespace`] and [`ContextDigest`] are untagged 32-byte identifiers whose
//! text form is exactly 64 lowercase hex characters; they appear in object
//! keys, so parsing them is also the first line of defence against path-like
//! input (`../`, `/`, NUL, uppercase): anything but 64 lowercase hex digits
//! is refused before it can reach storage.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// The hash algorithm behind a [`Digest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// BLAKE3 (256-bit output). Used everywhere in v2.
    Blake3,
    /// SHA-256. Used by legacy v1 chunk objects.
    Sha256,
    /// The layered snapshot digest (see the `layer_digest` module): not a
    /// hash of one byte string but of a snapshot's header and its (group,
    /// layer) streams. Only snapshot digests use it.
    Blake3Layers,
}

impl Algorithm {
    /// The text tag (`blake3` or `sha256`).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Blake3 => "blake3",
            Algorithm::Sha256 => "sha256",
            Algorithm::Blake3Layers => "blake3-layers",
        }
    }
}

/// An algorithm-tagged 32-byte digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    alg: Algorithm,
    bytes: [u8; 32],
}

impl Digest {
    /// A digest from its parts.
    pub const fn new(alg: Algorithm, bytes: [u8; 32]) -> Self {
        Digest { alg, bytes }
    }

    /// BLAKE3 of `data`.
    pub fn blake3(data: &[u8]) -> Self {
        Digest::new(Algorithm::Blake3, *blake3::hash(data).as_bytes())
    }

    /// SHA-256 of `data`.
    pub fn sha256(data: &[u8]) -> Self {
        use sha2::Digest as _;
        Digest::new(Algorithm::Sha256, sha2::Sha256::digest(data).into())
    }

    /// Digest of `data` with this digest's algorithm. A layered snapshot
    /// digest is not a function of one byte string: for it this returns the
    /// plain BLAKE3 of `data`, which never equals it (different algorithm),
    /// so [`Digest::verify`] of bytes against a layered digest always fails;
    /// snapshots are checked with `layer_digest::digest_like`.
    pub fn compute_like(&self, data: &[u8]) -> Self {
        match self.alg {
            Algorithm::Blake3 | Algorithm::Blake3Layers => Digest::blake3(data),
            Algorithm::Sha256 => Digest::sha256(data),
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The 64 lowercase hex characters, without the algorithm tag.
    pub fn hex(&self) -> String {
        hex::encode(self.bytes)
    }

    /// Checks that `data` hashes to this digest.
    pub fn verify(&self, what: &str, data: &[u8]) -> Result<()> {
        let found = self.compute_like(data);
        if found == *self {
            Ok(())
        } else {
            Err(Error::mismatch(what, self, found))
        }
    }
}

impl From<blake3::Hash> for Digest {
    fn from(h: blake3::Hash) -> Self {
        Digest::new(Algorithm::Blake3, *h.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.alg.as_str(), hex::encode(self.bytes))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn truncated(s: &str) -> String {
    s.chars().take(80).collect()
}

/// Parses exactly 64 lowercase hex characters.
pub(crate) fn parse_hex32(s: &str) -> std::result::Result<[u8; 32], &'static str> {
    if s.len() != 64 {
        return Err("expected exactly 64 hex characters");
    }
    // One pass, one table lookup per character: a chain's roots hold
    // thousands of these (every ancestor's ids and digest), so this is on
    // the restore path. An invalid character maps to 0xff, whose high bits
    // survive the OR.
    let b = s.as_bytes();
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (i, o) in out.iter_mut().enumerate() {
        let hi = HEX_NIBBLE[usize::from(b[2 * i])];
        let lo = HEX_NIBBLE[usize::from(b[2 * i + 1])];
        bad |= hi | lo;
        *o = (hi << 4) | (lo & 0x0f);
    }
    if bad & 0xf0 != 0 {
        return Err("expected lowercase hex digits only");
    }
    Ok(out)
}

/// The value of every lowercase hex digit; 0xff for every other byte.
static HEX_NIBBLE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let err = |reason| Error::DigestText {
            text: truncated(s),
            reason,
        };
        let (tag, hex) = s
            .split_once(':')
            .ok_or_else(|| err("missing algorithm tag"))?;
        let alg = match tag {
            "blake3" => Algorithm::Blake3,
            "sha256" => Algorithm::Sha256,
            "blake3-layers" => Algorithm::Blake3Layers,
            _ => {
                return Err(err(
                    "unknown algorithm (expected blake3, sha256 or blake3-layers)",
                ))
            }
        };
        Ok(Digest::new(alg, parse_hex32(hex).map_err(err)?))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Deserializes a text form through `FromStr` without allocating: a
/// chain's roots carry many digests (every ancestor's), and serde's
/// `Cow<str>` would copy each into a `String` first.
struct TextVisitor<T>(std::marker::PhantomData<T>, &'static str);

impl<T> serde::de::Visitor<'_> for TextVisitor<T>
where
    T: FromStr<Err = Error>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

fn deserialize_text<'de, D, T>(d: D, what: &'static str) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = Error>,
{
    d.deserialize_str(TextVisitor(std::marker::PhantomData, what))
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        deserialize_text(d, "a digest \"<algorithm>:<64 hex digits>\"")
    }
}

macro_rules! hex_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The 64 lowercase hex characters.
            pub fn hex(&self) -> String {
                hex::encode(self.0)
            }

            /// The raw bytes.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, "({})"), hex::encode(self.0))
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                parse_hex32(s)
                    .map($name)
                    .map_err(|reason| Error::DigestText { text: truncated(s), reason })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                deserialize_text(d, concat!($what, " (64 hex digits)"))
            }
        }
    };
}

hex_id!(
    /// The namespace of a [`crate::CacheIdentity`]: BLAKE3 (derive-key mode)
    /// of its canonical encoding. All state published under one identity
    /// lives under one namespace.
    Namespace,
    "Namespace"
);

hex_id!(
    /// Identifies a token prefix of a given length under a namespace (see
    /// the `context` module).
    ContextDigest,
    "ContextDigest"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_and_rejections() {
        let d = Digest::blake3(b"abc");
        let t = d.to_string();
        assert!(t.starts_with("blake3:"));
        assert_eq!(t.parse::<Digest>().ok(), Some(d));
        let s = Digest::sha256(b"abc");
        assert_eq!(
            s.to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        for bad in [
            "",
            "blake3",
            "blake3:",
            "md5:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015adx",
            " sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn hex_ids_refuse_path_like_text() {
        let ok = "00".repeat(32);
        assert!(ok.parse::<ContextDigest>().is_ok());
        for bad in [
            "../etc/passwd",
            "/",
            "ab/cd",
            "\0",
            &"AB".repeat(32),
            &"0".repeat(63),
            &"0".repeat(65),
        ] {
            assert!(bad.parse::<ContextDigest>().is_err(), "{bad:?}");
            assert!(bad.parse::<Namespace>().is_err(), "{bad:?}");
        }
    }

    /// The one-pass table decoder accepts exactly the lowercase hex digits
    /// at every position and decodes like the `hex` crate.
    #[test]
    fn hex_decoding_accepts_exactly_lowercase_hex() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            let mut raw = [0u8; 32];
            for b in raw.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let text = hex::encode(raw);
            assert_eq!(parse_hex32(&text), Ok(raw));
        }
        let base = "0123456789abcdef".repeat(4);
        for pos in [0usize, 1, 31, 62, 63] {
            for c in 0u8..128 {
                let mut t = base.clone().into_bytes();
                t[pos] = c;
                let t = String::from_utf8(t).expect("ascii");
                let ok = c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
                assert_eq!(parse_hex32(&t).is_ok(), ok, "{:?} at {pos}", c as char);
                if ok {
                    let mut want = [0u8; 32];
                    hex::decode_to_slice(&t, &mut want).expect("hex");
                    assert_eq!(parse_hex32(&t), Ok(want));
                }
            }
        }
        // 64 bytes of non-ASCII text.
        assert!(parse_hex32(&"é".repeat(32)).is_err());
    }

    #[test]
    fn non_text_is_refused_by_serde() {
        let n = serde_cbor::to_vec(&7u32).expect("cbor");
        assert!(serde_cbor::from_slice::<Digest>(&n).is_err());
        assert!(serde_cbor::from_slice::<ContextDigest>(&n).is_err());
        let b = serde_cbor::to_vec(&serde_bytes::Bytes::new(&[0u8; 32])).expect("cbor");
        assert!(serde_cbor::from_slice::<Namespace>(&b).is_err());
    }

    #[test]
    fn serde_is_text() {
        let d = Digest::blake3(b"x");
        let j = serde_json::to_string(&d).expect("json");
        assert_eq!(j, format!("\"{d}\""));
        let back: Digest = serde_json::from_str(&j).expect("parse");
        assert_eq!(back, d);
        let c = serde_cbor::to_vec(&d).expect("cbor");
        let back: Digest = serde_cbor::from_slice(&c).expect("cbor parse");
        assert_eq!(back, d);
    }
}
