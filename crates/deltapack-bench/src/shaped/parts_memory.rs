//! [`PartsMemory`]: the in-memory object store the shaped publication
//! scenarios write to, which keeps every payload as the parts it was given
//! (no copy) — apart from the shaping itself, which wraps it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// One object of [`PartsMemory`].
#[derive(Debug, Clone)]
struct Kept {
    parts: Arc<Vec<Bytes>>,
    size: u64,
    e_tag: String,
}

/// The objects of a [`PartsMemory`], by key.
type KeptMap = Arc<Mutex<std::collections::BTreeMap<ObjPath, Kept>>>;

/// An in-memory sink for publications that keeps every payload as the
/// `Bytes` parts it was given. `object_store`'s `InMemory` concatenates a
/// payload of several parts (and a multipart upload's parts) into one new
/// buffer: a 64 MiB copy into fresh memory per extent, CPU no S3 client
/// spends, and on the reference machine first-touch page faults make it a
/// large share of a publication's CPU. PUT (create, overwrite, update by
/// e-tag), multipart, GET (whole, ranged, HEAD, preconditions), delete,
/// list and copy; `list_with_delimiter` is not implemented.
#[derive(Debug, Default)]
pub(crate) struct PartsMemory {
    objects: KeptMap,
    next_tag: Arc<AtomicU64>,
}

impl std::fmt::Display for PartsMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PartsMemory")
    }
}

fn kept_meta(location: &ObjPath, k: &Kept) -> ObjectMeta {
    ObjectMeta {
        location: location.clone(),
        last_modified: Default::default(),
        size: k.size,
        e_tag: Some(k.e_tag.clone()),
        version: None,
    }
}

fn missing(location: &ObjPath) -> object_store::Error {
    object_store::Error::NotFound {
        path: location.to_string(),
        source: "no such object".into(),
    }
}

impl PartsMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<ObjPath, Kept>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `parts` under `location` as `mode` says.
    fn insert(
        objects: &KeptMap,
        next_tag: &AtomicU64,
        location: &ObjPath,
        parts: Vec<Bytes>,
        mode: &object_store::PutMode,
    ) -> object_store::Result<PutResult> {
        let mut map = objects.lock().unwrap_or_else(|e| e.into_inner());
        match (mode, map.get(location)) {
            (object_store::PutMode::Create, Some(_)) => {
                return Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "object exists".into(),
                })
            }
            (object_store::PutMode::Update(v), cur)
                if cur.is_none_or(|k| Some(&k.e_tag) != v.e_tag.as_ref()) =>
            {
                return Err(object_store::Error::Precondition {
                    path: location.to_string(),
                    source: "e-tag mismatch".into(),
                });
            }
            _ => {}
        }
        let e_tag = next_tag.fetch_add(1, Ordering::Relaxed).to_string();
        let size = parts.iter().map(|b| b.len() as u64).sum();
        map.insert(
            location.clone(),
            Kept {
                parts: Arc::new(parts),
                size,
                e_tag: e_tag.clone(),
            },
        );
        Ok(PutResult {
            e_tag: Some(e_tag),
            version: None,
            extensions: Default::default(),
        })
    }
}

/// A multipart upload into a [`PartsMemory`]: parts kept in order.
#[derive(Debug)]
struct PartsUpload {
    objects: KeptMap,
    next_tag: Arc<AtomicU64>,
    location: ObjPath,
    parts: Vec<PutPayload>,
}

