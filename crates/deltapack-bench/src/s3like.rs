//! The S3-like emulation: a local store's files through `object_store`,
//! with a per-GET latency (`ThrottledStore`) and bodies streamed in
//! 256 KiB chunks, as an HTTP GET delivers them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use deltapack_store::{Backend, BackendKind, Store, StoreConfig};
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Body chunk size of the S3-like emulation.
pub(crate) const BODY_CHUNK: u64 = 256 * 1024;

/// An `ObjectStore` that turns local-file GETs into a streamed body of
/// [`BODY_CHUNK`] pieces, as an HTTP GET delivers it (`ThrottledStore` only
/// wraps streams).
///
/// Earlier versions delivered each object as one in-memory body; that
/// charged every 64 MiB GET a fresh 64 MiB allocation (page faults) that
/// no real S3 client makes, so S3-like restores paid for the emulation.
#[derive(Debug)]
pub(crate) struct StreamedObjects {
    /// The store whose GETs are streamed.
    pub(crate) inner: Arc<dyn ObjectStore>,
}

impl std::fmt::Display for StreamedObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamedObjects({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for StreamedObjects {
    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let r = self.inner.get_opts(location, options).await?;
        if matches!(r.payload, GetResultPayload::Stream(_)) {
            return Ok(r);
        }
        let (meta, range, attributes, extensions) = (
            r.meta.clone(),
            r.range.clone(),
            r.attributes.clone(),
            r.extensions.clone(),
        );
        let body: BoxStream<'static, object_store::Result<Bytes>> = match r.payload {
            _ if head => futures::stream::empty().boxed(),
            GetResultPayload::File(file, _) => {
                let file = Arc::new(file);
                let end = range.end;
                futures::stream::try_unfold(range.start, move |pos| {
                    let file = file.clone();
                    async move {
                        if pos >= end {
                            return Ok(None);
                        }
                        let n = (end - pos).min(BODY_CHUNK);
                        let chunk = tokio::task::spawn_blocking(move || {
                            use std::os::unix::fs::FileExt;
                            let mut v = vec![0u8; n as usize];
                            file.read_exact_at(&mut v, pos).map(|_| Bytes::from(v))
                        })
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|r| r)
                        .map_err(|e| object_store::Error::Generic {
                            store: "bench",
                            source: Box::new(e),
                        })?;
                        Ok(Some((chunk, pos + n)))
                    }
                })
                .boxed()
            }
            GetResultPayload::Stream(s) => s,
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// The S3-like emulation: the local store's files through `object_store`,
/// streamed bodies, `latency_ms` per GET.
pub(crate) fn throttled_store(dir: &Path, latency_ms: u64, config: StoreConfig) -> Result<Store> {
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("opening {}", dir.display()))?;
    let throttled = ThrottledStore::new(
        StreamedObjects {
            inner: Arc::new(local),
        },
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(latency_ms),
            ..Default::default()
        },
    );
    Ok(Store::from_backend(
        Backend {
            store: Arc::new(throttled),
            kind: BackendKind::Memory,
        },
        config,
    )?)
}
