//! Context digests: identifiers of token prefixes under a namespace.
//!
//! The digest of the first `n` tokens is a hash chain over `chunk_tokens`-sized
//! chunks of token ids (u32, little endian):
//!
//! ```text
//! state_0     = BLAKE3-keyed(namespace, "deltapack context v1")
//! state_{i+1} = BLAKE3-keyed(namespace, state_i || u64le(tokens so far) || tokens of chunk i)
//! digest(n)   = state after absorbing all n tokens (the last chunk may be partial)
//! ```
//!
//! Each chunk is hashed exactly once, so [`ContextHasher::boundaries`] yields
//! the digest at every boundary of an n-token sequence in O(n) total (the
//! naive approach — hashing each prefix from scratch — is O(n²)). The chain
//! binds the namespace (as the key), every token and the prefix length.

use crate::digest::{ContextDigest, Namespace};
use crate::error::{Error, Result};

const CHAIN_START: &[u8] = b"deltapack context v1";

/// Incremental context-digest builder for one namespace and chunk size.
#[derive(Clone)]
pub struct ContextHasher {
    namespace: Namespace,
    chunk_tokens: usize,
}

impl ContextHasher {
    /// A builder for `namespace` with the identity's `chunk_tokens`.
    pub fn new(namespace: Namespace, chunk_tokens: u32) -> Result<Self> {
        if chunk_tokens == 0 {
            return Err(Error::Invalid("chunk_tokens must be positive".into()));
        }
        Ok(ContextHasher {
            namespace,
            chunk_tokens: chunk_tokens as usize,
        })
    }

    fn start(&self) -> [u8; 32] {
        *blake3::keyed_hash(self.namespace.as_bytes(), CHAIN_START).as_bytes()
    }

    fn link(&self, state: &[u8; 32], total: u64, chunk: &[u32]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(self.namespace.as_bytes());
        h.update(state);
        h.update(&total.to_le_bytes());
        let mut buf = [0u8; 4096];
        for part in chunk.chunks(buf.len() / 4) {
            for (dst, t) in buf.chunks_exact_mut(4).zip(part) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            h.update(&buf[..part.len() * 4]);
        }
        *h.finalize().as_bytes()
    }

    /// The digest of the whole token sequence (any length, including a
    /// partial final chunk).
    pub fn digest(&self, tokens: &[u32]) -> ContextDigest {
        let mut state = self.start();
        let mut total = 0u64;
        for chunk in tokens.chunks(self.chunk_tokens) {
            total += chunk.len() as u64;
            state = self.link(&state, total, chunk);
        }
        ContextDigest(state)
    }

    /// `(boundary, digest)` for every full-chunk boundary of `tokens`, in
    /// increasing order, computed in one pass. A trailing partial chunk has no
    /// boundary and is ignored.
    pub fn boundaries(&self, tokens: &[u32]) -> Vec<(u64, ContextDigest)> {
        let mut out = Vec::with_capacity(tokens.len() / self.chunk_tokens);
        let mut state = self.start();
        let mut total = 0u64;
        for chunk in tokens.chunks_exact(self.chunk_tokens) {
            total += chunk.len() as u64;
            state = self.link(&state, total, chunk);
            out.push((total, ContextDigest(state)));
        }
        out
    }
}

/// Convenience: the digest of `tokens` under `namespace` with `chunk_tokens`.
pub fn context_digest(
    namespace: Namespace,
    chunk_tokens: u32,
    tokens: &[u32],
) -> Result<ContextDigest> {
    Ok(ContextHasher::new(namespace, chunk_tokens)?.digest(tokens))
}

/// Decodes a token file: a sequence of u32 little-endian token ids.
pub fn tokens_from_le_bytes(bytes: &[u8]) -> Result<Vec<u32>> {
    if bytes.len() % 4 != 0 {
        return Err(Error::Invalid(format!(
            "token file length {} is not a multiple of 4 (u32 little-endian ids)",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Encodes token ids as u32 little-endian bytes.
pub fn tokens_to_le_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Namespace {
        Namespace([7u8; 32])
    }

    #[test]
    fn boundaries_match_prefix_digests_for_262144_tokens() {
        let tokens: Vec<u32> = (0..262_144u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 128_000)
            .collect();
        let h = ContextHasher::new(ns(), 256).expect("hasher");
        let all = h.boundaries(&tokens);
        assert_eq!(all.len(), 1024);
        // One pass gives the same answer as hashing each prefix on its own
        // (checked on a sample: the full O(n²) check is what we avoid).
        for &k in &[0usize, 1, 2, 511, 1023] {
            let (n, d) = all[k];
            assert_eq!(n as usize, (k + 1) * 256);
            assert_eq!(d, h.digest(&tokens[..n as usize]));
        }
        assert_eq!(all[1023].1, h.digest(&tokens));
    }

    #[test]
    fn digest_binds_namespace_tokens_and_length() {
        let h = ContextHasher::new(ns(), 256).expect("hasher");
        let t: Vec<u32> = (0..600).collect();
        let d = h.digest(&t);
        assert_ne!(d, h.digest(&t[..599]));
        let mut t2 = t.clone();
        t2[5] ^= 1;
        assert_ne!(d, h.digest(&t2));
        let h2 = ContextHasher::new(Namespace([8u8; 32]), 256).expect("hasher");
        assert_ne!(d, h2.digest(&t));
        assert!(ContextHasher::new(ns(), 0).is_err());
    }

    #[test]
    fn token_file_codec() {
        let t = vec![1u32, 2, 0xdead_beef];
        assert_eq!(
            tokens_from_le_bytes(&tokens_to_le_bytes(&t)).expect("ok"),
            t
        );
        assert!(tokens_from_le_bytes(&[1, 2, 3]).is_err());
    }
}
