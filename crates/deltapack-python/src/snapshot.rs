//! Snapshots on the Python side: a snapshot's layout and prefix read
//! from any buffer, synthetic snapshots, and snapshot arguments taken from
//! either kind of object (deltapack's own `SnapshotData`, in `memory.rs`,
//! or any buffer).
//!
//! Owns the reading of snapshot bytes the caller gives. It must never call
//! the store.

use std::sync::Arc;

use deltapack_format::synth::{self as synthetic, Preset};
use deltapack_format::{PageLayout, Snapshot, SnapshotHeader};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::buffer::Borrowed;
use crate::errors::{bad_input, format_err};
use crate::memory::layout_tuple;
pub(crate) use crate::memory::SnapshotData;

/// The page layout of a snapshot encoding in any buffer (only the header
/// is parsed; the buffer's length must match it).
#[pyfunction]
pub(crate) fn snapshot_layout<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    if let Ok(s) = obj.cast::<SnapshotData>() {
        return layout_tuple(obj.py(), s.get().snap.encoded());
    }
    let b = Borrowed::read(obj, "snapshot")?;
    layout_tuple(obj.py(), b.bytes())
}

/// The bytes before the payload (magic, length, CBOR header) of a snapshot
/// of `layout` (JSON text) at `boundary` tokens, and the total encoded
/// length.
#[pyfunction]
pub(crate) fn snapshot_prefix<'py>(
    py: Python<'py>,
    layout: &str,
    boundary: u64,
) -> PyResult<(Bound<'py, PyBytes>, u64)> {
    let layout: PageLayout =
        serde_json::from_str(layout).map_err(|e| bad_input(format!("layout JSON: {e}")))?;
    let header = SnapshotHeader::new(layout, boundary);
    let prefix = header.encode_prefix().map_err(format_err)?;
    let total = header.encoded_len().map_err(format_err)?;
    Ok((PyBytes::new(py, &prefix), total))
}

/// A deterministic synthetic conversation: its snapshot at `tokens` tokens
/// and the token ids (the `deltapack synth` data).
#[pyfunction]
#[pyo3(signature = (tokens, preset="tiny", seed=1))]
pub(crate) fn synth(
    py: Python<'_>,
    tokens: u64,
    preset: &str,
    seed: u64,
) -> PyResult<(SnapshotData, Vec<u32>)> {
    let p: Preset = preset.parse().map_err(format_err)?;
    let n = usize::try_from(tokens).map_err(|_| bad_input("too many tokens"))?;
    let (snap, ids) = py
        .detach(move || {
            synthetic::snapshot(p, seed, tokens).map(|s| (s, synthetic::tokens(seed, n)))
        })
        .map_err(format_err)?;
    Ok((
        SnapshotData {
            snap: Arc::new(snap),
        },
        ids,
    ))
}

/// The address of the first byte of a buffer (what `restore_into` writes).
#[pyfunction]
pub(crate) fn buffer_address(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(Borrowed::read(obj, "buffer")?.addr())
}

/// A snapshot argument: deltapack's own memory or any buffer, never copied.
///
/// A foreign buffer (numpy, bytearray, mmap, memoryview, ...) is borrowed
/// in place: the guard becomes the owner of the snapshot's `Bytes`
/// (`Bytes::from_owner`), and its header is checked with the GIL released.
/// The store does not keep a published snapshot beyond the call (the memory
/// backend copies what it stores), so the export is released when the call
/// returns. The caller must not change the buffer until then.
pub(crate) fn snapshot_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Arc<Snapshot>> {
    if let Ok(s) = obj.cast::<SnapshotData>() {
        return Ok(s.get().snap.clone());
    }
    if let Ok(inner) = obj.getattr("_data") {
        if let Ok(s) = inner.cast::<SnapshotData>() {
            return Ok(s.get().snap.clone());
        }
    }
    let b = Borrowed::read(obj, what)?;
    let what = what.to_string();
    obj.py()
        .detach(move || Snapshot::from_bytes(bytes::Bytes::from_owner(b)))
        .map(Arc::new)
        .map_err(|e| bad_input(format!("{what}: {e}")))
}
