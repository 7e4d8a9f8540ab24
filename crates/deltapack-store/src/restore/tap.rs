//! The restore's side of the fill from verified bytes: a [`Tap`] takes a
//! copy of each whole object a restore read and verified against its
//! name (the tier implements it, `tier/tap.rs`); `read.rs` makes the copy
//! as the bytes are placed.
//!
//! Parts of an object a chain's deferred pass read without its name are
//! offered too, marked as such ([`Tap::unverified`]; the sinks that offer
//! them are in `sink.rs`).
//!
//! Must never offer as verified bytes that were not checked by their
//! object's name.

use bytes::Bytes;
use object_store::path::Path;

/// A taker of whole objects a restore verified: the tier's fill
/// (`tier/tap.rs`) writes them into the tier as the restore goes, so that
/// the fill after a restore from the origin does not download them again.
///
/// Only a raw extent read whole through the verified path is offered: its
/// stored bytes are the bytes hashed into its name, so they are as
/// trustworthy as the restore's own. The parts of an extent read without
/// its name (a chain's deferred pass) are offered as such
/// ([`Tap::unverified`]).
pub(crate) trait Tap: Send + Sync {
    /// Room for a copy of the object at `key` (`len` stored bytes), or
    /// `None`: no room now, the object is not kept. Must not block.
    fn start(&self, key: &Path, len: u64) -> Option<Tapped>;
    /// The object at `key` verified against its name; `copy` holds its
    /// stored bytes. Must not block.
    fn verified(&self, key: &Path, copy: Tapped);
    /// `bytes` at stored offset `at` of the object at `key` (`len` stored
    /// bytes), read **without** checking the object's name (a chain's
    /// deferred pass reads its extents in parts). A taker may keep them to
    /// spare the fill their download, but must check the whole object
    /// against its name before it uses them. Must not block for long (a
    /// local write at most). By default, dropped.
    fn unverified(&self, key: &Path, len: u64, at: u64, bytes: Bytes) {
        let _ = (key, len, at, bytes);
    }
}

/// The copy of one object being read, and whatever the taker holds while
/// it lives (the permit that bounds the memory of copies).
pub(crate) struct Tapped {
    /// The object's stored bytes, placed as they arrive.
    pub(crate) buf: Vec<u8>,
    /// Held by the taker until the copy is dropped.
    pub(crate) hold: Box<dyn Send + Sync>,
}
