//! Helpers shared by the commands: reading inputs, opening stores, output.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{Store, StoreConfig};
use indicatif::{ProgressBar, ProgressStyle};

/// The store `deltapack demo` uses when `--store` is not given: an embedded
/// local store in the working directory. Every other command names its
/// store explicitly (an operator command acting on a default store by
/// accident is the kind of surprise a storage tool must not have).
pub(crate) const DEMO_STORE: &str = "./deltapack-data";

/// Persists a handle's counters in the ledger (hits, misses, bytes: the
/// `deltapack_ledger_accumulated` totals every process adds to), so that a
/// short-lived command's work is counted even when its process exits
/// before the handle's drop or a background task could write them. A
/// failure is logged, never the command's error.
pub(crate) async fn persist_counters(store: &Store) {
    // `close` skips a ledger this command already found down, and a
    // ledger that hangs is given up on after CLOSE_PATIENCE: a read never
    // waits long on a ledger that is down for the sake of its counters.
    if LEDGER_SLOW.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    match tokio::time::timeout(CLOSE_PATIENCE, store.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not persist this command's counters"),
        Err(_) => {
            LEDGER_SLOW.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("the ledger did not take this command's counters in time")
        }
    }
}

/// Set once a ledger did not take a command's counters or accesses within
/// [`CLOSE_PATIENCE`]: the command's later closes do not wait for it again
/// (a ledger that does not answer costs the patience once, not per close).
static LEDGER_SLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long a command waits, at its end, for its ledger to take its
/// counters and accesses.
const CLOSE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(750);

/// Opens a store, naming the URL in errors.
pub(crate) fn open_store(url: &str, config: StoreConfig) -> Result<Store> {
    let store = Store::open(url, config).with_context(|| format!("cannot open store {url}"))?;
    if let Ok(mut opened) = OPENED.lock() {
        opened.push(store.clone());
    }
    Ok(store)
}

/// Every store this process opened, closed by [`close_stores`] before the
/// runtime shuts down.
static OPENED: std::sync::Mutex<Vec<Store>> = std::sync::Mutex::new(Vec::new());

/// Writes what the opened stores still owe their ledgers (accesses,
/// counters) and waits for it ([`Store::close`]): a write still in flight
/// when the runtime shuts down would be cancelled. Failures are warnings:
/// the command's own outcome is already decided.
pub(crate) async fn close_stores() {
    let opened: Vec<Store> = match OPENED.lock() {
        Ok(mut o) => o.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    for s in opened {
        if LEDGER_SLOW.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        match tokio::time::timeout(CLOSE_PATIENCE, s.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not write the store's last accesses to its ledger")
            }
            Err(_) => {
                LEDGER_SLOW.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!("the ledger did not take the store's last accesses in time")
            }
        }
    }
}

/// Reads and validates a cache identity JSON file.
pub(crate) fn read_identity(path: &Path) -> Result<CacheIdentity> {
    let text = std::fs::read(path)
        .with_context(|| format!("cannot read identity file {}", path.display()))?;
    CacheIdentity::from_json(&text).with_context(|| format!("identity file {}", path.display()))
}

/// Parses a context digest given as 64 lowercase hex characters.
pub(crate) fn parse_context(hex: &str) -> Result<ContextDigest> {
    hex.parse::<ContextDigest>()
        .with_context(|| "a context is 64 lowercase hex characters".to_string())
}

/// The context a command names: `--context HEX`, or `--tokens FILE` hashed
/// under `identity` (which `--tokens` needs: the namespace and chunk size
/// are part of the digest).
pub(crate) fn context_of(
    identity: Option<&CacheIdentity>,
    context: Option<&str>,
    tokens: Option<&Path>,
) -> Result<Option<ContextDigest>> {
    match (context, tokens) {
        (Some(hex), _) => Ok(Some(parse_context(hex)?)),
        (None, Some(path)) => {
            let Some(id) = identity else {
                bail!("--tokens needs --identity (the context digest depends on the namespace)");
            };
            let t = read_tokens(path)?;
            let hasher = deltapack_format::ContextHasher::new(id.namespace(), id.chunk_tokens)?;
            Ok(Some(hasher.digest(&t)))
        }
        (None, None) => Ok(None),
    }
}

