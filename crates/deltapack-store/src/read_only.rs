//! A backend that serves reads and refuses every write.
//!
//! [`Backend::read_only`] puts a layer in front of a backend that refuses
//! (and counts) puts, multipart puts, copies, renames and deletes, and
//! reports itself as a `memory` backend so that no local-disk fast path
//! (the restore's quarantine rename, a root lock file, direct reads that
//! bypass the object store) writes behind the layer's back. Checks that
//! must never change a store (`deltapack compat`, `migrate --check`) read
//! through it; a restore that finds a damaged object tries to quarantine
//! it, the layer refuses, and the count says so. This module never lets a
//! write through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, MultipartUpload, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};

use crate::backend::{Backend, BackendKind};
use crate::wrap::{Intercept, Wrapped};

/// How many writes a read-only backend refused (shared with its clones).
#[derive(Debug, Clone, Default)]
pub struct Refusals(Arc<AtomicU64>);

impl Refusals {
    /// Writes refused so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn refuse(&self, what: &str, location: &Path) -> object_store::Error {
        self.0.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%location, "read-only store: refused a {what}");
        object_store::Error::NotSupported {
            source: format!("{what} of {location}: this store handle is read-only").into(),
        }
    }
}

/// The read-only layer.
#[derive(Debug)]
struct ReadOnly {
    inner: Arc<dyn ObjectStore>,
    refused: Refusals,
}

#[async_trait::async_trait]
impl Intercept for ReadOnly {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    fn name(&self) -> &str {
        "ReadOnly"
    }

    async fn put_opts(
        &self,
        location: &Path,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(self.refused.refuse("put", location))
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(self.refused.refuse("multipart put", location))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let refused = self.refused.clone();
        locations
            .map(move |l| Err(refused.refuse("delete", &l?)))
            .boxed()
    }

    async fn copy_opts(
        &self,
        _from: &Path,
        to: &Path,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(self.refused.refuse("copy", to))
    }
}

impl Backend {
    /// This backend behind a layer that serves reads and refuses every
    /// write (see the module docs), and the count of writes it refused.
    /// The result's kind is [`BackendKind::Memory`]: no local-disk path
    /// of the store bypasses the layer.
    pub fn read_only(&self) -> (Backend, Refusals) {
        let refused = Refusals::default();
        let store = Wrapped::arc(ReadOnly {
            inner: self.store.clone(),
            refused: refused.clone(),
        });
        (
            Backend {
                store,
                kind: BackendKind::Memory,
            },
            refused,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn every_write_is_refused_and_counted_and_reads_pass() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let p = Path::from("objects/x");
        inner
            .put(&p, PutPayload::from_static(b"abc"))
            .await
            .expect("seed");
        let (ro, refused) = Backend {
            store: inner.clone(),
            kind: BackendKind::Local {
                root: std::path::PathBuf::from("/nonexistent"),
            },
        }
        .read_only();
        assert_eq!(ro.kind, BackendKind::Memory);
        let q = Path::from("objects/y");
        assert!(ro
            .store
            .put(&q, PutPayload::from_static(b"z"))
            .await
            .is_err());
        assert!(ro.store.put_multipart(&q).await.is_err());
        assert!(ro.store.copy(&p, &q).await.is_err());
        assert!(ro.store.rename(&p, &q).await.is_err());
        assert!(ro.store.delete(&p).await.is_err());
        assert!(refused.count() >= 5, "{}", refused.count());
        assert_eq!(
            ro.store.get(&p).await.expect("read").bytes().await.ok(),
            Some(bytes::Bytes::from_static(b"abc"))
        );
        assert_eq!(
            ro.store.get_range(&p, 1..3).await.ok().as_deref(),
            Some(&b"bc"[..])
        );
        assert!(inner.head(&q).await.is_err(), "nothing was written");
        assert!(inner.head(&p).await.is_ok(), "nothing was deleted");
    }
}
