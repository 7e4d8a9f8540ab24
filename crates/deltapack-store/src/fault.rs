//! What can be wrong with one object, typed.
//!
//! Every path that reads objects — the flat and composed restores, the v1
//! compatibility reader and the sweep — reports a failed read as an
//! [`ObjectFault`]: which key, and whether the object is *missing*, its
//! bytes are *corrupt* (wrong size or digest), the restore's *deadline*
//! passed, or the backend failed (*I/O*: not the object's fault, never a
//! reason to quarantine). Callers decide on the kind, never on the text:
//! only a `Corrupt` fault seen twice on the same key is proof enough to
//! quarantine (docs/design.md §5, the quarantine rule).

use object_store::path::Path;

use crate::error::{MissReason, StoreError};
use crate::keys::ObjectKey;
use crate::object_check::ObjectCheck;

/// What went wrong with one object.
#[derive(Debug)]
pub(crate) enum FaultKind {
    /// The object does not exist.
    Missing,
    /// The object exists but its bytes are wrong (or unreadable at rest).
    Corrupt,
    /// The restore's deadline passed.
    Deadline,
    /// The backend failed (network, permissions): not the object's fault.
    Io(Box<StoreError>),
}

/// Why a reassembly failed: the object key to blame (if any), and what
/// was wrong.
#[derive(Debug)]
pub(crate) struct ObjectFault {
    pub(crate) key: Option<Path>,
    pub(crate) kind: FaultKind,
    pub(crate) what: String,
    /// The damage lies in a base of the root being restored (a lower link
    /// of its chain): the miss is `base-missing`, not `corrupt`.
    pub(crate) in_base: bool,
    /// For a wrong name: what the bytes read hash to. Two reads that saw
    /// *different* wrong bytes were damaged in transit at least once, so
    /// they prove nothing about the bytes at rest (see [`Proof`]).
    pub(crate) found: Option<deltapack_format::Digest>,
    /// The check the object failed, typed (when one did).
    pub(crate) check: Option<Box<ObjectCheck>>,
}

impl ObjectFault {
    /// A fault blamed on no particular object (an inconsistent plan, a
    /// result that does not verify as a whole): a corrupt miss, nothing to
    /// quarantine.
    pub(crate) fn plain(what: impl Into<String>) -> Self {
        ObjectFault {
            key: None,
            kind: FaultKind::Corrupt,
            what: what.into(),
            in_base: false,
            found: None,
            check: None,
        }
    }

    /// A fault of the object at `key`.
    pub(crate) fn of(key: &Path, kind: FaultKind, what: impl std::fmt::Display) -> Self {
        ObjectFault {
            key: Some(key.clone()),
            kind,
            what: format!("{key}: {what}"),
            in_base: false,
            found: None,
            check: None,
        }
    }

    /// The object at `key` failed `check` (missing or corrupt by its kind).
    pub(crate) fn failed(key: &Path, check: ObjectCheck) -> Self {
        ObjectFault::of(key, check.kind(), &check).with_check(check)
    }

    /// This fault, naming the check the object failed (its words stay).
    pub(crate) fn with_check(mut self, check: ObjectCheck) -> Self {
        if let ObjectCheck::Name { found, .. } = &check {
            self.found = Some(*found);
        }
        self.check = Some(Box::new(check));
        self
    }

    /// The miss this fault is for the caller: `base-missing` when it lies
    /// in a base, else `corrupt`; either names the object and the check.
    pub(crate) fn miss(&self) -> MissReason {
        let object = self.key.as_ref().and_then(ObjectKey::from_path);
        if self.in_base {
            MissReason::BaseMissing {
                object,
                detail: self.what.clone(),
            }
        } else {
            MissReason::corrupt(object, self.check.as_deref().cloned(), self.what.clone())
        }
    }

    /// A failed backend call: a missing object, or the backend's own
    /// failure (not the object's fault).
    pub(crate) fn backend(key: &Path, x: object_store::Error) -> Self {
        match x {
            object_store::Error::NotFound { .. } => ObjectFault::failed(key, ObjectCheck::Missing),
            x => {
                let what = x.to_string();
                ObjectFault::of(key, FaultKind::Io(Box::new(StoreError::io(key, x))), what)
            }
        }
    }

