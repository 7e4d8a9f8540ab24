//! Named points where a test can make the process die, as a `kill -9`
//! would, at an exact step of a protocol.
//!
//! A crash test sets `DELTAPACK_FAILPOINT=<name>` on a child process; when
//! that process reaches the point of that name it writes
//! `failpoint <name>: reached` to stderr and aborts at once: no destructor
//! runs, no claim is finished, no lock is released politely — what a
//! SIGKILL leaves. Unset (always, outside tests), a failpoint costs one
//! read of a cached value.
//!
//! The points, by protocol step (docs/design.md §7.8):
//! - `gc.claimed`, `gc.deleted`: a garbage collection on an object store,
//!   after claiming due objects and after deleting the first of them
//!   (before the ledger is told);
//! - `sweep.claimed`, `sweep.deleted`: the sweep's orphan reclaim, the
//!   same two steps for one orphan;
//! - `remove.claimed`, `remove.deleted`: an eviction or pruning removing a
//!   root, after claiming it and after deleting the root object.

use std::sync::OnceLock;

/// The environment variable naming the failpoint to trigger.
pub(crate) const FAILPOINT_ENV: &str = "DELTAPACK_FAILPOINT";

/// Aborts the process if `name` is the failpoint the environment names.
pub(crate) fn reached(name: &str) {
    static SET: OnceLock<Option<String>> = OnceLock::new();
    let set = SET.get_or_init(|| std::env::var(FAILPOINT_ENV).ok());
    if set.as_deref() == Some(name) {
        eprintln!("failpoint {name}: reached");
        std::process::abort();
    }
}
