//! Sharing between restores: the single-flight table's entry type and the
//! cache of verified snapshots a delta restore may start from.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use deltapack_format::{ContextDigest, Digest, Namespace, Snapshot};
use futures::future::{BoxFuture, Shared};

use crate::error::StoreError;

/// A restore in flight, awaited by every caller of the same root.
pub(crate) type SharedRestore =
    Shared<BoxFuture<'static, std::result::Result<super::Flight, Arc<StoreError>>>>;

/// Verified snapshots a delta restore may start from.
///
/// Two kinds of entry: bases this handle materialised itself (legacy v1
/// links restored the old way), kept strongly in an LRU bounded in bytes;
/// and snapshots handed to callers by `restore`, kept only as weak
/// references — a caller that still holds turn N when it restores turn N+1
/// gets a restore of N+1's delta alone, and nothing outlives the caller's
/// own reference (the cache never doubles a process's memory).
#[derive(Default)]
pub(crate) struct BaseCache {
    entries: VecDeque<(BaseKey, Arc<Snapshot>)>,
    bytes: u64,
    handed_out: VecDeque<(BaseKey, Weak<Snapshot>)>,
}

/// Namespace, context and snapshot digest of a cached base.
pub(crate) type BaseKey = (Namespace, ContextDigest, Digest);

/// Most weak entries kept (dead ones are dropped first).
const HANDED_OUT: usize = 64;

impl BaseCache {
    pub(crate) fn get(&mut self, key: &BaseKey) -> Option<Arc<Snapshot>> {
        if let Some(pos) = self.entries.iter().position(|(k, _)| k == key) {
            let e = self.entries.remove(pos)?;
            let s = e.1.clone();
            self.entries.push_back(e);
            return Some(s);
        }
        self.handed_out.retain(|(_, w)| w.strong_count() > 0);
        self.handed_out
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, w)| w.upgrade())
    }

    pub(crate) fn remove(&mut self, key: &BaseKey) {
        if let Some(pos) = self.entries.iter().position(|(k, _)| k == key) {
            if let Some((_, s)) = self.entries.remove(pos) {
                self.bytes -= s.encoded().len() as u64;
            }
        }
        self.handed_out.retain(|(k, _)| k != key);
    }

    /// Drops every cached base (e.g. after an invalidation).
    #[allow(dead_code)]
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.handed_out.clear();
    }

    /// Keeps a base this handle materialised, within `cap` bytes.
    pub(crate) fn put(&mut self, key: BaseKey, s: Arc<Snapshot>, cap: u64) {
        let size = s.encoded().len() as u64;
        if size > cap || self.entries.iter().any(|(k, _)| *k == key) {
            return;
        }
        while self.bytes + size > cap {
            match self.entries.pop_front() {
                Some((_, old)) => self.bytes -= old.encoded().len() as u64,
                None => break,
            }
        }
        self.bytes += size;
        self.entries.push_back((key, s));
    }

    /// Remembers a snapshot handed to a caller, for as long as the caller
    /// keeps it.
    pub(crate) fn put_handed_out(&mut self, key: BaseKey, s: &Arc<Snapshot>) {
        self.handed_out
            .retain(|(k, w)| w.strong_count() > 0 && *k != key);
        if self.handed_out.len() >= HANDED_OUT {
            self.handed_out.pop_front();
        }
        self.handed_out.push_back((key, Arc::downgrade(s)));
    }
}
