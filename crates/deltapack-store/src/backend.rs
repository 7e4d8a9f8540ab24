//! Opening backends from URLs, and the one place where durability lives.
//!
//! | URL                          | backend                                              |
//! |------------------------------|------------------------------------------------------|
//! | `file:///path` or `/path`    | `DirectLocal` (`LocalFileSystem`, fsync, direct I/O) |
//! | `s3://bucket[/prefix]`       | `AmazonS3` (path-style; `AWS_*` env, `?endpoint=…`)  |
//! | `memory://`                  | `InMemory` (process-local, for tests and demos)      |
//!
//! S3 URL options (`s3://bucket/prefix?k=v&…`): `endpoint`, `region`,
//! `allow_http`, the client's retries: `max_retries` (10 by default) and
//! `retry_timeout` (a duration, 3m by default), and its per-request bounds:
//! `timeout` (a whole request, 30s by default) and `connect_timeout` (5s
//! by default) — a node that must fail fast when the bucket is down or
//! does not answer (and serve from its tier) lowers them.
//!
//! **Durability.** Every write deltapack makes goes through
//! [`put_create`]: a create-if-absent `put_opts`. On local disk the backend is
//! [`crate::local::DirectLocal`] over `LocalFileSystem::with_fsync(true)`:
//! a create writes a staging file (with direct I/O where possible),
//! `sync_all`s it, hard-links it into place (atomic create-if-absent) and
//! fsyncs the parent directory before returning; on S3 the PUT (with
//! `If-None-Match: *`) has completed. When `put_create` returns `Ok`, the
//! object is durable — which is what lets a root be published strictly after
//! its objects.
//!
//! **Multipart extents.** The one exception to "every write is a
//! `put_create`": on a remote backend ([`BackendKind::is_remote`]) an extent
//! object larger than [`StoreConfig::remote.part_bytes`](crate::RemoteIoConfig::part_bytes) is written by
//! [`put_multipart`], a multipart upload whose parts go up concurrently
//! (one connection to S3 carries roughly 50–100 MB/s, so one PUT of a
//! 64 MiB extent is slow). An upload's object becomes visible, whole and
//! durable only when `complete` returns, exactly like a PUT; a failed part
//! or `complete` aborts the upload, so nothing of it is ever visible.
//! object_store offers no create-if-absent `complete`, so the caller
//! (publication) HEADs the key first and uploads only if it is absent or of
//! the wrong size: keys are content addresses, so two writers racing on one
//! key upload the same bytes, and whichever `complete` lands last replaces
//! an object with an identical one. Roots are never written this way; they
//! stay single conditional PUTs.
//!
//! **Crash leftovers.** A crash mid-write on local disk can leave a staging
//! file (`<key>#<n>`). Object keys never contain `#`, so [`open`] removes
//! such files once they are older than [`STAGING_ABANDONED_AFTER`] (another
//! process may be writing a younger one right now); the sweep removes them
//! after its grace period.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    MultipartUpload, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload,
};

use crate::error::{OpenError, Result, StoreError};

/// A staging file untouched for this long belongs to a crashed writer.
pub(crate) const STAGING_ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// What kind of backend a store runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// Process-local memory.
    Memory,
    /// Local disk rooted at a directory.
    Local {
        /// The store directory.
        root: PathBuf,
    },
    /// An S3-compatible bucket.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix inside the bucket (may be empty).
        prefix: String,
        /// The URL's settings after `?` (endpoint, region, timeouts), as
        /// given (may be empty): part of [`BackendKind::url`], not of
        /// [`BackendKind::identity`].
        query: String,
    },
}

impl BackendKind {
    /// The store's identity: `file:///dir`, `s3://bucket/prefix` (without
    /// the URL's settings) or `memory://`. What a ledger outside the store
    /// records as its owner, and how errors name the store.
    pub fn identity(&self) -> String {
        match self {
            BackendKind::Local { root } => format!("file://{}", root.display()),
            BackendKind::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
            BackendKind::Memory => "memory://".to_string(),
        }
    }

