//! `CacheIdentity`: what makes cached state valid for a reader, its
//! namespace, and the contexts named under it (from token ids or hex).
//!
//! Owns the identity's Python face. It must never call the store: a
//! `Store` takes an identity, never the other way round.

use deltapack_format::{CacheIdentity as RustIdentity, ContextDigest, ContextHasher, Digest};
use pyo3::prelude::*;

use crate::buffer;
use crate::errors::{bad_input, format_err};

/// Everything that makes cached state valid for a reader (model checkpoint,
/// quantization, rope layout, parallel ranks, chunk size, salt, …). Its
/// canonical encoding hashes to the namespace every context lives under.
#[pyclass(frozen, module = "deltapack._native", name = "CacheIdentity")]
pub(crate) struct CacheIdentity {
    pub(crate) inner: RustIdentity,
}

#[pymethods]
impl CacheIdentity {
    #[new]
    #[pyo3(signature = (model_checkpoint, quantization, rope_layout, *, draft_checkpoint=None,
        tp_degree=1, tp_rank=0, dcp_degree=1, dcp_rank=0, chunk_tokens=256, salt=String::new(),
        attributes=None, publication_schema=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        model_checkpoint: &str,
        quantization: String,
        rope_layout: String,
        draft_checkpoint: Option<&str>,
        tp_degree: u32,
        tp_rank: u32,
        dcp_degree: u32,
        dcp_rank: u32,
        chunk_tokens: u32,
        salt: String,
        attributes: Option<std::collections::BTreeMap<String, String>>,
        publication_schema: Option<String>,
    ) -> PyResult<Self> {
        let digest = |s: &str, what: &str| {
            s.parse::<Digest>()
                .map_err(|e| bad_input(format!("{what}: {e}")))
        };
        let inner = RustIdentity {
            model_checkpoint: digest(model_checkpoint, "model_checkpoint")?,
            draft_checkpoint: draft_checkpoint
                .map(|d| digest(d, "draft_checkpoint"))
                .transpose()?,
            quantization,
            rope_layout,
            tp_degree,
            tp_rank,
            dcp_degree,
            dcp_rank,
            chunk_tokens,
            publication_schema: publication_schema
                .unwrap_or_else(|| deltapack_format::identity::PUBLICATION_SCHEMA.to_string()),
            salt,
            attributes: attributes.unwrap_or_default(),
        };
        inner.validate().map_err(format_err)?;
        Ok(CacheIdentity { inner })
    }

    /// Parses and validates an identity from JSON text (`str` or bytes).
    #[staticmethod]
    fn from_json(text: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes: Vec<u8> = match text.extract::<String>() {
            Ok(s) => s.into_bytes(),
            Err(_) => text
                .extract::<Vec<u8>>()
                .map_err(|_| bad_input("identity JSON must be str or bytes"))?,
        };
        Ok(CacheIdentity {
            inner: RustIdentity::from_json(&bytes).map_err(format_err)?,
        })
    }

    /// The example identity (`deltapack identity --example`).
    #[staticmethod]
    fn example() -> Self {
        CacheIdentity {
            inner: RustIdentity::example(),
        }
    }

    /// Pretty JSON text (what `from_json` reads).
    fn to_json(&self) -> String {
        self.inner.to_json_pretty()
    }

    /// The namespace (64 hex characters).
    #[getter]
    fn namespace(&self) -> String {
        self.inner.namespace().hex()
    }

    /// Admission geometry: snapshots are published at multiples of this.
    #[getter]
    fn chunk_tokens(&self) -> u32 {
        self.inner.chunk_tokens
    }

    /// The context digest (64 hex) of token ids.
    fn context(&self, tokens: &Bound<'_, PyAny>) -> PyResult<String> {
        let t = buffer::tokens(tokens)?;
        Ok(self.hasher()?.digest(&t).hex())
    }

    /// `(boundary, context hex)` at every full-chunk boundary of `tokens`.
    fn boundaries(&self, tokens: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, String)>> {
        let t = buffer::tokens(tokens)?;
        Ok(self
            .hasher()?
            .boundaries(&t)
            .into_iter()
            .map(|(b, c)| (b, c.hex()))
            .collect())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<CacheIdentity>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        u64::from_le_bytes(
            self.inner.namespace().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "CacheIdentity(model_checkpoint={:?}, quantization={:?}, rope_layout={:?}, tp={}/{}, \
             chunk_tokens={}, namespace={:?})",
            self.inner.model_checkpoint.to_string(),
            self.inner.quantization,
            self.inner.rope_layout,
            self.inner.tp_rank,
            self.inner.tp_degree,
            self.inner.chunk_tokens,
            self.inner.namespace().hex()
        )
    }
}

impl CacheIdentity {
    pub(crate) fn hasher(&self) -> PyResult<ContextHasher> {
        ContextHasher::new(self.inner.namespace(), self.inner.chunk_tokens).map_err(format_err)
    }

    /// The context named by `tokens`: 64 hex characters, or token ids
    /// (then also their count).
    pub(crate) fn context_of(
        &self,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<(ContextDigest, Option<u64>)> {
        if let Ok(hex) = tokens.extract::<String>() {
            let c = hex.parse::<ContextDigest>().map_err(|e| {
                bad_input(format!(
                    "a context given as text is 64 lowercase hex characters: {e}"
                ))
            })?;
            return Ok((c, None));
        }
        let t = buffer::tokens(tokens)?;
        Ok((self.hasher()?.digest(&t), Some(t.len() as u64)))
    }
}
