//! Sharing between restores: the single-flight table's entry type and the
//! cache of verified snapshots a delta restore may start from.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use deltapack_format::{ContextDigest, Digest, DigestState, Namespace, Snapshot};
use futures::future::{BoxFuture, Shared};

use super::outcome::RestoreOutcome;
use crate::error::StoreError;

/// A restore's outcome and the schema of its root, if the root was read
/// (the `schema` label of its metrics).
pub(crate) type Flight = (RestoreOutcome, Option<&'static str>);

/// A restore in flight, awaited by every caller of the same root.
pub(crate) type SharedRestore =
    Shared<BoxFuture<'static, std::result::Result<Flight, Arc<StoreError>>>>;

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
    /// Layered digest states of snapshots this handle published or hashed,
    /// so that a delta on one hashes only its new pages.
    states: VecDeque<(BaseKey, Arc<DigestState>)>,
}

/// Namespace, context and snapshot digest of a cached base.
pub(crate) type BaseKey = (Namespace, ContextDigest, Digest);

/// Most weak entries kept (dead ones are dropped first).
const HANDED_OUT: usize = 64;
/// Most digest states kept (oldest dropped first). A state is a BLAKE3
/// state (about 2 KiB) per (group, layer) stream.
const STATES: usize = 64;
/// Most streams of all kept digest states together.
const STATE_STREAMS: usize = 1 << 15;

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
        self.states.retain(|(k, _)| k != key);
    }

    /// Drops every cached base (e.g. after an invalidation).
    #[allow(dead_code)]
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.handed_out.clear();
        self.states.clear();
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

    /// Whether `s` (this very `Arc`) is a snapshot verified under `key`:
    /// one this handle materialised, handed out, or published.
    pub(crate) fn holds(&self, key: &BaseKey, s: &Arc<Snapshot>) -> bool {
        self.entries
            .iter()
            .any(|(k, e)| k == key && Arc::ptr_eq(e, s))
            || self.handed_out.iter().any(|(k, w)| {
                // Only a live entry: a dead one's address may have been
                // reused by another allocation holding other bytes.
                k == key && w.strong_count() > 0 && std::ptr::eq(w.as_ptr(), Arc::as_ptr(s))
            })
    }

    /// The digest state of the snapshot under `key`, if kept.
    pub(crate) fn state(&self, key: &BaseKey) -> Option<Arc<DigestState>> {
        self.states
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, s)| s.clone())
    }

    /// Keeps the digest state of the snapshot under `key`.
    pub(crate) fn put_state(&mut self, key: BaseKey, s: Arc<DigestState>) {
        self.states.retain(|(k, _)| *k != key);
        self.states.push_back((key, s));
        let streams = |q: &VecDeque<(BaseKey, Arc<DigestState>)>| -> usize {
            q.iter().map(|(_, s)| s.streams()).sum()
        };
        while self.states.len() > STATES
            || (self.states.len() > 1 && streams(&self.states) > STATE_STREAMS)
        {
            self.states.pop_front();
        }
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