#[async_trait]
impl MultipartUpload for PartsUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.parts.push(data);
        Box::pin(futures::future::ready(Ok(())))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let parts: Vec<Bytes> = std::mem::take(&mut self.parts)
            .into_iter()
            .flat_map(|p| p.into_iter())
            .collect();
        PartsMemory::insert(
            &self.objects,
            &self.next_tag,
            &self.location,
            parts,
            &object_store::PutMode::Overwrite,
        )
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.parts.clear();
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for PartsMemory {
    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let parts: Vec<Bytes> = payload.into_iter().collect();
        Self::insert(&self.objects, &self.next_tag, location, parts, &opts.mode)
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(PartsUpload {
            objects: self.objects.clone(),
            next_tag: self.next_tag.clone(),
            location: location.clone(),
            parts: Vec::new(),
        }))
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let k = self
            .lock()
            .get(location)
            .cloned()
            .ok_or_else(|| missing(location))?;
        let meta = kept_meta(location, &k);
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(r) => r
                .as_range(k.size)
                .map_err(|e| object_store::Error::Generic {
                    store: "PartsMemory",
                    source: Box::new(e),
                })?,
            None => 0..k.size,
        };
        // The parts overlapping `range`, sliced (no copies).
        let mut body = Vec::new();
        if !options.head {
            let mut at = 0u64;
            for p in k.parts.iter() {
                let (s, e) = (at, at + p.len() as u64);
                at = e;
                let (lo, hi) = (s.max(range.start), e.min(range.end));
                if lo < hi {
                    body.push(Ok(p.slice((lo - s) as usize..(hi - s) as usize)));
                }
            }
        }
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::iter(body).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        let objects = self.objects.clone();
        locations
            .map(move |l| {
                let l = l?;
                objects.lock().unwrap_or_else(|e| e.into_inner()).remove(&l);
                Ok(l)
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&ObjPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let metas: Vec<object_store::Result<ObjectMeta>> = self
            .lock()
            .iter()
            .filter(|(l, _)| prefix.is_none_or(|p| l.prefix_matches(p)))
            .map(|(l, k)| Ok(kept_meta(l, k)))
            .collect();
        futures::stream::iter(metas).boxed()
    }

    async fn list_with_delimiter(
        &self,
        _prefix: Option<&ObjPath>,
    ) -> object_store::Result<ListResult> {
        Err(object_store::Error::NotImplemented {
            operation: "list_with_delimiter".into(),
            implementer: "PartsMemory".into(),
        })
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let k = self
            .lock()
            .get(from)
            .cloned()
            .ok_or_else(|| missing(from))?;
        let mode = match options.mode {
            object_store::CopyMode::Create => object_store::PutMode::Create,
            _ => object_store::PutMode::Overwrite,
        };
        Self::insert(
            &self.objects,
            &self.next_tag,
            to,
            k.parts.as_ref().clone(),
            &mode,
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{GetRange, ObjectStoreExt};

    #[tokio::test]
    async fn parts_memory_keeps_parts_and_serves_ranges() {
        let m = PartsMemory::default();
        let key = ObjPath::from("x");
        let payload: PutPayload = [Bytes::from_static(b"abc"), Bytes::from_static(b"defg")]
            .into_iter()
            .collect();
        let create = PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        m.put_opts(&key, payload.clone(), create.clone())
            .await
            .expect("create");
        assert!(matches!(
            m.put_opts(&key, payload, create).await,
            Err(object_store::Error::AlreadyExists { .. })
        ));
        assert_eq!(m.lock().get(&key).expect("kept").parts.len(), 2);
        let opts = GetOptions {
            range: Some(GetRange::Bounded(2..5)),
            ..Default::default()
        };
        let got = m.get_opts(&key, opts).await.expect("range");
        assert_eq!(got.range, 2..5);
        assert_eq!(&got.bytes().await.expect("body")[..], b"cde");
        assert_eq!(m.head(&key).await.expect("head").size, 7);
        assert!(matches!(
            m.head(&ObjPath::from("y")).await,
            Err(object_store::Error::NotFound { .. })
        ));
        let mut up = m
            .put_multipart_opts(&ObjPath::from("mp"), PutMultipartOptions::default())
            .await
            .expect("create");
        up.put_part(PutPayload::from_static(b"12"))
            .await
            .expect("p1");
        up.put_part(PutPayload::from_static(b"34"))
            .await
            .expect("p2");
        up.complete().await.expect("complete");
        let all = m
            .get(&ObjPath::from("mp"))
            .await
            .expect("get")
            .bytes()
            .await;
        assert_eq!(&all.expect("body")[..], b"1234");
    }
}