    /// A URL that opens this store again: [`BackendKind::identity`] with
    /// the S3 settings it was opened with (`?endpoint=…`), so that a
    /// command a hint suggests goes to the same server when pasted.
    pub fn url(&self) -> String {
        match self {
            BackendKind::S3 { query, .. } if !query.is_empty() => {
                format!("{}?{query}", self.identity())
            }
            _ => self.identity(),
        }
    }

    /// Whether the backend is a remote object store (anything but local disk
    /// and process memory): there, large extents are written as concurrent
    /// multipart uploads (see the module docs).
    pub fn is_remote(&self) -> bool {
        !matches!(self, BackendKind::Memory | BackendKind::Local { .. })
    }
}

/// An opened backend.
#[derive(Debug, Clone)]
pub struct Backend {
    /// The object store (already prefixed).
    pub store: Arc<dyn ObjectStore>,
    /// Its kind.
    pub kind: BackendKind,
}

/// The outcome of a create-if-absent write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    /// This call created the object (and it is durable).
    Created,
    /// An object already existed under the key; nothing was written.
    Existed,
}

/// Writes `bytes` under `key` only if absent. When this returns, a created
/// object is durable (see the module docs). The write path for roots and
/// for every object but a large extent on a remote backend
/// ([`put_multipart`]).
pub(crate) async fn put_create(
    store: &dyn ObjectStore,
    key: &Path,
    payload: impl Into<PutPayload>,
) -> Result<PutOutcome> {
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.put_opts(key, payload.into(), opts).await {
        Ok(_) => Ok(PutOutcome::Created),
        Err(object_store::Error::AlreadyExists { .. })
        | Err(object_store::Error::Precondition { .. }) => Ok(PutOutcome::Existed),
        Err(e) if is_storage_full(&e) => Err(StoreError::Capacity(
            crate::error::CapacityError::DeviceFull {
                key: key.to_string(),
            },
        )),
        Err(e) => Err(StoreError::io(key, e)),
    }
}

/// Why a multipart upload failed (the source of the [`StoreError::Io`] it
/// is reported as).
#[derive(Debug, thiserror::Error)]
#[error("multipart upload failed at {stage}; {aborted}: {source}")]
struct MultipartFailed {
    /// Which step failed (`part 3 of 8`, `complete`, …).
    stage: String,
    /// What became of the upload.
    aborted: String,
    /// The backend's error.
    #[source]
    source: object_store::Error,
}

/// A multipart upload that is aborted unless it completes: dropped while
/// pending (its publication failed elsewhere, or was cancelled), it aborts
/// in the background, so no pending upload (and its stored parts) is left
/// behind on the server.
struct PendingUpload {
    upload: Option<Box<dyn MultipartUpload>>,
    key: Path,
}

impl PendingUpload {
    /// Aborts now (awaited); returns what became of the upload, for the
    /// error message.
    async fn abort(&mut self) -> String {
        let Some(mut u) = self.upload.take() else {
            return "the upload was already finished".into();
        };
        // On a task of its own: a caller dropped meanwhile (a cancelled
        // publication) does not stop the abort half-way.
        let aborted = tokio::spawn(async move { u.abort().await })
            .await
            .unwrap_or_else(|e| {
                Err(object_store::Error::Generic {
                    store: "multipart",
                    source: Box::new(e),
                })
            });
        match aborted {
            Ok(()) => "the upload was aborted, nothing of it is visible".into(),
            Err(e) => {
                tracing::warn!(key = %self.key, error = %e, "could not abort a multipart upload");
                format!(
                    "aborting the upload failed too ({e}): no object is visible, but its parts stay on the server until a lifecycle rule removes them"
                )
            }
        }
    }
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        let Some(mut u) = self.upload.take() else {
            return;
        };
        let key = self.key.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => drop(h.spawn(async move {
                if let Err(e) = u.abort().await {
                    tracing::warn!(%key, error = %e, "could not abort an abandoned multipart upload");
                }
            })),
            Err(_) => {
                tracing::warn!(%key, "multipart upload abandoned outside a runtime; not aborted")
            }
        }
    }
}

