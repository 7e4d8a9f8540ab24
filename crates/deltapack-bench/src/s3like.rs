//! The S3-like emulation: a local store's files through `object_store`,
//! with a per-GET latency (`ThrottledStore`) and bodies streamed in
//! 256 KiB chunks, as an HTTP GET delivers them.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use deltapack_store::wrap::{Intercept, ReadHead, Wrapped};
use deltapack_store::{Backend, BackendKind, Store, StoreConfig};
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{GetOptions, GetResult, GetResultPayload, ObjectStore};

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

impl StreamedObjects {
    /// `inner` with its GETs streamed, as a store.
    pub(crate) fn over(inner: Arc<dyn ObjectStore>) -> Wrapped<StreamedObjects> {
        Wrapped(StreamedObjects { inner })
    }
}

/// `file`'s bytes in `range`, read in [`BODY_CHUNK`] pieces off the async
/// workers.
fn chunked(
    file: std::fs::File,
    range: Range<u64>,
) -> BoxStream<'static, object_store::Result<Bytes>> {
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

/// A GET forwarded to `inner`, answered under the inner answer's head with
/// the body `body` makes of that answer (a HEAD's body stays empty): the
/// `get_opts` of a layer that re-chunks or paces bodies.
pub(crate) async fn get_rebodied(
    inner: &dyn ObjectStore,
    location: &ObjPath,
    options: GetOptions,
    body: impl FnOnce(GetResult) -> BoxStream<'static, object_store::Result<Bytes>>,
) -> object_store::Result<GetResult> {
    let head = options.head;
    let r = inner.get_opts(location, options).await?;
    let reply = ReadHead::of(&r);
    let body = if head {
        futures::stream::empty().boxed()
    } else {
        body(r)
    };
    Ok(reply.stream(body))
}

#[async_trait::async_trait]
impl Intercept for StreamedObjects {
    deltapack_store::layer_basics!("StreamedObjects");

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        get_rebodied(&*self.inner, location, options, |r| match r.payload {
            GetResultPayload::File(file, _) => chunked(file, r.range),
            GetResultPayload::Stream(s) => s,
        })
        .await
    }
}

/// The S3-like emulation: the local store's files through `object_store`,
/// streamed bodies, `latency_ms` per GET.
pub(crate) fn throttled_store(dir: &Path, latency_ms: u64, config: StoreConfig) -> Result<Store> {
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("opening {}", dir.display()))?;
    let throttled = ThrottledStore::new(
        StreamedObjects::over(Arc::new(local)),
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