    /// The restore's deadline passed.
    pub(crate) fn deadline() -> Self {
        ObjectFault {
            key: None,
            kind: FaultKind::Deadline,
            what: "deadline exceeded".into(),
            in_base: false,
            found: None,
            check: None,
        }
    }

    /// A failed local or remote read of `key`: the backend's (or the media's)
    /// failure, not evidence about the object's bytes.
    pub(crate) fn io(key: &Path, op: &str, err: std::io::Error) -> Self {
        let what = format!("{op}: {err}");
        ObjectFault::of(
            key,
            FaultKind::Io(Box::new(StoreError::local_io(key, err))),
            what,
        )
    }

    /// Separates a backend failure (an error for the caller) from a fault
    /// of the object itself (missing, corrupt, deadline).
    pub(crate) fn into_error(self) -> Result<Self, StoreError> {
        match self.kind {
            FaultKind::Io(e) => Err(*e),
            _ => Ok(self),
        }
    }
}

impl ObjectCheck {
    /// The fault kind of this failure: the object's absence, or damage.
    pub(crate) fn kind(&self) -> FaultKind {
        match self {
            ObjectCheck::Missing => FaultKind::Missing,
            _ => FaultKind::Corrupt,
        }
    }
}

/// Most reads of one object (or passes of one restore) before giving up.
pub(crate) const MAX_READS: u32 = 3;

/// The quarantine rule applied to a run of reads of one object (or passes
/// of one restore): corruption is *proven* only when the same object fails
/// its check on two consecutive reads (passes) — and, where both reads
/// say what their bytes hashed to, with the same wrong bytes. Anything in
/// between — an error, or a pass that failed elsewhere (which may have
/// read the object cleanly) — starts the count again, and so do two reads
/// that saw different wrong bytes (an extent read as many ranges can meet
/// damage in transit on one range of one read and another range of the
/// next: bytes at rest read the same every time). A transient error, or a
/// single bad read among others, proves nothing, and its fault comes back
/// without a key to quarantine.
#[derive(Debug, Default)]
pub(crate) struct Proof {
    reads: u32,
    /// The object seen corrupt, how many times in a row, and what its bytes
    /// hashed to the last time.
    corrupt: Option<(Path, u32, Option<deltapack_format::Digest>)>,
    /// The last backend failure seen (reported if nothing is proven).
    io: Option<ObjectFault>,
}

impl Proof {
    /// Records a failed read. `None`: read again. `Some(fault)`: stop and
    /// report this fault — keyed `Corrupt` only if corruption is proven.
    pub(crate) fn record(&mut self, f: ObjectFault) -> Option<ObjectFault> {
        self.reads += 1;
        match (&f.kind, &f.key) {
            (FaultKind::Missing | FaultKind::Deadline, _) | (FaultKind::Corrupt, None) => {
                return Some(f)
            }
            (FaultKind::Corrupt, Some(k)) => {
                let n = match &self.corrupt {
                    Some((seen, n, found))
                        if seen == k
                            && (found.is_none() || f.found.is_none() || *found == f.found) =>
                    {
                        n + 1
                    }
                    _ => 1,
                };
                if n >= 2 {
                    return Some(f);
                }
                self.corrupt = Some((k.clone(), n, f.found));
                if self.reads >= MAX_READS {
                    return Some(self.unproven(f));
                }
            }
            (FaultKind::Io(_), _) => {
                self.corrupt = None;
                if self.reads >= MAX_READS {
                    return Some(f);
                }
                self.io = Some(f);
            }
        }
        None
    }

    /// A corrupt read that was never confirmed: the backend's failure if
    /// there was one (an error), else a corrupt miss naming no object.
    fn unproven(&mut self, mut f: ObjectFault) -> ObjectFault {
        if let Some(io) = self.io.take() {
            return io;
        }
        f.key = None;
        f
    }
}

/// What the workers of one pass found wrong, shared between them.
#[derive(Default)]
pub(crate) struct PassFailures {
    failed: std::sync::atomic::AtomicBool,
    found: std::sync::Mutex<Vec<ObjectFault>>,
}