/// Writes `parts` (in order) as one object under `key` by a multipart
/// upload, the parts uploaded concurrently, each holding a permit of
/// `in_flight` while it is sent (one semaphore per publication bounds the
/// parts in flight across all of its extents). Overwrites: the caller
/// checks first whether the object exists (see the module docs). When this
/// returns `Ok`, the object is complete and durable; on any error the
/// upload has been aborted and nothing is visible under `key`.
pub(crate) async fn put_multipart(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    parts: Vec<PutPayload>,
    in_flight: &tokio::sync::Semaphore,
) -> Result<()> {
    let count = parts.len();
    let failed = |stage: String, aborted: String, source| {
        let source = object_store::Error::Generic {
            store: "multipart",
            source: Box::new(MultipartFailed {
                stage,
                aborted,
                source,
            }),
        };
        StoreError::io(key, source)
    };
    // The upload is created on a task of its own, which wraps it in a
    // `PendingUpload` at once: if this call is dropped while the create is
    // under way (another extent of the publication failed), the upload the
    // server creates is still aborted, when the task's unclaimed result is
    // dropped, instead of staying pending with an id nobody knows.
    let (s, k) = (store.clone(), key.clone());
    let mut upload = tokio::spawn(async move {
        let started = s
            .put_multipart_opts(&k, PutMultipartOptions::default())
            .await?;
        Ok::<_, object_store::Error>(PendingUpload {
            upload: Some(started),
            key: k,
        })
    })
    .await
    .map_err(|e| StoreError::task("multipart upload creation", e))?
    .map_err(|e| failed("create".into(), "nothing was uploaded".into(), e))?;
    // `put_part` numbers the parts in call order; the futures it returns
    // do nothing until polled, and each is polled only once it holds a
    // permit (the semaphore is fair: an earlier extent's parts go first).
    // The first failure drops the others, cancelling their requests and
    // returning their permits.
    let sends: Vec<_> = match upload.upload.as_mut() {
        Some(u) => parts.into_iter().map(|p| u.put_part(p)).collect(),
        None => Vec::new(),
    };
    let sent = futures::stream::iter(sends.into_iter().enumerate().map(Ok))
        .try_for_each_concurrent(None, |(i, send)| async move {
            let _permit = in_flight.acquire().await.map_err(|e| {
                let e = object_store::Error::Generic {
                    store: "multipart",
                    source: Box::new(e),
                };
                (i, e)
            })?;
            send.await.map_err(|e| (i, e))
        })
        .await;
    if let Err((i, e)) = sent {
        let aborted = upload.abort().await;
        return Err(failed(format!("part {} of {count}", i + 1), aborted, e));
    }
    let done = match upload.upload.as_mut() {
        Some(u) => u.complete().await,
        None => return Err(StoreError::Internal("multipart upload vanished".into())),
    };
    match done {
        Ok(_) => {
            // Complete and durable: nothing to abort any more.
            upload.upload = None;
            Ok(())
        }
        Err(e) => {
            // A `complete` that landed but whose response was lost leaves
            // the (correct, content-addressed) object in place and the
            // abort finds no upload; the publication fails all the same.
            let aborted = upload.abort().await;
            Err(failed("complete".into(), aborted, e))
        }
    }
}

/// Whether an error (or any error in its source chain) is "no space left".
pub fn is_storage_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(28) {
                return true;
            }
            // An `io::Error` wrapping another error (`io::Error::other`)
            // reports that error's source, not the error itself: step in.
            if let Some(inner) = io.get_ref() {
                cur = Some(inner);
                continue;
            }
        }
        cur = err.source();
    }
    false
}

