//! Node-local state outside any store: where it lives on this machine.
//!
//! Owns [`state_dir`]; reads only the environment, never a store.

/// Where deltapack keeps local state that is not part of a store: the
/// SQLite ledgers of `s3://` stores opened without a ledger URL
/// (`<state dir>/ledgers/<hash of bucket/prefix>.sqlite3`).
/// `$DELTAPACK_STATE_DIR` if set, else `$XDG_STATE_HOME/deltapack`, else
/// `~/.local/state/deltapack`, else `deltapack-state` in the temp directory.
pub fn state_dir() -> std::path::PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = env("DELTAPACK_STATE_DIR") {
        return d.into();
    }
    if let Some(d) = env("XDG_STATE_HOME") {
        return std::path::PathBuf::from(d).join("deltapack");
    }
    if let Some(h) = env("HOME") {
        return std::path::PathBuf::from(h).join(".local/state/deltapack");
    }
    std::env::temp_dir().join("deltapack-state")
}
