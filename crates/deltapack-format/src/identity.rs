//! [`CacheIdentity`] and the frozen namespace derivation.
//!
//! Cached prefix state is only valid for a reader running the same model
//! checkpoint, quantization, rope layout, parallel decomposition and rank,
//! admission geometry and publication schema. All of that is a
//! `CacheIdentity`; its canonical encoding is hashed (BLAKE3 derive-key mode
//! with the context string [`NAMESPACE_CONTEXT`]) into the [`Namespace`] that
//! every root and context digest lives under.
//!
//! **The derivation is frozen forever.** The canonical encoding is a CBOR
//! array in a fixed field order (see `docs/design.md`): changing a field's
//! position, type or default would silently re-key every store in existence.
//! A unit test pins the namespace of a fixture identity.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::{Digest, Namespace};
use crate::error::{Error, Result};

/// Default admission geometry: snapshots are published at multiples of this
/// many tokens.
pub const DEFAULT_CHUNK_TOKENS: u32 = 256;

/// BLAKE3 derive-key context for namespaces (frozen).
pub const NAMESPACE_CONTEXT: &str = "deltapack 2026-11-30 cache identity namespace v1";

/// The only publication schema this version writes.
pub const PUBLICATION_SCHEMA: &str = "page-tail-cow-v1";

/// Largest accepted identity JSON document (bytes).
pub const MAX_IDENTITY_JSON: usize = 1 << 20;

fn default_chunk_tokens() -> u32 {
    DEFAULT_CHUNK_TOKENS
}

fn default_schema() -> String {
    PUBLICATION_SCHEMA.to_string()
}

fn one() -> u32 {
    1
}

/// Everything that makes cached state valid for a reader.
///
/// Loaded from JSON (unknown fields are an error). See the module docs for
/// how it becomes a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheIdentity {
    /// Digest of the model checkpoint.
    pub model_checkpoint: Digest,
    /// Digest of a draft (speculative decoding) checkpoint, if any.
    #[serde(default)]
    pub draft_checkpoint: Option<Digest>,
    /// Quantization layout, e.g. `bf16` or `fp8-e4m3-per-tensor`.
    pub quantization: String,
    /// Rope layout, e.g. `rope-theta-1e6-yarn-4`.
    pub rope_layout: String,
    /// Tensor-parallel degree (≥ 1).
    #[serde(default = "one")]
    pub tp_degree: u32,
    /// Tensor-parallel rank of this reader (< `tp_degree`).
    #[serde(default)]
    pub tp_rank: u32,
    /// Decode-context-parallel degree (≥ 1).
    #[serde(default = "one")]
    pub dcp_degree: u32,
    /// Decode-context-parallel rank (< `dcp_degree`).
    #[serde(default)]
    pub dcp_rank: u32,
    /// Admission geometry: snapshots are published at multiples of this many
    /// tokens (default 256).
    #[serde(default = "default_chunk_tokens")]
    pub chunk_tokens: u32,
    /// Publication schema (`page-tail-cow-v1`).
    #[serde(default = "default_schema")]
    pub publication_schema: String,
    /// Free-form salt (e.g. a deployment or tenant separator).
    #[serde(default)]
    pub salt: String,
    /// Free-form attributes; sorted by key in the canonical encoding.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

impl CacheIdentity {
    /// Parses and validates an identity from JSON. Unknown fields, bad digests
    /// and inconsistent values are errors.
    pub fn from_json(text: &[u8]) -> Result<Self> {
        if text.len() > MAX_IDENTITY_JSON {
            return Err(Error::Identity(format!(
                "identity JSON is {} bytes, limit {MAX_IDENTITY_JSON}",
                text.len()
            )));
        }
        let id: CacheIdentity =
            serde_json::from_slice(text).map_err(|e| Error::Identity(e.to_string()))?;
        id.validate()?;
        Ok(id)
    }