/// Whether `ep` is an endpoint the S3 client can use: an `http` or
/// `https` URL with a host (and a port that fits in 16 bits).
fn check_endpoint(ep: &str) -> Result<(), String> {
    let u = url::Url::parse(ep).map_err(|e| format!("{e} (give a URL like http://host:port)"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err("give an http:// or https:// URL with a host, like http://host:port".into());
    }
    Ok(())
}

/// Opens a backend from a URL (see the module docs).
pub fn open(url: &str) -> Result<Backend, OpenError> {
    let bad = |reason: &str| OpenError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if url == "memory://" || url == "memory:" {
        return Ok(Backend {
            store: Arc::new(InMemory::new()),
            kind: BackendKind::Memory,
        });
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (path_part, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path_part.split_once('/').unwrap_or((path_part, ""));
        if bucket.is_empty() {
            return Err(bad("missing bucket name"));
        }
        // An endpoint the S3 client cannot parse makes it panic (an invalid
        // port, no scheme): every endpoint it may read is checked first.
        for (from, ep) in ["DELTAPACK_S3_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .into_iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k, v)))
            .chain(query.split('&').filter_map(|p| {
                p.strip_prefix("endpoint=")
                    .map(|v| ("endpoint", v.to_string()))
            }))
        {
            check_endpoint(&ep).map_err(|e| bad(&format!("{from} {ep:?}: {e}")))?;
        }
        install_crypto_provider();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(false);
        if let Ok(ep) = std::env::var("DELTAPACK_S3_ENDPOINT") {
            b = b.with_endpoint(ep);
        }
        let mut retry = object_store::RetryConfig::default();
        // The request bounds first: the client options they set are the
        // builder's whole client configuration (`allow_http` below is set
        // on top of them).
        let mut client = object_store::ClientOptions::new();
        let mut bounded = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
            if k == "timeout" || k == "connect_timeout" {
                let d =
                    crate::units::parse_duration(v).map_err(|e| bad(&format!("{k}={v:?}: {e}")))?;
                if d.is_zero() {
                    return Err(bad(&format!("{k}=0: give a bound above zero")));
                }
                client = if k == "timeout" {
                    client.with_timeout(d)
                } else {
                    client.with_connect_timeout(d)
                };
                bounded = true;
            }
        }
        if bounded {
            b = b.with_client_options(client);
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
            b = match k {
                "timeout" | "connect_timeout" => b,
                "endpoint" => b.with_endpoint(v),
                "region" => b.with_region(v),
                "allow_http" => b.with_allow_http(v == "true"),
                "max_retries" => {
                    retry.max_retries = v
                        .parse()
                        .map_err(|_| bad(&format!("max_retries={v:?}: a whole number")))?;
                    b
                }
                "retry_timeout" => {
                    retry.retry_timeout = crate::units::parse_duration(v)
                        .map_err(|e| bad(&format!("retry_timeout={v:?}: {e}")))?;
                    b
                }
                _ => return Err(bad(&format!("unknown S3 option {k:?}"))),
            };
        }
        let endpoint_is_http = std::env::var("DELTAPACK_S3_ENDPOINT")
            .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .map(|e| e.starts_with("http://"))
            .unwrap_or(false)
            || query.contains("endpoint=http://");
        if endpoint_is_http {
            b = b.with_allow_http(true);
        }
        let s3 = b.with_retry(retry).build()?;
        let prefix = prefix.trim_matches('/').to_string();
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, prefix.as_str()))
        };
        return Ok(Backend {
            store,
            kind: BackendKind::S3 {
                bucket: bucket.to_string(),
                prefix,
                query: query.to_string(),
            },
        });
    }
    let path = if let Some(p) = url.strip_prefix("file://") {
        PathBuf::from(p)
    } else if url.contains("://") {
        return Err(bad("expected file://, s3:// or memory://"));
    } else {
        PathBuf::from(url)
    };
    if path.as_os_str().is_empty() {
        return Err(bad("empty path"));
    }
    open_local(&path)
}

