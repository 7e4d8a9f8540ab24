//! Fresh buffers on the Python side: `FreshBuffer`, zero-filled memory
//! allocated by [`deltapack_store::fresh_buffer`] for the caller to hand to
//! `restore_into` (or the layer-wise restore) as `out`.
//!
//! A restore into memory nobody touched before pays a page fault per page
//! it writes; `fresh_buffer` makes those faults cheap (transparent huge
//! pages for large buffers where they pay; see its docs), where plain memory the caller
//! could allocate instead (`mmap.mmap(-1, n)`, `torch.empty`) is faulted
//! in 4 KiB at a time. It touches no page itself, so allocating here costs
//! no more than a `calloc` and needs no GIL release.
//!
//! The memory is exported the way `SnapshotData` exports its bytes: an
//! `address` and a (writable) `__array_interface__`, which the Python
//! wrapper `deltapack.Buffer` turns into numpy arrays and memoryviews that
//! keep it alive. `Borrowed::write` recognises the wrapper (or this class
//! itself) and borrows the memory through *this* object, which it holds
//! for the whole call, so the wrapper's attribute cannot be swapped out
//! from under a restore; the abi3 wheel cannot implement the buffer
//! protocol on a native class. This module never calls the store.

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::memory::array_interface;

/// Zero-filled, writable memory in deltapack's (Rust) memory, freed when
/// the object is dropped (the public class is `deltapack.Buffer`).
///
/// The bytes are written only through `address` (by numpy, a memoryview,
/// or a restore borrowing the buffer), never through `_owner`, which is
/// kept only to free the memory: the address comes from
/// [`Vec::as_mut_ptr`], which materialises no reference to the bytes and
/// stays valid for writes while the vector lives unmodified (moving the
/// vector moves no byte), and the vector is never touched again.
#[pyclass(frozen, module = "deltapack._native", name = "FreshBuffer")]
pub(crate) struct FreshBuffer {
    /// The allocation (never read or written through; dropped last).
    _owner: Vec<u8>,
    /// Address of the first byte.
    addr: usize,
    /// Bytes.
    len: usize,
}

impl FreshBuffer {
    /// Bytes (for borrowing from Rust).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte (for borrowing from Rust; valid while
    /// this object lives).
    pub(crate) fn address(&self) -> usize {
        self.addr
    }
}

#[pymethods]
impl FreshBuffer {
    fn __len__(&self) -> usize {
        self.len
    }

    /// Address of the first byte (valid while this object lives).
    #[getter(address)]
    fn py_address(&self) -> usize {
        self.addr
    }

    /// The numpy array interface (version 3) of the writable bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.addr, self.len, false)
    }
}

/// A zero-filled, writable buffer of exactly `nbytes` bytes, allocated by
/// `deltapack_store::fresh_buffer` (no page touched). An allocation that
/// cannot be made is a `MemoryError`.
#[pyfunction]
pub(crate) fn fresh_buffer(nbytes: usize) -> PyResult<FreshBuffer> {
    let mut owner = deltapack_store::fresh_buffer(nbytes)
        .map_err(|e| PyMemoryError::new_err(format!("deltapack.fresh_buffer: {e}")))?;
    let addr = owner.as_mut_ptr() as usize;
    Ok(FreshBuffer {
        _owner: owner,
        addr,
        len: nbytes,
    })
}
