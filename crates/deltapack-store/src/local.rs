//! The local-disk backend: `object_store`'s `LocalFileSystem` with one
//! change — durable creates (`PutMode::Create`, the only way deltapack
//! writes objects and roots) go through `create_direct`, which writes with
//! direct I/O.
//!
//! Why: a buffered write copies every byte into freshly allocated
//! page-cache pages. On the reference VM that copy
//! (`copy_folio_from_iter_atomic`) ran at 0.3–1.5 GB/s depending on how
//! recently the guest had used those pages, and was half of a publication's
//! CPU time; a 1.58 GB delta took 3.9–5.7 s to publish through
//! `LocalFileSystem`, 1.0–1.2 s through this path. Direct writes skip the
//! copy (the bytes go to the device from 32 MiB aligned bounce buffers that
//! stay resident and are reused, one filled while the other is written)
//! and do not fill the page cache with bytes the writer does not need again.
//!
//! Everything else (reads, lists, deletes, copies, overwrites) is the inner
//! `LocalFileSystem`'s. Being an `ObjectStore`, the whole backend can still
//! be wrapped (fault injection in the tests intercepts these writes like
//! any other). Filesystems without `O_DIRECT` (some tmpfs) and non-Linux
//! systems get buffered writes through the same protocol.

use std::path::{Path as FsPath, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
    Result as OsResult,
};

/// `LocalFileSystem` (with fsync) whose durable creates use direct I/O.
#[derive(Debug)]
pub(crate) struct DirectLocal {
    inner: LocalFileSystem,
    root: PathBuf,
}

impl DirectLocal {
    /// Wraps `inner`, which must be rooted at `root` (canonical).
    pub(crate) fn new(inner: LocalFileSystem, root: PathBuf) -> Self {
        DirectLocal { inner, root }
    }
}

impl std::fmt::Display for DirectLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DirectLocal({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for DirectLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        if !cfg!(target_os = "linux")
            || !matches!(opts.mode, PutMode::Create)
            || !opts.attributes.is_empty()
        {
            return self.inner.put_opts(location, payload, opts).await;
        }
        #[cfg(target_os = "linux")]
        {
            let (root, key) = (self.root.clone(), location.clone());
            let created = tokio::task::spawn_blocking(move || {
                let parts: Vec<Bytes> = payload.iter().cloned().collect();
                create_direct(&root, &key, &parts)
            })
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "DirectLocal",
                source: Box::new(e),
            })?;
            match created {
                Ok(true) => Ok(PutResult {
                    e_tag: None,
                    version: None,
                    extensions: Default::default(),
                }),
                Ok(false) => Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "the key exists".into(),
                }),
                // The io::Error stays the source, so a full disk is still
                // recognised (`backend::is_storage_full`).
                Err(e) => Err(object_store::Error::Generic {
                    store: "DirectLocal",
                    source: Box::new(e),
                }),
            }
        }
        #[cfg(not(target_os = "linux"))]
        unreachable!("non-Linux creates are delegated above")
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> OsResult<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> OsResult<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, OsResult<Path>>,
    ) -> BoxStream<'static, OsResult<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> OsResult<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> OsResult<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> OsResult<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// Alignment (and size granularity) of direct I/O.
#[cfg(target_os = "linux")]
const DIRECT_ALIGN: usize = 4096;

/// Size of one bounce buffer of a direct-I/O write (a write holds two).
pub(crate) const BOUNCE: usize = 32 << 20;

/// Idle bounce buffers, reused across writes (each write takes up to two:
/// one is filled while the other is written). Reuse matters: fresh buffers
/// would pay a page fault per 4 KiB on every write. At most [`POOL_KEEP`]
/// are kept (128 MiB: two concurrent writes' worth).
#[cfg(target_os = "linux")]
static POOL: std::sync::Mutex<Vec<AlignedBuf>> = std::sync::Mutex::new(Vec::new());

/// Most idle buffers kept in [`POOL`].
#[cfg(target_os = "linux")]
const POOL_KEEP: usize = 4;

