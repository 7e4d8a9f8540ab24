//! Parts of objects a chain's restore read without their names, kept on
//! the tier's disk until the fill completes them.
//!
//! A chain's first restore pass is *deferred*: it reads each link's
//! extents only where it needs bytes, and checks them by the result's
//! digest, not by the extents' names (`restore/compose.rs`). Those parts
//! cannot go into the tier as they are (a tier object is whole, and named
//! by its bytes), but they need not be downloaded again either: the
//! restore's tap writes each part it is offered here, at its offset in a
//! slot of the object's size, and the fill reads the slot back, downloads
//! only the ranges the restore did not read, and checks the **whole**
//! object against its name before the tier holds it (`copy.rs`). A part
//! that was wrong (the origin lied, a bit flipped on the way) fails that
//! check, and the object is downloaded whole: a kept part is never trusted,
//! only used.
//!
//! **Where and how much.** One anonymous file per restore in the tier's
//! directory (no name: nothing is left behind by a crash, and the space is
//! returned when the restore's fill ends), sparse: it holds the bytes the
//! restore read, at most the tier's budget (a root larger than that could
//! not be filled anyway). An object whose slot does not fit is not kept.
//! A part is written by a thread of the restore's tap (`tap.rs`), so the
//! restore never waits for the disk; on its way it holds its bytes of the
//! fill buffer. Once written it costs no memory until the fill reads the
//! object back into one buffer under the fill's own permits.
//!
//! Must never hand out a part as checked, or block the restore for more
//! than a local write.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::sync::Mutex;

use object_store::path::Path;

use super::state::lock;

/// The kept parts of the objects of one restore.
pub(crate) struct Staging {
    /// The anonymous, sparse file the parts are in.
    file: File,
    /// The most bytes of slots it may hold.
    limit: u64,
    /// Where each object's slot is, and what it holds.
    slots: Mutex<Slots>,
}

/// The slots of a [`Staging`].
#[derive(Default)]
struct Slots {
    /// The file offset of the next slot.
    next: u64,
    /// The slot of each object kept, by key.
    of: HashMap<Path, Slot>,
    /// Set once a write failed: nothing more is kept.
    failed: bool,
}

/// One object's slot: its offset in the file, the object's stored length,
/// and the ranges of the object written into it.
struct Slot {
    at: u64,
    len: u64,
    have: Vec<Range<u64>>,
}

/// An object's kept parts, read back: a buffer of the object's stored
/// length holding them, the ranges it still lacks, and how many bytes it
/// holds.
pub(crate) struct Part {
    /// The object's bytes where kept, zero elsewhere.
    pub(crate) buf: Vec<u8>,
    /// The ranges of the object not kept (to download), in order.
    pub(crate) missing: Vec<Range<u64>>,
    /// The bytes kept.
    pub(crate) kept: u64,
}

impl Staging {
    /// An empty staging file in `dir`, holding at most `limit` bytes of
    /// slots.
    pub(crate) fn new(dir: &std::path::Path, limit: u64) -> std::io::Result<Self> {
        Ok(Staging {
            file: tempfile::tempfile_in(dir)?,
            limit,
            slots: Mutex::new(Slots::default()),
        })
    }

