//! Where a restore's bytes go as they are read: the [`Sink`] every reader
//! places into, and the sinks that wrap another — [`HeaderCheck`] (the
//! delta header bytes compared as they pass), [`Tee`] (a copy of a whole
//! object for a tap) and [`Capture`] (parts offered to a tap unverified).
//!
//! Owns nothing but the forwarding: a wrapping sink must place every byte
//! in its inner sink, unchanged.

use bytes::Bytes;
use deltapack_format::scatter::Region;
use object_store::path::Path;

use super::tap::Tap;

/// Where the bytes of one extent go as they are read: a [`Region`] of the
/// result for a flat root, `compose::ItemSink` for a delta chain.
pub(crate) trait Sink {
    /// Places `bytes` found at payload offset `src` of the extent. Ranges
    /// of one extent may arrive in any order, each in order.
    fn place(&mut self, src: u64, bytes: &[u8]);
    /// [`Sink::place`] for bytes in a shared buffer (a body chunk), which
    /// a sink may keep a reference to instead of copying them.
    fn place_bytes(&mut self, src: u64, bytes: &Bytes) {
        self.place(src, bytes);
    }
}

impl Sink for Region<'_, '_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        Region::place(self, src, bytes);
    }
}

/// Forwards placed bytes and compares the ones that fall on `header` (the
/// delta header bytes a root recorded, from payload offset `at`).
pub(crate) struct HeaderCheck<'a, 's> {
    pub(crate) inner: &'a mut dyn Sink,
    pub(crate) header: &'s [u8],
    pub(crate) at: u64,
    pub(crate) differs: bool,
}

impl HeaderCheck<'_, '_> {
    /// Compares the bytes at `src` that fall on the header.
    fn check(&mut self, src: u64, bytes: &[u8]) {
        let (lo, hi) = (
            src.max(self.at),
            (src + bytes.len() as u64).min(self.at + self.header.len() as u64),
        );
        if lo < hi {
            let mine = &bytes[(lo - src) as usize..(hi - src) as usize];
            let theirs = &self.header[(lo - self.at) as usize..(hi - self.at) as usize];
            self.differs |= mine != theirs;
        }
    }
}

impl Sink for HeaderCheck<'_, '_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        self.check(src, bytes);
        self.inner.place(src, bytes);
    }

    fn place_bytes(&mut self, src: u64, bytes: &Bytes) {
        self.check(src, bytes);
        self.inner.place_bytes(src, bytes);
    }
}

/// Places bytes in the inner sink and offers them to a [`Tap`] as
/// unverified parts of the raw object at `key` whose payload starts at
/// `base` (`len` stored bytes).
pub(crate) struct Capture<'a> {
    /// Where the bytes go.
    pub(crate) inner: &'a mut dyn Sink,
    /// Who is offered them.
    pub(crate) tap: &'a dyn Tap,
    /// The object's key.
    pub(crate) key: &'a Path,
    /// The payload offset of the object's first byte.
    pub(crate) base: u64,
    /// The object's stored length.
    pub(crate) len: u64,
}

impl Sink for Capture<'_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        self.place_bytes(src, &Bytes::copy_from_slice(bytes));
    }

    fn place_bytes(&mut self, src: u64, bytes: &Bytes) {
        self.inner.place_bytes(src, bytes);
        if let Some(at) = src.checked_sub(self.base) {
            // A reference to the body chunk, not a copy.
            self.tap.unverified(self.key, self.len, at, bytes.clone());
        }
    }
}

/// Places bytes in the inner sink and copies them into a [`Tapped`]
/// buffer at their offset in the object (payload offset minus `base`).
pub(crate) struct Tee<'a> {
    pub(crate) inner: &'a mut dyn Sink,
    pub(crate) buf: &'a mut [u8],
    pub(crate) base: u64,
}

impl Sink for Tee<'_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        self.inner.place(src, bytes);
        let at = src
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok());
        if let Some(dst) = at.and_then(|o| self.buf.get_mut(o..o.checked_add(bytes.len())?)) {
            dst.copy_from_slice(bytes);
        }
    }
}
