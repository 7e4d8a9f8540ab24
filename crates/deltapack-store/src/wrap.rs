//! One way to put a layer in front of an object store.
//!
//! A layer (a read-only guard, a fault injector, a counter, a bandwidth
//! shaper) overrides the one or two calls it cares about and forwards the
//! rest. It implements [`Intercept`], whose methods all forward to
//! [`Intercept::inner`] by default, and [`Wrapped`] turns it into an
//! [`ObjectStore`]. This module must never change what a forwarded call
//! does: `get_ranges`, `list_with_offset` and `rename_opts` keep
//! `object_store`'s provided implementations, which go through the
//! layer's own `get_opts`, `list` and `copy_opts`/`delete_stream`, so a
//! layer that intercepts `get_opts` also sees every ranged read.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, Extensions, GetOptions, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, Result,
};

/// A layer in front of an object store: every method forwards to
/// [`Intercept::inner`] unless the layer overrides it. Wrap the layer in
/// [`Wrapped`] to get an [`ObjectStore`].
#[async_trait::async_trait]
pub trait Intercept: fmt::Debug + Send + Sync + 'static {
    /// The store behind the layer.
    fn inner(&self) -> &Arc<dyn ObjectStore>;

    /// The layer's name in [`Wrapped`]'s `Display` (`Name(inner)`).
    fn name(&self) -> &str {
        "Wrapped"
    }

    /// [`ObjectStore::put_opts`].
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner().put_opts(location, payload, opts).await
    }

    /// [`ObjectStore::put_multipart_opts`].
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner().put_multipart_opts(location, opts).await
    }

    /// [`ObjectStore::get_opts`] (ranged reads come here too).
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner().get_opts(location, options).await
    }

    /// [`ObjectStore::delete_stream`].
    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner().delete_stream(locations)
    }

    /// [`ObjectStore::list`].
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner().list(prefix)
    }

    /// [`ObjectStore::list_with_delimiter`].
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner().list_with_delimiter(prefix).await
    }

    /// [`ObjectStore::copy_opts`].
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner().copy_opts(from, to, options).await
    }
}

/// The two methods every layer writes the same way, inside its
/// `impl Intercept`: [`Intercept::inner`] is the layer's `inner` field (an
/// `Arc<dyn ObjectStore>`) and [`Intercept::name`] is the given name.
///
/// ```ignore
/// #[async_trait::async_trait]
/// impl Intercept for CountGets {
///     deltapack_store::layer_basics!("CountGets");
///     // the overridden methods
/// }
/// ```
#[macro_export]
macro_rules! layer_basics {
    ($name:literal) => {
        fn inner(&self) -> &::std::sync::Arc<dyn ::object_store::ObjectStore> {
            &self.inner
        }

        fn name(&self) -> &str {
            $name
        }
    };
}

/// An [`Intercept`] layer as an [`ObjectStore`].
#[derive(Debug)]
pub struct Wrapped<I>(pub I);

impl<I: Intercept> Wrapped<I> {
    /// The layer as a shareable store.
    pub fn arc(layer: I) -> Arc<dyn ObjectStore> {
        Arc::new(Wrapped(layer))
    }
}

/// The layer's own methods (its counters, its plan) through the store.
impl<I> Deref for Wrapped<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.0
    }
}

impl<I: Intercept> fmt::Display for Wrapped<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.0.name(), self.0.inner())
    }
}

#[async_trait::async_trait]
impl<I: Intercept> ObjectStore for Wrapped<I> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.0.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

/// A read's answer without its body: what a layer keeps when it serves a
/// body of its own (re-chunked, counted, delayed or damaged) under the
/// inner store's metadata.
#[derive(Debug, Clone)]
pub struct ReadHead {
    /// [`GetResult::meta`].
    pub meta: ObjectMeta,
    /// [`GetResult::range`].
    pub range: Range<u64>,
    /// [`GetResult::attributes`].
    pub attributes: Attributes,
    /// [`GetResult::extensions`].
    pub extensions: Extensions,
}

impl ReadHead {
    /// The head of `r` (its body stays in `r`).
    pub fn of(r: &GetResult) -> ReadHead {
        ReadHead {
            meta: r.meta.clone(),
            range: r.range.clone(),
            attributes: r.attributes.clone(),
            extensions: r.extensions.clone(),
        }
    }

    /// The head of `r` and its whole body, read.
    pub async fn read(r: GetResult) -> Result<(ReadHead, Bytes)> {
        let head = ReadHead::of(&r);
        Ok((head, r.bytes().await?))
    }

    /// The answer with `body` as its streamed body.
    pub fn stream(self, body: BoxStream<'static, Result<Bytes>>) -> GetResult {
        GetResult {
            payload: GetResultPayload::Stream(body),
            meta: self.meta,
            range: self.range,
            attributes: self.attributes,
            extensions: self.extensions,
        }
    }

    /// The answer with `body` as its one chunk.
    pub fn once(self, body: Bytes) -> GetResult {
        self.stream(futures::stream::once(async move { Ok(body) }).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts `get_opts` calls: ranged reads must come through it.
    #[derive(Debug)]
    struct CountGets {
        inner: Arc<dyn ObjectStore>,
        gets: Arc<AtomicU64>,
    }

    #[async_trait::async_trait]
    impl Intercept for CountGets {
        crate::layer_basics!("CountGets");

        async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            self.inner.get_opts(location, options).await
        }
    }

    #[tokio::test]
    async fn a_layer_sees_ranged_reads_and_forwards_the_rest() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let gets = Arc::new(AtomicU64::new(0));
        let s = Wrapped(CountGets {
            inner: inner.clone(),
            gets: gets.clone(),
        });
        let p = Path::from("a/b");
        s.put(&p, PutPayload::from_static(b"0123456789"))
            .await
            .expect("put forwards");
        let stored = inner.get(&p).await.expect("in inner").bytes().await.ok();
        assert_eq!(stored.as_deref(), Some(&b"0123456789"[..]));
        assert_eq!(gets.load(Ordering::SeqCst), 0);
        let r = s.get_ranges(&p, &[0..2, 5..7]).await.expect("ranges");
        assert_eq!(r, vec![&b"01"[..], &b"56"[..]]);
        assert!(
            gets.load(Ordering::SeqCst) >= 1,
            "ranged reads pass the layer"
        );
        assert!(s.head(&p).await.is_ok());
        assert_eq!(s.to_string(), format!("CountGets({inner})"));
    }
}
