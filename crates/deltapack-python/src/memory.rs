//! deltapack's own memory as Python sees it: `SnapshotData` (a snapshot
//! encoding held in Rust memory, read-only, shared with the store), the
//! numpy array interface both it and `FreshBuffer` export, and a
//! snapshot's layout read from its bytes.
//!
//! Imports no other module of this crate that borrows memory (`buffer`
//! imports this one to recognise deltapack's own memory owners).

use std::sync::Arc;

use deltapack_format::snapshot::{decode_prefix, digest_of_encoding};
use deltapack_format::{GroupKind, Snapshot};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::errors::{bad_input, format_err};

/// A snapshot encoding held in deltapack's (Rust) memory: the result of
/// `restore` or `synth`. Read-only; shared, never copied, with the store
/// (it may be the verified base of the next turn's restore).
#[pyclass(frozen, module = "deltapack._native", name = "SnapshotData")]
pub(crate) struct SnapshotData {
    pub(crate) snap: Arc<Snapshot>,
}

#[pymethods]
impl SnapshotData {
    fn __len__(&self) -> usize {
        self.snap.encoded().len()
    }

    /// Address of the first byte (valid while this object lives).
    #[getter]
    fn address(&self) -> usize {
        self.snap.encoded().as_ptr() as usize
    }

    /// Tokens covered.
    #[getter]
    fn boundary(&self) -> u64 {
        self.snap.boundary()
    }

    /// BLAKE3 of the encoding (`blake3:…`), computed with the GIL released:
    /// what v1, v2 and v2.1 roots record.
    fn digest(&self, py: Python<'_>) -> String {
        let s = self.snap.clone();
        py.detach(move || digest_of_encoding(s.encoded()).to_string())
    }

    /// The layered snapshot digest (`blake3-layers:…`) that v2.2 roots
    /// record, computed with the GIL released.
    fn layers_digest(&self, py: Python<'_>) -> PyResult<String> {
        let s = self.snap.clone();
        py.detach(move || deltapack_format::layer_digest::of_snapshot(&s))
            .map(|d| d.snapshot.to_string())
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    /// A copy as `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.snap.encoded())
    }

    /// The numpy array interface (version 3) of the read-only bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.address(), self.__len__(), true)
    }

    /// The page layout: see `snapshot_layout`.
    fn layout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        layout_tuple(py, self.snap.encoded())
    }
}

/// `{"shape": (n,), "typestr": "|u1", "data": (addr, read_only), "version": 3}`:
/// `n` bytes at `addr`, read-only for numpy or not.
pub(crate) fn array_interface(
    py: Python<'_>,
    addr: usize,
    len: usize,
    read_only: bool,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (addr, read_only))?;
    d.set_item("strides", py.None())?;
    d.set_item("version", 3)?;
    Ok(d)
}

/// `(payload_offset, boundary, [((group, layer), (name, dtype, kind,
/// tokens_per_page), (offset, pages, bytes_per_page)), …])` of an encoding,
/// checked for length.
pub(crate) fn layout_tuple<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
    let (header, payload_offset) = decode_prefix(bytes).map_err(format_err)?;
    let payload = header.validate().map_err(format_err)?;
    let total = payload_offset as u64 + payload;
    if bytes.len() as u64 != total {
        return Err(bad_input(format!(
            "the buffer is {} bytes, its snapshot header implies {total}",
            bytes.len()
        )));
    }
    let offsets = header
        .layout
        .layer_offsets(&header.block_counts)
        .map_err(format_err)?;
    let mut rows = Vec::new();
    for (gi, g) in header.layout.groups.iter().enumerate() {
        let pages = header.block_counts.get(gi).copied().unwrap_or(0);
        for (li, l) in g.layers.iter().enumerate() {
            let off = offsets
                .get(gi)
                .and_then(|r| r.get(li))
                .copied()
                .unwrap_or(0);
            let kind = match g.kind {
                GroupKind::Full => "full",
                GroupKind::Recurrent => "recurrent",
            };
            rows.push((
                (gi, li),
                (l.name.clone(), l.dtype.clone(), kind, g.tokens_per_page),
                (payload_offset as u64 + off, pages, l.bytes_per_page),
            ));
        }
    }
    PyTuple::new(
        py,
        [
            payload_offset.into_pyobject(py)?.into_any(),
            header.boundary.into_pyobject(py)?.into_any(),
            PyList::new(py, rows)?.into_any(),
        ],
    )
}