    /// Keeps `bytes`, found at stored offset `at` of the object at `key`
    /// (`len` stored bytes). Dropped if they do not lie inside the object,
    /// the object's slot does not fit, or the file failed a write before.
    pub(crate) fn keep(&self, key: &Path, len: u64, at: u64, bytes: &[u8]) {
        let end = at.saturating_add(bytes.len() as u64);
        if bytes.is_empty() || end > len {
            return;
        }
        let slot_at = {
            let mut slots = lock(&self.slots);
            if slots.failed {
                return;
            }
            match slots.of.get(key) {
                Some(s) if s.len == len => s.at,
                Some(_) => return,
                None => {
                    let at = slots.next;
                    if at.saturating_add(len) > self.limit {
                        return;
                    }
                    slots.next = at + len;
                    slots.of.insert(
                        key.clone(),
                        Slot {
                            at,
                            len,
                            have: Vec::new(),
                        },
                    );
                    at
                }
            }
        };
        let wrote = write_at(&self.file, bytes, slot_at + at);
        let mut slots = lock(&self.slots);
        match wrote {
            Ok(()) => {
                if let Some(s) = slots.of.get_mut(key) {
                    s.have.push(at..end);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the tier's staging file failed a write: parts no longer kept");
                slots.failed = true;
                slots.of.clear();
            }
        }
    }

    /// The kept parts of the object at `key` (`len` stored bytes), taken
    /// out (a second call finds nothing); `None` if none were kept. Reads
    /// the file: blocking.
    pub(crate) fn take(&self, key: &Path, len: u64) -> Option<Part> {
        let slot = lock(&self.slots).of.remove(key)?;
        if slot.len != len {
            return None;
        }
        let have = merged(slot.have);
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        let (mut missing, mut from, mut kept) = (Vec::new(), 0u64, 0u64);
        for r in &have {
            if r.start > from {
                missing.push(from..r.start);
            }
            let dst = buf.get_mut(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)?;
            if let Err(e) = read_at(&self.file, dst, slot.at + r.start) {
                tracing::debug!(error = %e, "the tier's staging file failed a read");
                return None;
            }
            kept += r.end - r.start;
            from = r.end;
        }
        if from < len {
            missing.push(from..len);
        }
        Some(Part { buf, missing, kept })
    }
}

/// `ranges` sorted and merged where they touch or overlap.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(unix)]
fn write_at(f: &File, bytes: &[u8], pos: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, bytes, pos)
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, pos)
}

#[cfg(not(unix))]
fn write_at(_: &File, _: &[u8], _: u64) -> std::io::Result<()> {
    Err(std::io::Error::other("no positioned writes here"))
}

#[cfg(not(unix))]
fn read_at(_: &File, _: &mut [u8], _: u64) -> std::io::Result<()> {
    Err(std::io::Error::other("no positioned reads here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_come_back_where_they_were_kept_and_the_rest_is_missing() {
        let dir = tempfile::tempdir().expect("dir");
        let s = Staging::new(dir.path(), 1 << 20).expect("staging");
        let (a, b) = (Path::from("objects/a"), Path::from("objects/b"));
        s.keep(&a, 100, 10, &[1; 20]);
        s.keep(&a, 100, 25, &[2; 15]);
        s.keep(&a, 100, 90, &[3; 10]);
        s.keep(&b, 50, 0, &[4; 50]);
        // Outside the object, or another length: dropped.
        s.keep(&a, 100, 95, &[9; 10]);
        s.keep(&a, 99, 0, &[9; 5]);
        let p = s.take(&a, 100).expect("a kept");
        assert_eq!(p.missing, vec![0..10, 40..90]);
        assert_eq!(p.kept, 40);
        assert_eq!(&p.buf[10..25], &[1; 15]);
        assert_eq!(&p.buf[25..40], &[2; 15]);
        assert_eq!(&p.buf[90..], &[3; 10]);
        assert!(s.take(&a, 100).is_none(), "taken once");
        let p = s.take(&b, 50).expect("b kept");
        assert!(p.missing.is_empty());
        assert_eq!(p.buf, vec![4; 50]);
    }

    #[test]
    fn an_object_whose_slot_does_not_fit_is_not_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let s = Staging::new(dir.path(), 150).expect("staging");
        s.keep(&Path::from("a"), 100, 0, &[1; 10]);
        s.keep(&Path::from("b"), 100, 0, &[1; 10]);
        assert!(s.take(&Path::from("a"), 100).is_some());
        assert!(s.take(&Path::from("b"), 100).is_none());
    }

    #[test]
    fn the_staging_file_has_no_name() {
        let dir = tempfile::tempdir().expect("dir");
        let s = Staging::new(dir.path(), 1 << 20).expect("staging");
        s.keep(&Path::from("a"), 10, 0, &[1; 10]);
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(names.is_empty(), "{names:?}");
    }
}
