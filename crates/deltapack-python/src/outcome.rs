//! The Python values of restores: the tuples the `deltapack` package turns
//! into `Restored`, `Hit` and `Miss`.

use pyo3::prelude::*;

use crate::memory::SnapshotData;
use crate::store;

/// Builds the Python value of a restore.
pub(crate) fn restore_value(py: Python<'_>, r: store::Restore) -> PyResult<Py<PyAny>> {
    Ok(match r {
        store::Restore::Hit(v) => {
            let data = Py::new(py, SnapshotData { snap: v.snapshot })?;
            ("hit", data, v.digest, v.schema)
                .into_pyobject(py)?
                .into_any()
                .unbind()
        }
        store::Restore::Miss(m) => ("miss", m.reason, m.detail, m.object)
            .into_pyobject(py)?
            .into_any()
            .unbind(),
    })
}

/// Builds the Python value of a `restore_into`.
pub(crate) fn restore_into_value(
    py: Python<'_>,
    r: store::RestoreInto,
    addr: usize,
) -> PyResult<Py<PyAny>> {
    Ok(match r {
        store::RestoreInto::Hit { len, digest } => ("hit", len, digest, addr)
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        store::RestoreInto::Miss(m) => ("miss", m.reason, m.detail, m.object)
            .into_pyobject(py)?
            .into_any()
            .unbind(),
    })
}