/// A bounce buffer of at least `len` bytes: an idle one from the pool, or a
/// new one of exactly `len` (a small write in a fresh process then faults
/// in what it uses, not [`BOUNCE`]: a 4 MiB turn's object paid for two
/// zeroed 32 MiB buffers, ~50 ms, before this).
#[cfg(target_os = "linux")]
fn take_buffer(len: usize) -> std::io::Result<AlignedBuf> {
    let pooled = POOL.lock().ok().and_then(|mut p| {
        let i = p.iter().position(|b| b.len >= len)?;
        Some(p.swap_remove(i))
    });
    match pooled {
        Some(b) => Ok(b),
        None => AlignedBuf::new(len),
    }
}

/// Returns an idle buffer to the pool; when the pool is full, it replaces
/// the smallest idle buffer if it is larger (so large writes keep finding
/// large buffers).
#[cfg(target_os = "linux")]
fn give_back(b: AlignedBuf) {
    if let Ok(mut p) = POOL.lock() {
        if p.len() < POOL_KEEP {
            p.push(b);
        } else if let Some(small) = p.iter_mut().min_by_key(|x| x.len) {
            if small.len < b.len {
                *small = b;
            }
        }
    }
}

/// A buffer aligned for direct I/O: an anonymous private mapping, so it is
/// page-aligned and zero without being written (the kernel maps zero pages
/// as they are first touched — by the copy that fills it). A zeroed heap
/// allocation of this alignment is `memset` first, which faulted in every
/// page once for the zeroing and then wrote it again: a fresh process's
/// first write of a 15 MB turn spent ~7 ms there. No `MADV_HUGEPAGE`: where
/// transparent huge pages are on for every mapping the kernel uses them
/// anyway, and asking for them where they are "madvise only" can make the
/// first touch stall in memory compaction, a worse trade for a publication.
#[cfg(target_os = "linux")]
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an `AlignedBuf` owns its allocation exclusively (like a
// `Box<[u8]>`); moving it to another thread moves that ownership.
#[cfg(target_os = "linux")]
unsafe impl Send for AlignedBuf {}

#[cfg(target_os = "linux")]
impl AlignedBuf {
    fn new(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::other("an empty direct-I/O buffer"));
        }
        // SAFETY: a fresh anonymous private mapping: no file, no address
        // hint, checked for failure below; nothing else refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        std::ptr::NonNull::new(ptr.cast::<u8>())
            .map(|ptr| AlignedBuf { ptr, len })
            .ok_or_else(|| std::io::Error::other("cannot allocate a direct-I/O buffer"))
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialised bytes (an anonymous
        // mapping reads as zeros until written) owned by this value, and
        // `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(target_os = "linux")]
impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with exactly this length, owned only by
        // this value, and never used after this.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Durable create-if-absent of `key` under `root` from `parts` (blocking).
/// `Ok(true)`: created and durable; `Ok(false)`: something already exists
/// under the key (nothing was written).
///
/// Same protocol and staging names (`<key>#<n>`) as `LocalFileSystem`:
/// create a staging file next to the key, write, `fsync`, hard-link it to
/// the key (atomic create-if-absent), `fsync` the directory, remove the
/// staging name. The bytes go through 32 MiB aligned bounce buffers with
/// `O_DIRECT` where the filesystem supports it (the last partial block is
/// written normally).
#[cfg(target_os = "linux")]
pub(crate) fn create_direct(root: &FsPath, key: &Path, parts: &[Bytes]) -> std::io::Result<bool> {
    create_direct_with(root, key, parts, &|| {})
}

/// [`create_direct`] with a hook run between the directory check and the
/// staging file's creation: the window in which another process's cleanup
/// can remove the directory (tests put that removal there).
#[cfg(target_os = "linux")]
fn create_direct_with(
    root: &FsPath,
    key: &Path,
    parts: &[Bytes],
    between: &dyn Fn(),
) -> std::io::Result<bool> {
    let dest = root.join(key.as_ref());
    let dir = dest
        .parent()
        .ok_or_else(|| std::io::Error::other(format!("object key {key} has no directory")))?;
    // The fan-out directory can vanish at any moment: a delete elsewhere
    // removes empty directories (automatic cleanup), possibly between our
    // check and our create. A create that finds its directory gone makes
    // it again and retries; a directory that keeps vanishing is an error.
    let mut attempts = 0;
    loop {
        match create_once(root, dir, &dest, parts, between) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 16 => {
                attempts += 1;
                tracing::debug!(%key, attempts, "directory vanished during a create; retrying");
            }
            other => return other,
        }
    }
}

#[cfg(target_os = "linux")]
fn create_once(
    root: &FsPath,
    dir: &FsPath,
    dest: &FsPath,
    parts: &[Bytes],
    between: &dyn Fn(),
) -> std::io::Result<bool> {
    if dest.exists() {
        make_durable(dest, dir)?;
        return Ok(false);
    }
    if !dir.is_dir() {
        create_dirs_durably(root, dir)?;
    }
    between();
    let (file, staging) = create_staging(dest)?;
    let written = write_parts(file, &staging, parts).and_then(|f| {
        f.sync_all()?;
        drop(f);
        Ok(())
    });
    let linked = written.and_then(|()| std::fs::hard_link(&staging, dest));
    let _ = std::fs::remove_file(&staging);
    match linked {
        Ok(()) => {
            std::fs::File::open(dir)?.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            make_durable(dest, dir)?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Makes an object another writer created durable before this publication
/// relies on it: that writer may have linked it and not yet synced the
/// directory (or crashed before it did), and a root must never outlive an
/// object it names. Cheap next to a write: the file's data is already on
/// its way, and syncing clean pages costs nothing.
#[cfg(target_os = "linux")]
fn make_durable(dest: &FsPath, dir: &FsPath) -> std::io::Result<()> {
    std::fs::File::open(dest)?.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `dir` (under `root`) and fsyncs every directory whose entries
/// changed.
#[cfg(target_os = "linux")]
fn create_dirs_durably(root: &FsPath, dir: &FsPath) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = dir;
    while !cur.is_dir() && cur.starts_with(root) {
        missing.push(cur.to_path_buf());
        match cur.parent() {
            Some(p) => cur = p,
            None => break,
        }
    }
    std::fs::create_dir_all(dir)?;
    for d in missing.iter().rev() {
        if let Some(p) = d.parent() {
            std::fs::File::open(p)?.sync_all()?;
        }
    }
    Ok(())
}

/// Opens a new staging file `<dest>#<n>`, with `O_DIRECT` if possible.
#[cfg(target_os = "linux")]
fn create_staging(dest: &FsPath) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut n = 1u32;
    loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let path = PathBuf::from(name);
        let open = |flags: i32| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(flags)
                .open(&path)
        };
        let r = match open(libc::O_DIRECT) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
            other => other,
        };
        match r {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `parts` into the staging file; returns the file (reopened
/// without `O_DIRECT` if its tail needed a buffered write).
#[cfg(target_os = "linux")]
fn write_parts(
    file: std::fs::File,
    path: &FsPath,
    parts: &[Bytes],
) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::FileExt;
    // SAFETY: F_GETFL on an open descriptor has no preconditions.
    let flags = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_GETFL) };
    if flags < 0 || flags & libc::O_DIRECT == 0 {
        let mut pos = 0u64;
        for p in parts {
            file.write_all_at(p, pos)?;
            pos += p.len() as u64;
        }
        return Ok(file);
    }
    // One part already aligned for direct I/O (a staged object,
    // `publish/staging.rs`): written as it is, with no bounce copy.
    if let [p] = parts {
        if p.as_ptr() as usize % DIRECT_ALIGN == 0 {
            let aligned = p.len() - p.len() % DIRECT_ALIGN;
            if aligned > 0 {
                file.write_all_at(&p[..aligned], 0)?;
            }
            if aligned == p.len() {
                return Ok(file);
            }
            // The last partial block: buffered, through a descriptor
            // without O_DIRECT.
            let tail = std::fs::OpenOptions::new().write(true).open(path)?;
            tail.write_all_at(&p[aligned..], aligned as u64)?;
            return Ok(tail);
        }
    }
    // Double buffering: this thread copies the parts into one aligned
    // buffer while a writer thread writes the previous one, so the copy
    // overlaps the device. Buffers of `cap` bytes: `BOUNCE`; a write
    // smaller than that goes through one buffer with room to spare (`cap`
    // above `total`, so it never fills and never waits for a second one).
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let cap = BOUNCE.min((total / DIRECT_ALIGN + 1) * DIRECT_ALIGN);
    let mut bufs = if total >= cap {
        vec![take_buffer(cap)?, take_buffer(cap)?]
    } else {
        vec![take_buffer(cap)?]
    };
    let result = std::thread::scope(|s| -> std::io::Result<std::fs::File> {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(AlignedBuf, u64)>(1);
        let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<AlignedBuf>(2);
        let file_ref = &file;
        let writer = s.spawn(move || -> std::io::Result<()> {
            for (mut buf, pos) in full_rx {
                file_ref.write_all_at(&buf.as_mut_slice()[..cap], pos)?;
                if empty_tx.send(buf).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let mut cur = bufs
            .pop()
            .ok_or_else(|| std::io::Error::other("no bounce buffer"))?;
        let mut spare = bufs.pop();
        let mut pos = 0u64;
        let mut fill = 0usize;
        let mut failed = false;
        'parts: for p in parts {
            let mut src: &[u8] = p;
            while !src.is_empty() {
                let room = cap - fill;
                let k = src.len().min(room);
                cur.as_mut_slice()[fill..fill + k].copy_from_slice(&src[..k]);
                fill += k;
                src = &src[k..];
                if fill == cap {
                    let next = match spare.take() {
                        Some(b) => b,
                        None => match empty_rx.recv() {
                            Ok(b) => b,
                            Err(_) => {
                                failed = true;
                                break 'parts;
                            }
                        },
                    };
                    let done = std::mem::replace(&mut cur, next);
                    if full_tx.send((done, pos)).is_err() {
                        failed = true;
                        break 'parts;
                    }
                    pos += cap as u64;
                    fill = 0;
                }
            }
        }
        drop(full_tx);
        let written = writer
            .join()
            .map_err(|_| std::io::Error::other("direct-I/O writer panicked"))?;
        written?;
        if failed {
            return Err(std::io::Error::other("direct-I/O writer stopped"));
        }
        // Buffers the writer finished with go back to the pool.
        while let Ok(b) = empty_rx.try_recv() {
            give_back(b);
        }
        if let Some(b) = spare {
            give_back(b);
        }
        let aligned = fill - fill % DIRECT_ALIGN;
        if aligned > 0 {
            file.write_all_at(&cur.as_mut_slice()[..aligned], pos)?;
        }
        let out = if aligned == fill {
            file.try_clone()
        } else {
            // The last partial block: buffered, through a descriptor
            // without O_DIRECT.
            let tail = std::fs::OpenOptions::new().write(true).open(path)?;
            tail.write_all_at(&cur.as_mut_slice()[aligned..fill], pos + aligned as u64)?;
            Ok(tail)
        };
        give_back(cur);
        out
    });
    result
}

/// The store's root lock: an exclusive `flock` on
/// `<root>/ledger/roots.lock`, held while this guard lives. Every process
/// of a local store takes it to create, delete, replace or quarantine a
/// root object, so "check the root (and what it needs), then act on it" is
/// atomic against any other root change, in this process or another.
/// Independent of the ledger database, so it can be taken while the ledger
/// itself is being opened or rebuilt. Not reentrant: a holder must not
/// take it again (`flock` locks of two open files conflict even within one
/// process) — in particular it must not open the ledger for the first time
/// while holding it (opening may rebuild the ledger, which takes the lock).
#[derive(Debug)]
pub(crate) struct RootLock {
    _file: std::fs::File,
}

impl RootLock {
    /// Blocks until the lock is held.
    pub(crate) fn acquire(root: &FsPath) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let dir = root.join("ledger");
        std::fs::create_dir_all(&dir)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("roots.lock"))?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                // Released when the file is closed (the guard dropped).
                return Ok(RootLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// What a conditional root replacement found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replaced {
    /// The key held the expected bytes and now holds the new ones.
    Yes,
    /// The key was absent or held other bytes; nothing was written.
    Changed,
}

/// Replaces the object at `key` with `new` only if it currently holds
/// exactly `expected`: read and compare, write a staging file next to it,
/// `fsync`, rename over the key (atomic), `fsync` the directory. The caller
/// holds the store's root lock ([`RootLock`]), which
/// every deletion of a root also takes, so nothing can remove or replace
/// the key between the comparison and the rename.
pub(crate) fn replace_if_unchanged(
    root: &FsPath,
    key: &Path,
    expected: &[u8],
    new: &[u8],
) -> std::io::Result<Replaced> {
    use std::io::Write;
    let dest = root.join(key.as_ref());
    match std::fs::read(&dest) {
        Ok(cur) if cur == expected => {}
        Ok(_) => return Ok(Replaced::Changed),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replaced::Changed),
        Err(e) => return Err(e),
    }
    let dir = dest
        .parent()
        .ok_or_else(|| std::io::Error::other(format!("object key {key} has no directory")))?;
    let mut n = 1u32;
    let (mut file, staging) = loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let path = PathBuf::from(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => break (f, path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(new)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&staging, &dest));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&staging);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(Replaced::Yes)
}

/// Moves the object at `key` to `dest` (both under `root`) only if it
/// holds exactly `expected`: copy (synced), then a durable delete. Run
/// under the store's root lock (see [`replace_if_unchanged`]). Returns whether
/// it moved the object.
pub(crate) fn quarantine_if_unchanged(
    root: &FsPath,
    key: &Path,
    dest: &Path,
    expected: &[u8],
) -> std::io::Result<bool> {
    let src = root.join(key.as_ref());
    match std::fs::read(&src) {
        Ok(cur) if cur == expected => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    let to = root.join(dest.as_ref());
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&to, expected)?;
    std::fs::File::open(&to)?.sync_all()?;
    delete_durably(root, key)?;
    Ok(true)
}

/// Reads the small file at `key` (a root) whole: `None` if it is absent;
/// an error if it cannot be read or holds more than `limit` bytes.
pub(crate) fn read_small(
    root: &FsPath,
    key: &Path,
    limit: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let f = match std::fs::File::open(root.join(key.as_ref())) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let too_large = |n: u64| std::io::Error::other(format!("{key} is {n} bytes, limit {limit}"));
    if len > limit {
        return Err(too_large(len));
    }
    let mut v = Vec::with_capacity(len as usize);
    f.take(limit + 1).read_to_end(&mut v)?;
    if v.len() as u64 > limit {
        return Err(too_large(v.len() as u64));
    }
    Ok(Some(v))
}

/// Deletes the object at `key` (absent is fine) and makes the deletion
/// durable (`fsync` of its directory): a root whose removal a crash could
/// undo would come back naming objects the collector has since deleted.
/// Roots are deleted this way under the store's root lock (see
/// [`replace_if_unchanged`]).
pub(crate) fn delete_durably(root: &FsPath, key: &Path) -> std::io::Result<()> {
    let dest = root.join(key.as_ref());
    match std::fs::remove_file(&dest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match dest.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new bounce buffer is aligned for direct I/O and reads as zeros
    /// (an anonymous mapping, never memset), small and huge-page sized.
    #[cfg(target_os = "linux")]
    #[test]
    fn new_buffers_are_aligned_and_zero() {
        for len in [DIRECT_ALIGN, 3 * DIRECT_ALIGN, 4 << 20] {
            let mut b = AlignedBuf::new(len).expect("buffer");
            assert_eq!(b.ptr.as_ptr() as usize % DIRECT_ALIGN, 0);
            let s = b.as_mut_slice();
            assert_eq!(s.len(), len);
            assert!(s.iter().all(|&x| x == 0));
            s[len - 1] = 7;
            assert_eq!(s[len - 1], 7);
        }
        assert!(AlignedBuf::new(0).is_err());
    }

    /// A create whose fan-out directory is removed (by another process's
    /// cleanup of empty directories) between its check and its create makes
    /// the directory again and lands; the old code failed with NotFound.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_create_survives_its_directory_vanishing() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        let key = Path::from(format!("objects/blake3/ab/ab{:062x}", 1));
        let dir = root.join("objects/blake3/ab");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let removals = std::cell::Cell::new(0);
        let vanish = || {
            if removals.get() < 3 {
                std::fs::remove_dir(&dir).expect("the directory is empty");
                removals.set(removals.get() + 1);
            }
        };
        let created = create_direct_with(root, &key, &[Bytes::from_static(b"bytes")], &vanish);
        assert!(matches!(created, Ok(true)), "{created:?}");
        assert_eq!(removals.get(), 3, "the directory vanished three times");
        assert_eq!(
            std::fs::read(root.join(key.as_ref())).expect("object"),
            b"bytes"
        );
        // A directory that never stays is an error, not a hang.
        let key2 = Path::from(format!("objects/blake3/cd/cd{:062x}", 2));
        let dir2 = root.join("objects/blake3/cd");
        let always = || {
            let _ = std::fs::remove_dir(&dir2);
        };
        let r = create_direct_with(root, &key2, &[Bytes::from_static(b"x")], &always);
        assert!(r.is_err(), "{r:?}");
    }

    /// The local write path: exact bytes from unaligned parts of awkward
    /// sizes (direct I/O blocks, bounce-buffer boundaries, a buffered tail),
    /// create-if-absent, directories created, no staging file left.
    #[cfg(target_os = "linux")]
    #[test]
    fn local_put_writes_exact_bytes_once() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path();
        let big: Vec<u8> = (0..(BOUNCE * 2 + 4096 * 3 + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let whole = Bytes::from(big);
        let cases: Vec<Vec<Bytes>> = vec![
            vec![],
            vec![whole.slice(1..2)],
            vec![whole.slice(3..4099)],
            vec![whole.slice(0..4096)],
            // Smaller than a bounce buffer: one buffer of the write's size
            // (exactly full; with a buffered tail).
            vec![whole.slice(0..4096 * 5)],
            vec![whole.slice(9..4096 * 3 + 14), whole.slice(20..30)],
            vec![whole.slice(5..BOUNCE + 5)],
            vec![whole.slice(0..BOUNCE - 1)],
            vec![
                whole.slice(7..1000),
                Bytes::new(),
                whole.slice(1000..BOUNCE + 4096 + 1),
                whole.slice(BOUNCE + 4096 + 1..whole.len()),
            ],
        ];
        for (i, parts) in cases.iter().enumerate() {
            let key = Path::from(format!("objects/blake3/{i:02x}/case{i}"));
            let want: Vec<u8> = parts.concat();
            assert!(create_direct(root, &key, parts).expect("put"), "created");
            let path = root.join(key.as_ref());
            assert_eq!(std::fs::read(&path).expect("read"), want, "case {i}");
            // Create-if-absent: other bytes under the same key change nothing.
            assert!(
                !create_direct(root, &key, &[Bytes::from_static(b"other")]).expect("put"),
                "exists"
            );
            assert_eq!(std::fs::read(&path).expect("read"), want, "case {i}");
            let leftovers: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
                .expect("ls")
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(crate::backend::is_staging_name)
                })
                .collect();
            assert!(leftovers.is_empty(), "case {i}: {leftovers:?}");
        }
    }
}