impl PassFailures {
    /// Whether a worker failed already (the pass is a miss either way).
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records `d`, found reading a base when `in_base`; a deadline or an
    /// I/O error also stops the pass (`next`, the workers' shared item
    /// counter, jumps to `end`).
    pub(crate) fn record(
        &self,
        mut d: ObjectFault,
        in_base: bool,
        next: &std::sync::atomic::AtomicUsize,
        end: usize,
    ) {
        use std::sync::atomic::Ordering;
        d.in_base = in_base;
        let stop = matches!(d.kind, FaultKind::Deadline | FaultKind::Io(_));
        if let Ok(mut f) = self.found.lock() {
            f.push(d);
        }
        self.failed.store(true, Ordering::Relaxed);
        if stop {
            next.store(end, Ordering::Relaxed);
        }
    }

    /// The fault the pass reports: damage to a base first (so that it is
    /// reported as `base-missing` whichever worker found what first), then
    /// the first found.
    pub(crate) fn first(self) -> Option<ObjectFault> {
        let mut found = self.found.into_inner().unwrap_or_default();
        match found.iter().position(|d| d.in_base) {
            Some(i) => Some(found.swap_remove(i)),
            None if found.is_empty() => None,
            None => Some(found.swap_remove(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt(k: &str) -> ObjectFault {
        ObjectFault::of(&Path::from(k), FaultKind::Corrupt, "digest mismatch")
    }

    fn io(k: &str) -> ObjectFault {
        ObjectFault::io(&Path::from(k), "read", std::io::Error::other("EIO"))
    }

    fn is_quarantinable(f: &ObjectFault) -> bool {
        matches!(f.kind, FaultKind::Corrupt) && f.key.is_some()
    }

    #[test]
    fn corruption_needs_two_bad_reads_of_the_same_object() {
        let mut p = Proof::default();
        assert!(p.record(corrupt("a")).is_none());
        let f = p.record(corrupt("a")).expect("proven");
        assert!(is_quarantinable(&f));

        // An error then a bad read: unproven, read a third time.
        let mut p = Proof::default();
        assert!(p.record(io("a")).is_none());
        assert!(p.record(corrupt("a")).is_none());
        let f = p.record(io("a")).expect("gave up");
        assert!(
            matches!(f.kind, FaultKind::Io(_)),
            "an error, never a quarantine"
        );

        let mut p = Proof::default();
        assert!(p.record(io("a")).is_none());
        assert!(p.record(io("a")).is_none());
        let f = p.record(corrupt("a")).expect("gave up");
        assert!(!is_quarantinable(&f), "one bad read proves nothing");

        // A bad read, an error, a bad read: not consecutive, not proof.
        let mut p = Proof::default();
        assert!(p.record(corrupt("a")).is_none());
        assert!(p.record(io("a")).is_none());
        let f = p.record(corrupt("a")).expect("gave up");
        assert!(
            !is_quarantinable(&f),
            "the failed read in between may hide a clean one"
        );

        // Two different objects bad once each prove nothing either.
        let mut p = Proof::default();
        assert!(p.record(corrupt("a")).is_none());
        assert!(p.record(corrupt("b")).is_none());
        let f = p.record(corrupt("c")).expect("gave up");
        assert!(!is_quarantinable(&f));

        // The same object wrong twice, but with different wrong bytes: at
        // least one read was damaged in transit, so nothing is proven.
        let wrong = |k: &str, found: &[u8]| {
            let mut f = corrupt(k);
            f.found = Some(deltapack_format::Digest::blake3(found));
            f
        };
        let mut p = Proof::default();
        assert!(p.record(wrong("a", b"x")).is_none());
        assert!(p.record(wrong("a", b"y")).is_none());
        let f = p.record(io("a")).expect("gave up");
        assert!(!is_quarantinable(&f), "different wrong bytes prove nothing");
        let mut p = Proof::default();
        assert!(p.record(wrong("a", b"x")).is_none());
        assert!(p.record(wrong("a", b"y")).is_none());
        let f = p.record(wrong("a", b"y")).expect("proven");
        assert!(is_quarantinable(&f), "the same wrong bytes twice in a row");

        // Missing and deadline stop at once.
        let mut p = Proof::default();
        let m = ObjectFault::of(&Path::from("a"), FaultKind::Missing, "missing");
        assert!(matches!(
            p.record(m).map(|f| f.kind),
            Some(FaultKind::Missing)
        ));
    }
}