fn open_local(path: &FsPath) -> Result<Backend, OpenError> {
    let local_err = |source| OpenError::Local {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(path).map_err(local_err)?;
    let root = std::fs::canonicalize(path).map_err(local_err)?;
    remove_staging_files(&root, STAGING_ABANDONED_AFTER).map_err(local_err)?;
    let fs = LocalFileSystem::new_with_prefix(&root)?
        .with_fsync(true)
        .with_automatic_cleanup(true);
    Ok(Backend {
        store: Arc::new(crate::local::DirectLocal::new(fs, root.clone())),
        kind: BackendKind::Local { root },
    })
}

/// Whether a file name is an `object_store` staging file (`name#digits`).
pub(crate) fn is_staging_name(name: &str) -> bool {
    match name.rsplit_once('#') {
        Some((_, n)) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Removes staging files a crash left behind that are older than `min_age`.
/// Returns how many were removed.
pub(crate) fn remove_staging_files(
    root: &FsPath,
    min_age: std::time::Duration,
) -> std::io::Result<usize> {
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // Other processes (writers, sweeps, other opens) change the tree
        // meanwhile: an entry that is gone by the time it is looked at, or
        // removed by someone else first, is simply done.
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            let ft = match entry.file_type() {
                Ok(t) => t,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file() && entry.file_name().to_str().is_some_and(is_staging_name) {
                let age = match entry.metadata() {
                    Ok(m) => m.modified().ok().and_then(|m| now.duration_since(m).ok()),
                    Err(e) if gone(&e) => continue,
                    Err(e) => return Err(e),
                };
                if age.unwrap_or_default() < min_age {
                    continue;
                }
                tracing::info!(path = %entry.path().display(), "removing orphaned staging file");
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) if gone(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(removed)
}

/// Installs the pure-Rust (ring) TLS crypto provider once; the S3 client
/// builder needs a process-wide provider.
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names() {
        assert!(is_staging_name("abcd#1"));
        assert!(is_staging_name("abcd#12"));
        assert!(!is_staging_name("abcd"));
        assert!(!is_staging_name("abcd#"));
        assert!(!is_staging_name("abcd#x"));
    }

    #[test]
    fn urls() {
        assert!(open("memory://").is_ok());
        assert!(open("ftp://x").is_err());
        assert!(open("s3://").is_err());
        // A bad endpoint is a clear error, not a panic in the S3 client.
        for ep in [
            "http://127.0.0.1:99999",
            "127.0.0.1:5055",
            "ftp://h:1",
            "http://",
        ] {
            match open(&format!("s3://b/p?endpoint={ep}")) {
                Err(OpenError::Url { reason, .. }) => assert!(reason.contains(ep), "{reason}"),
                Err(e) => panic!("{ep}: {e}"),
                Ok(_) => panic!("{ep}: opened"),
            }
        }
        let dir = tempfile::tempdir().expect("tmp");
        let staged = dir.path().join("objects/blake3/ab");
        std::fs::create_dir_all(&staged).expect("mkdir");
        std::fs::write(staged.join("abcd#1"), b"partial").expect("write");
        std::fs::write(staged.join("abcd#2"), b"in progress").expect("write");
        std::fs::write(staged.join("abcd"), b"whole").expect("write");
        let old = std::time::SystemTime::now()
            - STAGING_ABANDONED_AFTER
            - std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(staged.join("abcd#1"))
            .and_then(|f| f.set_modified(old))
            .expect("age the staging file");
        let b = open(&format!("file://{}", dir.path().display())).expect("open");
        assert!(matches!(b.kind, BackendKind::Local { .. }));
        assert!(
            !staged.join("abcd#1").exists(),
            "abandoned staging file removed"
        );
        assert!(
            staged.join("abcd#2").exists(),
            "a young staging file may belong to a live writer"
        );
        assert!(staged.join("abcd").exists());
    }
}
