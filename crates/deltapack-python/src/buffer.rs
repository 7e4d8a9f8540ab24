//! Borrowing the caller's memory: the buffer protocol without copies.
//!
//! [`Borrowed::read`] and [`Borrowed::write`] take any object exporting a
//! C-contiguous buffer (bytes, bytearray, memoryview, mmap, numpy arrays,
//! array.array, …) or, failing that, a numpy-style `__array_interface__`
//! (e.g. objects that only describe their memory), and hand out its bytes
//! as a slice for as long as the guard lives — no copy in either direction.
//!
//! **Why our own FFI declarations.** The wheel is built for the stable ABI
//! of CPython 3.9 (`abi3-py39`). `PyObject_GetBuffer`, `PyBuffer_Release`
//! and `Py_buffer` entered the *limited API* only in 3.11, so PyO3 hides
//! them below that; but they are exported by every CPython 3.x and their
//! signatures and the struct's layout have not changed since 3.3 (3.11
//! stabilised exactly this layout). Declaring them here lets one abi3 wheel
//! borrow buffers zero-copy on 3.9 and 3.10 as well.
//!
//! **Soundness.** While a guard lives it holds the exporter's buffer (a
//! resizable exporter such as `bytearray` refuses to resize), a strong
//! reference to the `__array_interface__` owner, or — for deltapack's own
//! memory (`deltapack.Buffer`, `deltapack.Snapshot`) — the native object
//! that owns the allocation, never the Python wrapper whose `_data` could
//! be swapped; so the memory stays valid with the GIL released. Two calls
//! of this crate never get overlapping memory where one of them writes:
//! every guard registers its address range under an id of its own, and a
//! write that overlaps any other guard (or a read that overlaps a write) is
//! refused with `BadInput` before anything happens. Only the guard that
//! registered a claim removes it (by id): a refused guard, which registered
//! nothing, can never release the claim of the call it clashed with.
//!
//! An `__array_interface__` address is trusted as numpy trusts it: an
//! object that describes memory it does not own (a forged interface) can
//! make a restore write there. Only objects without the buffer protocol
//! take that path.
//! What the rest of the Python program does with the memory during a call
//! is the caller's contract (documented on every method): don't touch it
//! until the call returns.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::bad_input;
use crate::fresh::FreshBuffer;
use crate::memory::SnapshotData;

/// Whether `obj` is one of deltapack's native memory owners.
fn is_native(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<FreshBuffer>() || obj.is_instance_of::<SnapshotData>()
}

/// `Py_buffer` (CPython's `Include/pybuffer.h`, unchanged since 3.3).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

impl RawBuffer {
    /// An unfilled view for `PyObject_GetBuffer` to fill.
    fn empty() -> Self {
        RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        }
    }
}

