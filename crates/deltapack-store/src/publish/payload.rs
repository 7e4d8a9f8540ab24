//! A payload as the writer sees it: ordered zero-copy parts of the
//! caller's bytes, cut into extents and multipart parts.
//!
//! Never copies a part except where the legacy v1 writer needs one buffer
//! (`Payload::assemble`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deltapack_format::layer_digest::{LayerDigests, StreamFeed};
use deltapack_format::DigestState;
use futures::future::{BoxFuture, Shared};
use object_store::PutPayload;

use super::input_file::SnapshotFile;
use super::receipt::ResultDigest;
use crate::error::{Result, StoreError};

/// `payload` cut into parts of `part_bytes` (the last one shorter), each a
/// list of zero-copy slices of the payload's buffers.
pub(super) fn split_payload(payload: &PutPayload, part_bytes: u64) -> Vec<PutPayload> {
    let buffers: Vec<Bytes> = payload.iter().cloned().collect();
    let len = payload.content_length() as u64;
    let part_bytes = part_bytes.max(1);
    (0..len.div_ceil(part_bytes))
        .map(|i| {
            let r = i * part_bytes..((i + 1) * part_bytes).min(len);
            slice_parts(&buffers, r).into_iter().collect()
        })
        .collect()
}

/// The result digest of a delta publication, computed while extents are
/// written.
pub(super) type LateDigest =
    Shared<BoxFuture<'static, std::result::Result<Arc<ResultDigest>, String>>>;

/// The encoded delta header, available once the result digest is.
pub(super) type LateHeader = Shared<BoxFuture<'static, std::result::Result<Bytes, String>>>;

/// A payload to write as extents: its bytes as parts, in order (slices of
/// the caller's snapshot, not copies). With `header`, `parts[0]` is a
/// stand-in of the right length for bytes that arrive late.
pub(crate) struct Payload {
    pub(super) parts: Vec<Bytes>,
    pub(super) header: Option<LateHeader>,
    /// The bytes are read from this file instead (`parts` is then empty):
    /// each extent with `pread`, straight into its staging buffer.
    pub(super) file: Option<Arc<SnapshotFile>>,
    /// Fed with every staged extent in payload order (a flat payload: the
    /// snapshot's encoding), so the layered digest comes from the very
    /// bytes written.
    pub(super) feed: Option<Arc<Mutex<StreamFeed>>>,
    /// `parts` is one staged buffer (`staging.rs`) this publication made:
    /// its extents are slices of it, not copied again.
    pub(super) staged: bool,
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Self {
        Payload::from_parts(vec![b], None)
    }
}

impl Payload {
    /// A payload of `parts` in memory (with `header`, `parts[0]` is a
    /// stand-in for bytes that arrive late).
    pub(super) fn from_parts(parts: Vec<Bytes>, header: Option<LateHeader>) -> Self {
        Payload {
            parts,
            header,
            file: None,
            feed: None,
            staged: false,
        }
    }

    /// This payload, its staged extents fed to `feed` in order (a flat
    /// snapshot's encoding: no late header).
    pub(super) fn with_feed(mut self, feed: Arc<Mutex<StreamFeed>>) -> Self {
        self.feed = Some(feed);
        self
    }

    /// A flat snapshot read from `file`, fed to `feed` as it is staged.
    pub(super) fn from_file(file: Arc<SnapshotFile>, feed: Arc<Mutex<StreamFeed>>) -> Self {
        Payload {
            parts: Vec::new(),
            header: None,
            file: Some(file),
            feed: Some(feed),
            staged: false,
        }
    }

    /// A payload already staged by this publication, in one buffer
    /// (`staging::stage_with`): written from slices of it.
    pub(super) fn staged(bytes: Bytes) -> Self {
        Payload {
            staged: true,
            ..Payload::from_parts(vec![bytes], None)
        }
    }

    pub(super) fn len(&self) -> u64 {
        match &self.file {
            Some(f) => f.len(),
            None => self.parts.iter().map(|p| p.len() as u64).sum(),
        }
    }

    /// The payload in one buffer (the legacy v1 writer needs it; never a
    /// file's).
    pub(super) async fn assemble(mut self) -> Result<Bytes> {
        if self.file.is_some() {
            return Err(StoreError::Internal(
                "a file payload is not assembled".into(),
            ));
        }
        if let Some(h) = self.header.take() {
            self.parts[0] = h.await.map_err(StoreError::Internal)?;
        }
        if self.parts.len() == 1 {
            return Ok(self.parts.remove(0));
        }
        tokio::task::spawn_blocking(move || Bytes::from(self.parts.concat()))
            .await
            .map_err(|e| StoreError::task("assemble", e))
    }
}

/// The parts covering payload bytes `r` (zero-copy slices).
pub(super) fn slice_parts(parts: &[Bytes], r: std::ops::Range<u64>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in parts {
        let (lo, hi) = (at, at + p.len() as u64);
        at = hi;
        if hi <= r.start || lo >= r.end {
            continue;
        }
        let a = r.start.max(lo) - lo;
        let b = r.end.min(hi) - lo;
        out.push(p.slice(a as usize..b as usize));
    }
    out
}

/// The digests (and state) a feed took from the staged extents: an error
/// means the bytes staged began with another header than the snapshot's,
/// i.e. the caller's memory changed during the call.
pub(super) fn finish_feed(
    feed: Arc<std::sync::Mutex<StreamFeed>>,
    what: &str,
) -> Result<(LayerDigests, DigestState)> {
    let feed = Arc::try_unwrap(feed)
        .map_err(|_| StoreError::Internal("the digest feed is still shared".into()))?
        .into_inner()
        .map_err(|_| StoreError::Internal("the digest feed's lock was poisoned".into()))?;
    feed.finish()
        .map_err(|e| StoreError::InputChanged(format!("{what}: {e}")))
}
