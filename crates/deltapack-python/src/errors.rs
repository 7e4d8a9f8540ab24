//! The exception hierarchy: `deltapack.Error` and its five kinds.
//!
//! A *miss* is never an exception (it is a `Miss` value); these are for
//! failures, each carrying the Rust error's message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::store::Failure;

create_exception!(
    deltapack,
    Error,
    PyException,
    "Base class of every deltapack failure (a miss is not a failure: it is a `Miss` value)."
);
create_exception!(
    deltapack,
    CapacityError,
    Error,
    "The store is full (its budget, or the disk's minimum free space) and nothing evictable \
     frees enough. Nothing was written."
);
create_exception!(
    deltapack,
    ConflictError,
    Error,
    "The context already holds a different snapshot. The existing root wins; nothing was \
     written."
);
create_exception!(
    deltapack,
    BadInput,
    Error,
    "The caller's input is invalid: an identity, token ids, a snapshot encoding, a base that \
     does not match its root, or a buffer of the wrong size or kind. Raised before anything is \
     read or written."
);
create_exception!(
    deltapack,
    IoError,
    Error,
    "Storage I/O failed (a file system or S3 error, the capacity ledger). Not a miss: the \
     store could not be asked."
);

create_exception!(
    deltapack,
    LedgerMismatchError,
    Error,
    "This handle's capacity ledger is not the one the store names (its ledger binding): the \
     handle may restore and look up, but not publish or delete. Open the store with its ledger \
     (`ledger_url=` or DELTAPACK_LEDGER), or adopt it (`deltapack ledger adopt`). Nothing was \
     changed."
);

/// A `BadInput` exception with `msg`.
pub(crate) fn bad_input(msg: impl Into<String>) -> PyErr {
    BadInput::new_err(msg.into())
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Capacity(m) => CapacityError::new_err(m),
            Failure::Conflict(m) => ConflictError::new_err(m),
            Failure::BadInput(m) => BadInput::new_err(m),
            Failure::Io(m) => IoError::new_err(m),
            Failure::LedgerMismatch(m) => LedgerMismatchError::new_err(m),
            Failure::Other(m) => Error::new_err(m),
        }
    }
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("CapacityError", py.get_type::<CapacityError>())?;
    m.add("ConflictError", py.get_type::<ConflictError>())?;
    m.add("BadInput", py.get_type::<BadInput>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("LedgerMismatchError", py.get_type::<LedgerMismatchError>())?;
    Ok(())
}

/// A format-crate error in caller-provided data.
pub(crate) fn format_err(e: deltapack_format::Error) -> PyErr {
    bad_input(e.to_string())
}