/// `PyBUF_WRITABLE`.
const PYBUF_WRITABLE: c_int = 0x0001;
/// `PyBUF_FORMAT`.
const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_ND`: shape, and (with no `PyBUF_STRIDES`) a C-contiguous buffer
/// or an error.
const PYBUF_ND: c_int = 0x0008;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// A registered claim: the guard that owns it, its address range and
/// whether it writes.
struct Claim {
    id: u64,
    start: usize,
    end: usize,
    writes: bool,
}

/// The claims of the guards alive now. A claim is removed only by the
/// guard that registered it, by its id: two guards over the same range
/// (one refused because of the other) can never release each other's.
static CLAIMS: Mutex<Vec<Claim>> = Mutex::new(Vec::new());

/// The next claim id (ids are never reused within a process).
static NEXT_CLAIM: AtomicU64 = AtomicU64::new(1);

/// Where the borrowed bytes come from.
enum Source {
    /// A buffer export, released on drop (with the GIL).
    Buffer(Box<RawBuffer>),
    /// An `__array_interface__` owner, kept alive until drop.
    Interface(Py<PyAny>),
    /// deltapack's own memory (a `FreshBuffer` or a `SnapshotData`): the
    /// native object that owns the allocation, kept alive until drop —
    /// never a Python wrapper, whose attribute could be reassigned.
    Native(Py<PyAny>),
    /// Nothing to hold (an empty buffer).
    Empty,
}

/// The caller's memory, borrowed for the duration of one call.
pub(crate) struct Borrowed {
    ptr: *mut u8,
    len: usize,
    writes: bool,
    source: Source,
    /// The id of this guard's registered claim (`None`: none registered,
    /// e.g. an empty buffer or a claim that was refused).
    claim: Option<u64>,
}

// SAFETY: the guard owns a buffer export (or a strong reference keeping the
// memory alive); releasing either happens on drop with the GIL attached.
// The bytes themselves are plain memory, and overlapping use by this crate
// is excluded by the claim registry.
unsafe impl Send for Borrowed {}
// SAFETY: as for `Send`: shared access hands out only `&[u8]` (`bytes`);
// writing needs `&mut self` (`bytes_mut`), and only a write guard may.
unsafe impl Sync for Borrowed {}

impl Borrowed {
    /// Borrows `obj`'s bytes for reading (any C-contiguous buffer).
    pub(crate) fn read(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Borrowed> {
        Self::get(obj, false, what)
    }

    /// Borrows `obj`'s bytes for writing (a writable C-contiguous buffer).
    pub(crate) fn write(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Borrowed> {
        Self::get(obj, true, what)
    }

    fn get(obj: &Bound<'_, PyAny>, writes: bool, what: &str) -> PyResult<Borrowed> {
        if let Some(mut b) = Self::native(obj, writes, what)? {
            b.claim(what)?;
            return Ok(b);
        }
        let mut b = match Self::export(obj, writes) {
            Ok(b) => b,
            Err(e) => match Self::interface(obj, writes, what)? {
                Some(b) => b,
                None => {
                    let need = if writes {
                        "a writable C-contiguous buffer"
                    } else {
                        "a C-contiguous buffer"
                    };
                    return Err(bad_input(format!(
                        "{what}: {need} is required (bytes, bytearray, memoryview, mmap, a numpy \
                         array, or an object with __array_interface__); {}",
                        e.value(obj.py())
                    )));
                }
            },
        };
        b.claim(what)?;
        Ok(b)
    }

    /// deltapack's own memory: a native `FreshBuffer` / `SnapshotData`, or
    /// a Python wrapper holding one in `_data` (`deltapack.Buffer`,
    /// `deltapack.Snapshot`). The guard holds the *native* object, which
    /// owns the allocation, so reassigning or deleting the wrapper's
    /// attribute while a restore writes cannot free the memory. `None`:
    /// not deltapack's memory (borrowed through the buffer protocol or
    /// `__array_interface__` instead).
    fn native(obj: &Bound<'_, PyAny>, writes: bool, what: &str) -> PyResult<Option<Borrowed>> {
        let owner = if is_native(obj) {
            obj.clone()
        } else {
            match obj.getattr("_data") {
                Ok(inner) if is_native(&inner) => inner,
                _ => return Ok(None),
            }
        };
        let (ptr, len) = if let Ok(f) = owner.cast::<FreshBuffer>() {
            let f = f.get();
            (f.address() as *mut u8, f.len())
        } else if let Ok(s) = owner.cast::<SnapshotData>() {
            if writes {
                return Err(bad_input(format!(
                    "{what}: a deltapack Snapshot is read-only (the store may share its \
                     memory); restore into deltapack.fresh_buffer(n) or your own buffer"
                )));
            }
            let enc = s.get().snap.encoded();
            (enc.as_ptr().cast_mut(), enc.len())
        } else {
            return Ok(None);
        };
        Ok(Some(Borrowed {
            ptr,
            len,
            writes,
            source: if len == 0 {
                Source::Empty
            } else {
                Source::Native(owner.unbind())
            },
            claim: None,
        }))
    }

    /// `PyObject_GetBuffer` with C-contiguity (and writability) required.
    fn export(obj: &Bound<'_, PyAny>, writes: bool) -> PyResult<Borrowed> {
        let mut view = Box::new(RawBuffer::empty());
        let flags = PYBUF_ND | if writes { PYBUF_WRITABLE } else { 0 };
        // SAFETY: `obj` is a live object (GIL held) and `view` a properly
        // sized, writable Py_buffer; on success it must be released once,
        // which `Drop` does.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let len = usize::try_from(view.len).unwrap_or(0);
        let ptr = view.buf.cast::<u8>();
        Ok(Borrowed {
            ptr,
            len,
            writes,
            source: Source::Buffer(view),
            claim: None,
        })
    }

    /// A numpy-style `__array_interface__` (version 3): C-contiguous (no
    /// strides, or strides equal to the C-order ones), data given as a
    /// `(pointer, read_only)` pair.
    fn interface(obj: &Bound<'_, PyAny>, writes: bool, what: &str) -> PyResult<Option<Borrowed>> {
        let Ok(ai) = obj.getattr("__array_interface__") else {
            return Ok(None);
        };
        let bad = |m: &str| bad_input(format!("{what}: __array_interface__ {m}"));
        let ai = ai.cast_into::<PyDict>().map_err(|_| bad("is not a dict"))?;
        let data = ai
            .get_item("data")?
            .ok_or_else(|| bad("has no 'data'"))?
            .cast_into::<PyTuple>()
            .map_err(|_| bad("'data' is not a (pointer, read_only) tuple"))?;
        let addr: usize = data.get_item(0)?.extract()?;
        let read_only: bool = data.get_item(1)?.extract()?;
        if writes && read_only {
            return Err(bad("describes read-only memory"));
        }
        let shape: Vec<usize> = ai
            .get_item("shape")?
            .ok_or_else(|| bad("has no 'shape'"))?
            .extract()?;
        let typestr: String = ai
            .get_item("typestr")?
            .ok_or_else(|| bad("has no 'typestr'"))?
            .extract()?;
        let itemsize: usize = typestr
            .get(2..)
            .and_then(|s| s.parse().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| bad(&format!("has an unknown typestr {typestr:?}")))?;
        let mut len = itemsize;
        for d in &shape {
            len = len
                .checked_mul(*d)
                .ok_or_else(|| bad("describes more memory than the address space"))?;
        }
        if let Some(strides) = ai.get_item("strides")? {
            if !strides.is_none() {
                let strides: Vec<isize> = strides.extract()?;
                let mut want = itemsize as isize;
                for (d, s) in shape.iter().zip(&strides).rev() {
                    if *d > 1 && *s != want {
                        return Err(bad("is not C-contiguous"));
                    }
                    want = want.saturating_mul(*d as isize);
                }
            }
        }
        if ai.get_item("mask")?.is_some_and(|m| !m.is_none()) {
            return Err(bad("has a mask"));
        }
        if len > 0 && addr == 0 {
            return Err(bad("has a null data pointer"));
        }
        Ok(Some(Borrowed {
            ptr: addr as *mut u8,
            len,
            writes,
            source: if len == 0 {
                Source::Empty
            } else {
                Source::Interface(obj.clone().unbind())
            },
            claim: None,
        }))
    }

    /// Registers the address range, refusing overlaps with a writer. On
    /// success the guard owns the claim (its id), which only its own drop
    /// removes.
    fn claim(&mut self, what: &str) -> PyResult<()> {
        if self.len == 0 {
            return Ok(());
        }
        let (start, end) = (self.ptr as usize, self.ptr as usize + self.len);
        let mut claims = match CLAIMS.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let clash = claims
            .iter()
            .any(|c| c.start < end && start < c.end && (c.writes || self.writes));
        if clash {
            return Err(bad_input(format!(
                "{what}: this memory is being {} by another deltapack call; wait for it to return",
                if self.writes { "used" } else { "written" }
            )));
        }
        let id = NEXT_CLAIM.fetch_add(1, Ordering::Relaxed);
        claims.push(Claim {
            id,
            start,
            end,
            writes: self.writes,
        });
        self.claim = Some(id);
        Ok(())
    }

    /// The bytes, for reading.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the export (or owner) keeps `ptr..ptr+len` valid while
        // `self` lives; no writer of this crate overlaps it (claims).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing (only for guards made by [`Borrowed::write`]).
    pub(crate) fn bytes_mut(&mut self) -> PyResult<&mut [u8]> {
        if !self.writes {
            return Err(PyBufferError::new_err("internal: a read-only borrow"));
        }
        if self.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `bytes`, and the exporter granted write access;
        // this guard's claim excludes every other use by this crate.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// The address of the first byte (for tests of zero copy).
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }
}

/// A read guard can own the bytes of a [`bytes::Bytes`]
/// (`Bytes::from_owner`): that is how `publish` hands the caller's buffer to
/// the store without copying it. The export (and the claim) then last as
/// long as the last `Bytes` referring to it, released on drop with the GIL.
impl AsRef<[u8]> for Borrowed {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(id) = self.claim.take() {
            let mut claims = match CLAIMS.lock() {
                Ok(c) => c,
                Err(p) => p.into_inner(),
            };
            if let Some(i) = claims.iter().position(|c| c.id == id) {
                claims.swap_remove(i);
            }
        }
        match std::mem::replace(&mut self.source, Source::Empty) {
            Source::Buffer(mut view) => Python::attach(|_py| {
                // SAFETY: obtained by a successful PyObject_GetBuffer and
                // released exactly once, with the GIL held.
                unsafe { PyBuffer_Release(&mut *view) }
            }),
            Source::Interface(owner) | Source::Native(owner) => Python::attach(|_py| drop(owner)),
            Source::Empty => {}
        }
    }
}

/// Reads token ids: a sequence of ints, a buffer of 4-byte integers (numpy
/// `uint32`/`int32`, `array('I')`), of 8-byte integers (numpy's default
/// `int64`), or of bytes (u32 little endian, a token file's contents).
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let py = obj.py();
    let mut view = RawBuffer::empty();
    // SAFETY: as in `Borrowed::export`; released below on every path.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut view, PYBUF_ND | PYBUF_FORMAT) };
    if rc != 0 {
        PyErr::fetch(py); // not a buffer: a sequence of ints
        let mut out = Vec::new();
        for item in obj.try_iter().map_err(|_| {
            bad_input("tokens: token ids (a sequence of ints or an integer array) are required")
        })? {
            let v: i64 = item?
                .extract()
                .map_err(|_| bad_input("tokens: not an int"))?;
            out.push(
                u32::try_from(v)
                    .map_err(|_| bad_input(format!("tokens: {v} is not a u32 token id")))?,
            );
        }
        return Ok(out);
    }
    let format = if view.format.is_null() {
        "B".to_string()
    } else {
        // SAFETY: a non-null format is a NUL-terminated string owned by the
        // export, valid until release.
        unsafe { std::ffi::CStr::from_ptr(view.format) }
            .to_string_lossy()
            .into_owned()
    };
    let len = usize::try_from(view.len).unwrap_or(0);
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: a C-contiguous export of `len` bytes, alive until release.
        unsafe { std::slice::from_raw_parts(view.buf.cast::<u8>(), len) }
    };
    let kind = format.trim_start_matches(['@', '=', '<', '>', '!']);
    let out = match (view.itemsize, kind) {
        (1, "B" | "b" | "c") if len % 4 == 0 => Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        (4, "I" | "i" | "L" | "l") => Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        (8, "q" | "Q" | "l" | "L" | "n" | "N") => bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                let v = i64::from_ne_bytes(a);
                u32::try_from(v)
                    .map_err(|_| bad_input(format!("tokens: {v} is not a u32 token id")))
            })
            .collect(),
        _ => Err(bad_input(format!(
            "tokens: a buffer of format {format:?} (item size {}) is not token ids; use uint32 \
             (or int64) integers, or bytes of u32 little-endian ids",
            view.itemsize
        ))),
    };
    // SAFETY: obtained above, released once, GIL held.
    unsafe { PyBuffer_Release(&mut view) };
    out
}
