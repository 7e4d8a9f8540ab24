//! The legacy v1 reader: one SHA-256-named object per 256-token chunk,
//! fetched with bounded concurrency and checked against its name.
//!
//! Never writes; a v1 root is migrated only by `migrate_v1.rs`.

use deltapack_format::snapshot::digest_of_encoding;
use deltapack_format::ManifestV1;
use futures::{FutureExt, StreamExt};

use super::outcome::RESTORE_IN_FLIGHT;
use crate::error::{MissReason, Result, StoreError};
use crate::store::Store;
use crate::verify::Expected;

impl Store {
    pub(crate) async fn fetch_v1(
        &self,
        m: &ManifestV1,
    ) -> Result<std::result::Result<Vec<u8>, MissReason>> {
        // Lazily committed zero pages (huge pages are advised, never faulted
        // in ahead): a forged root declaring a huge payload
        // costs nothing until verified chunk bytes are written, and an
        // impossible size is a corrupt miss, not an error.
        let mut payload = match usize::try_from(m.payload_len)
            .map_err(|_| format!("{} bytes do not fit in memory", m.payload_len))
            .and_then(|n| crate::buffer::fresh_buffer(n).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(what) => {
                return Ok(Err(MissReason::damaged(format!(
                    "v1 root declares an unusable payload: {what}"
                ))))
            }
        };
        let ranges = deltapack_format::root::v1_chunk_ranges(m.payload_len, m.chunks.len() as u64);
        let mut stream = futures::stream::iter(m.chunks.iter().copied().zip(ranges))
            .map(|(c, r)| {
                self.fetch_verified(Expected::V1 {
                    digest: c.digest,
                    len: c.bytes,
                })
                .map(move |x| x.map(|x| (r, x)))
            })
            .buffered(RESTORE_IN_FLIGHT);
        while let Some(item) = stream.next().await {
            let (r, x) = item?;
            match x {
                Ok(b) => payload[r.start as usize..r.end as usize].copy_from_slice(&b),
                Err(fault) => {
                    return Ok(Err(fault.miss()));
                }
            }
        }
        let want = m.payload_digest;
        let (payload, found) = tokio::task::spawn_blocking(move || {
            let d = digest_of_encoding(&payload);
            (payload, d)
        })
        .await
        .map_err(|e| StoreError::task("hash", e))?;
        if found != want {
            return Ok(Err(MissReason::damaged(format!(
                "v1 payload digest {found} != {want}"
            ))));
        }
        Ok(Ok(payload))
    }
}