/// Reads a token file (u32 little-endian ids).
pub(crate) fn read_tokens(path: &Path) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    deltapack_format::context::tokens_from_le_bytes(&bytes)
        .with_context(|| format!("token file {}", path.display()))
}

/// Opens an encoded snapshot file: its header read (with `pread`) and
/// validated, its length checked against the header. Its bytes are read
/// later, once, by whoever needs them (a publication stages them extent by
/// extent), and never mapped: a mapped file truncated by someone else
/// kills the process with `SIGBUS`, and one rewritten in place changes
/// under the reader. A file that changes while it is read is a clean
/// error (`input-changed`).
pub(crate) async fn open_snapshot(path: &Path) -> Result<deltapack_store::SnapshotFile> {
    let p = path.to_path_buf();
    blocking(move || {
        deltapack_store::SnapshotFile::open(&p)
            .with_context(|| format!("snapshot file {}", p.display()))
    })
    .await
}

/// The whole snapshot of an opened file, read with `pread` into memory of
/// its own (later changes to the file do not reach it).
pub(crate) async fn read_whole(
    file: std::sync::Arc<deltapack_store::SnapshotFile>,
) -> Result<Snapshot> {
    blocking(move || Ok(file.read_all()?)).await
}

/// A whole file's bytes, read into memory of its own (never mapped).
pub(crate) fn read_private_now(p: &Path) -> Result<bytes::Bytes> {
    let bytes = std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok(bytes::Bytes::from(bytes))
}

/// Runs `f` on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("file reader task")?
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, bytes, true)
}

/// Writes `bytes` to `path` atomically (`path.tmp`, then rename, so a reader
/// sees the old file or the whole new one). With `durable`, the file is
/// fsynced before the rename and its directory after, so the new file also
/// survives a power cut; without, the page cache decides when it reaches
/// the disk.
pub(crate) fn write_atomic_with(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let mut name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?
        .to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// Prints a value as pretty JSON on stdout.
pub(crate) fn print_json(v: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v).context("serializing JSON output")?;
    println!("{text}");
    Ok(())
}

/// What a report's first line says of a dry run (nothing otherwise).
pub(crate) fn dry_run_note(dry_run: bool) -> &'static str {
    if dry_run {
        " (dry run: nothing changed)"
    } else {
        ""
    }
}

/// Milliseconds of a duration, with microsecond resolution.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// `12.3 MiB`-style size (binary units, one decimal).
pub(crate) fn human_bytes(n: u64) -> String {
    deltapack_store::units::format_size(n)
}

/// The first 12 characters of a hex string.
pub(crate) fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// `v2` / `v1` for the known manifest schemas, the schema text otherwise.
pub(crate) fn short_schema(schema: &str) -> &str {
    match schema {
        deltapack_format::SCHEMA_V2 => "v2",
        deltapack_format::SCHEMA_V2_1 => "v2.1",
        deltapack_format::SCHEMA_V2_2 => "v2.2",
        deltapack_format::SCHEMA_V1 => "v1",
        other => other,
    }
}

/// Whether progress bars should be drawn (stderr is a terminal).
pub(crate) fn show_progress() -> bool {
    std::io::stderr().is_terminal()
}

/// A byte progress bar on stderr, hidden unless stderr is a terminal.
pub(crate) fn byte_bar(message: impl Into<String>) -> ProgressBar {
    if !show_progress() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::no_length();
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>14} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} {elapsed}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(message.into());
    pb
}

/// A spinner on stderr for work without a progress hook, hidden unless
/// stderr is a terminal.
pub(crate) fn spinner(message: impl Into<String>) -> ProgressBar {
    if !show_progress() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(message.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Renders rows as an aligned text table. Columns listed in `right` are
/// right-aligned.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let pad = w.saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if right.contains(&i) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                if i + 1 < cells.len() {
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tables() {
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        let t = table(
            &["a", "bb"],
            &[
                vec!["xxx".into(), "1".into()],
                vec!["y".into(), "22".into()],
            ],
            &[1],
        );
        assert_eq!(t, "a    bb\nxxx   1\ny    22\n");
    }
}
