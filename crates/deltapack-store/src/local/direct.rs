//! Direct-I/O creates of the local backend (`create_direct`): a new file
//! is written under a staging name from 32 MiB aligned bounce buffers (a
//! pool of them reused across writes, so a write does not fault in fresh
//! memory), made durable (fsync of the file, rename into place, fsync of
//! the directory) and only then visible under its key. An already
//! page-aligned single part (a staged extent) is written as it is, without
//! the bounce copy. See the parent module for why direct I/O.

use std::path::{Path as FsPath, PathBuf};

use bytes::Bytes;
use object_store::path::Path;

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
