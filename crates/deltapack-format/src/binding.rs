//! The ledger binding: which capacity ledger accounts for a store.
//!
//! A store's objects may only be deleted (and reused by a publication) by
//! handles whose ledger is the one that accounts for the store: two ledgers
//! that each believe they own the same bucket condemn and collect objects the
//! other one's roots still reference. The binding is how the store itself
//! says which ledger that is. It is one small JSON document at
//! [`BINDING_KEY`], created with create-if-absent by the first ledger that
//! writes to the store and replaced (conditionally on the bytes it replaces)
//! only by an explicit adoption, which raises its `generation`.
//!
//! JSON rather than CBOR: an operator reads it with `cat` or `aws s3 cp - -`
//! to learn which database owns a bucket. The layout is
//! `schemas/ledger-binding.cddl`:
//!
//! ```text
//! {"format": "deltapack-ledger-binding/1",
//!  "generation": 1,                       ; ≥ 1, raised by every adoption
//!  "ledger_id": "<32 lowercase hex>",     ; the ledger's own random id
//!  "engine": "sqlite" | "postgres",
//!  "description": "…",                    ; for people: where the ledger is
//!  "bound_at_ms": 1764748800000,          ; Unix ms, informational
//!  "previous": null | "<32 hex>"}         ; the ledger it replaced
//! ```
//!
//! Decoding is strict (unknown fields, a wrong format string, a malformed id
//! or an over-long document are errors), and the document is bounded by
//! [`MAX_BINDING_BYTES`] before it is parsed.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The key of the binding object, under the store's prefix.
pub const BINDING_KEY: &str = "ledger/binding.json";

/// The `format` string of the one binding version so far.
pub const BINDING_FORMAT: &str = "deltapack-ledger-binding/1";

/// Largest binding document accepted (checked before parsing).
pub const MAX_BINDING_BYTES: usize = 4096;

/// Longest `description` accepted.
const MAX_DESCRIPTION: usize = 1024;

/// A ledger's identity: 16 random bytes, chosen when the ledger database is
/// created and kept in it for its whole life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerId(pub [u8; 16]);

impl LedgerId {
    /// Lowercase hex (32 characters).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Display for LedgerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl std::str::FromStr for LedgerId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error::Invalid(format!(
                "ledger id {:?} is not 32 lowercase hex digits",
                s.chars().take(40).collect::<String>()
            )));
        }
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).map_err(|e| Error::Invalid(format!("ledger id: {e}")))?;
        Ok(LedgerId(out))
    }
}

/// Which ledger accounts for a store (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerBinding {
    /// Raised by every adoption; a ledger acts for the store only while the
    /// binding names it at the generation it recorded when it was bound.
    pub generation: u64,
    /// The ledger's id.
    pub ledger_id: LedgerId,
    /// `sqlite` or `postgres`.
    pub engine: String,
    /// Where the ledger is, for people (`postgres://db.internal/deltapack`,
    /// `sqlite on host X: /path`). Never contains a password.
    pub description: String,
    /// When the binding was written (Unix ms; informational only).
    pub bound_at_ms: u64,
    /// The ledger this binding replaced (adoption), if any.
    pub previous: Option<LedgerId>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    format: String,
    generation: u64,
    ledger_id: String,
    engine: String,
    description: String,
    bound_at_ms: u64,
    previous: Option<String>,
}