    /// Pretty JSON text of this identity.
    pub fn to_json_pretty(&self) -> String {
        // Serialising plain strings, integers and a BTreeMap cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// An example identity, used by `deltapack identity --example` and tests.
    pub fn example() -> Self {
        CacheIdentity {
            model_checkpoint: Digest::blake3(b"example-model-checkpoint"),
            draft_checkpoint: None,
            quantization: "bf16".into(),
            rope_layout: "rope-theta-1e6".into(),
            tp_degree: 1,
            tp_rank: 0,
            dcp_degree: 1,
            dcp_rank: 0,
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
            publication_schema: PUBLICATION_SCHEMA.into(),
            salt: String::new(),
            attributes: BTreeMap::new(),
        }
    }

    /// Checks value consistency.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Identity(m));
        if self.tp_degree == 0 || self.tp_rank >= self.tp_degree {
            return bad(format!(
                "tp_rank {} must be < tp_degree {} (≥ 1)",
                self.tp_rank, self.tp_degree
            ));
        }
        if self.dcp_degree == 0 || self.dcp_rank >= self.dcp_degree {
            return bad(format!(
                "dcp_rank {} must be < dcp_degree {} (≥ 1)",
                self.dcp_rank, self.dcp_degree
            ));
        }
        if self.chunk_tokens == 0 || self.chunk_tokens > (1 << 24) {
            return bad(format!(
                "chunk_tokens {} must be in 1..=16777216",
                self.chunk_tokens
            ));
        }
        if self.publication_schema != PUBLICATION_SCHEMA {
            return bad(format!(
                "unsupported publication schema {:?} (this version writes {PUBLICATION_SCHEMA:?})",
                self.publication_schema
            ));
        }
        Ok(())
    }

    /// The canonical encoding: a CBOR array in a frozen field order,
    /// `[1, model, draft|null, quantization, rope, tp_degree, tp_rank,
    /// dcp_degree, dcp_rank, chunk_tokens, schema, salt, {attributes}]`.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let tuple = (
            1u32,
            self.model_checkpoint.to_string(),
            self.draft_checkpoint.map(|d| d.to_string()),
            &self.quantization,
            &self.rope_layout,
            self.tp_degree,
            self.tp_rank,
            self.dcp_degree,
            self.dcp_rank,
            self.chunk_tokens,
            &self.publication_schema,
            &self.salt,
            &self.attributes,
        );
        // Serialising strings, integers and a BTreeMap into a Vec cannot fail.
        serde_cbor::to_vec(&tuple).unwrap_or_default()
    }

    /// The namespace: `blake3::derive_key(NAMESPACE_CONTEXT, canonical_bytes)`.
    pub fn namespace(&self) -> Namespace {
        Namespace(blake3::derive_key(
            NAMESPACE_CONTEXT,
            &self.canonical_bytes(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namespace of the example identity is frozen forever: if this test
    /// fails, every existing store would be re-keyed. Do not "fix" the hex.
    #[test]
    fn pinned_namespace_of_example_identity() {
        let id = CacheIdentity::example();
        assert_eq!(id.namespace().hex(), PINNED_EXAMPLE_NAMESPACE);
    }

    const PINNED_EXAMPLE_NAMESPACE: &str =
        "074e0761624bbc9c41b957fb944d2c6765f98f83cdb89a4beadee184ba673dd9";

    #[test]
    fn unknown_json_fields_are_errors() {
        let mut v = serde_json::to_value(CacheIdentity::example()).expect("json");
        v["colour"] = serde_json::json!("blue");
        let err = CacheIdentity::from_json(v.to_string().as_bytes()).expect_err("must fail");
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn defaults_and_validation() {
        let j = format!(
            r#"{{"model_checkpoint":"{}","quantization":"bf16","rope_layout":"r"}}"#,
            Digest::blake3(b"m")
        );
        let id = CacheIdentity::from_json(j.as_bytes()).expect("valid");
        assert_eq!(id.chunk_tokens, 256);
        assert_eq!(id.publication_schema, PUBLICATION_SCHEMA);
        let mut bad = id.clone();
        bad.tp_rank = 1;
        assert!(bad.validate().is_err());
        let mut bad = id.clone();
        bad.publication_schema = "page-tail-cow-v9".into();
        assert!(bad.validate().is_err());
        assert!(CacheIdentity::from_json(b"{not json").is_err());
    }

    #[test]
    fn every_field_changes_the_namespace() {
        let base = CacheIdentity::example();
        let ns = base.namespace();
        let mut variants = Vec::new();
        let mut v = base.clone();
        v.model_checkpoint = Digest::blake3(b"other");
        variants.push(v);
        let mut v = base.clone();
        v.draft_checkpoint = Some(Digest::blake3(b"draft"));
        variants.push(v);
        let mut v = base.clone();
        v.quantization = "fp8".into();
        variants.push(v);
        let mut v = base.clone();
        v.rope_layout = "x".into();
        variants.push(v);
        let mut v = base.clone();
        v.tp_degree = 2;
        variants.push(v);
        let mut v = base.clone();
        v.dcp_degree = 2;
        variants.push(v);
        let mut v = base.clone();
        v.chunk_tokens = 512;
        variants.push(v);
        let mut v = base.clone();
        v.salt = "s".into();
        variants.push(v);
        let mut v = base.clone();
        v.attributes.insert("k".into(), "v".into());
        variants.push(v);
        for v in variants {
            assert_ne!(v.namespace(), ns, "{v:?}");
        }
    }
}