impl LedgerBinding {
    /// The document's bytes (one line of JSON, newline-terminated).
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.check()?;
        let wire = Wire {
            format: BINDING_FORMAT.into(),
            generation: self.generation,
            ledger_id: self.ledger_id.hex(),
            engine: self.engine.clone(),
            description: self.description.clone(),
            bound_at_ms: self.bound_at_ms,
            previous: self.previous.map(|p| p.hex()),
        };
        let mut out = serde_json::to_vec(&wire)
            .map_err(|e| Error::Invalid(format!("ledger binding: {e}")))?;
        out.push(b'\n');
        if out.len() > MAX_BINDING_BYTES {
            return Err(Error::Bounds(format!(
                "ledger binding is {} bytes, limit {MAX_BINDING_BYTES}",
                out.len()
            )));
        }
        Ok(out)
    }

    /// Parses a stored binding. Bytes from storage: bounded before parsing,
    /// every field checked.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_BINDING_BYTES {
            return Err(Error::Bounds(format!(
                "ledger binding is {} bytes, limit {MAX_BINDING_BYTES}",
                bytes.len()
            )));
        }
        let wire: Wire = serde_json::from_slice(bytes)
            .map_err(|e| Error::Invalid(format!("malformed ledger binding: {e}")))?;
        if wire.format != BINDING_FORMAT {
            return Err(Error::Invalid(format!(
                "ledger binding format {:?} is not {BINDING_FORMAT:?} (written by a newer deltapack?)",
                wire.format.chars().take(80).collect::<String>()
            )));
        }
        let b = LedgerBinding {
            generation: wire.generation,
            ledger_id: wire.ledger_id.parse()?,
            engine: wire.engine,
            description: wire.description,
            bound_at_ms: wire.bound_at_ms,
            previous: wire.previous.map(|p| p.parse()).transpose()?,
        };
        b.check()?;
        Ok(b)
    }

    fn check(&self) -> Result<()> {
        if self.generation == 0 {
            return Err(Error::Invalid("ledger binding generation 0".into()));
        }
        if !matches!(self.engine.as_str(), "sqlite" | "postgres") {
            return Err(Error::Invalid(format!(
                "ledger binding engine {:?} is not sqlite or postgres",
                self.engine.chars().take(40).collect::<String>()
            )));
        }
        if self.description.len() > MAX_DESCRIPTION {
            return Err(Error::Bounds(format!(
                "ledger binding description is {} bytes, limit {MAX_DESCRIPTION}",
                self.description.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LedgerBinding {
        LedgerBinding {
            generation: 3,
            ledger_id: LedgerId([7; 16]),
            engine: "postgres".into(),
            description: "postgres://deltapack@db.internal/prod".into(),
            bound_at_ms: 1_764_748_800_000,
            previous: Some(LedgerId([1; 16])),
        }
    }

    #[test]
    fn round_trips() {
        let b = sample();
        let bytes = b.encode().expect("encode");
        assert_eq!(LedgerBinding::decode(&bytes).expect("decode"), b);
        let none = LedgerBinding {
            previous: None,
            ..sample()
        };
        assert_eq!(
            LedgerBinding::decode(&none.encode().expect("encode")).expect("decode"),
            none
        );
    }

    #[test]
    fn refuses_what_it_does_not_write() {
        let good = String::from_utf8(sample().encode().expect("encode")).expect("utf8");
        let cases = [
            good.replace("ledger-binding/1", "ledger-binding/2"),
            good.replace("\"generation\":3", "\"generation\":0"),
            good.replace("\"postgres\"", "\"mysql\""),
            good.replace(&"07".repeat(16), &"07".repeat(15)),
            good.replace(&"07".repeat(16), &"0G".repeat(16)),
            good.replace(&"07".repeat(16), &"0A".repeat(16)),
            good.replace('}', ",\"extra\":1}"),
            good.replace(
                ",\"previous\":\"01010101010101010101010101010101\"",
                ",\"previous\":7",
            ),
            "[]".into(),
            "".into(),
            String::from_utf8_lossy(&[0xff; 10]).into_owned(),
        ];
        for c in cases {
            assert!(LedgerBinding::decode(c.as_bytes()).is_err(), "accepted {c}");
        }
        let huge = format!("{:width$}", good, width = MAX_BINDING_BYTES + 1);
        assert!(matches!(
            LedgerBinding::decode(huge.as_bytes()),
            Err(Error::Bounds(_))
        ));
    }
}
