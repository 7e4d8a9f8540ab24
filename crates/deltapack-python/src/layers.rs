//! The layer-wise restore's Python side: `Store.restore_layers_into`'s
//! [`LayerIterator`] and its [`Layer`] items.
//!
//! The restore starts when the iterator is made: a task on the runtime
//! every store call runs on (its handle is given to [`start`]) runs
//! [`Engine::restore_layers`] over the caller's buffer, borrowed by a
//! [`Borrowed`] write guard that the task owns, and sends each proven layer
//! (as plain data) over a channel, then the outcome (or the error) last. The guard — the buffer export (or the strong
//! reference to an `__array_interface__` owner) and the claim of its
//! address range — is dropped by the task once the restore has ended and
//! before the outcome is sent, whether or not anyone still iterates: an
//! iterator dropped early leaves the task to finish (and release the
//! buffer) on its own. Dropping the guard takes the GIL itself
//! (`Borrowed`'s `Drop`), on the runtime thread.
//!
//! `__next__` waits for the next item with the GIL released; `__anext__`
//! returns an awaitable of it. After the outcome (or an exception) the
//! iteration stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deltapack_format::{ContextDigest, Namespace};
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Mutex};

use crate::buffer::Borrowed;
use crate::errors::Error;
use crate::outcome::restore_into_value;
use crate::store::{self, Engine, Failure, LayerOrder, LayerOut};

/// An item of the channel from the restore's task to the iterator.
enum Item {
    /// A layer was proven.
    Layer(LayerOut),
    /// The restore ended: its outcome, or why it failed.
    Done(store::Result<store::RestoreInto>),
}

/// The receiving end, shared by the iterator and its pending awaitables.
type Receiver = Arc<Mutex<mpsc::UnboundedReceiver<Item>>>;

/// One layer of a layer-wise restore (`Store.restore_layers_into`), proven
/// and in place: its bytes are `buf[start:end]` of the caller's buffer and
/// are never written again by the restore.
#[pyclass(frozen, module = "deltapack._native", name = "Layer")]
pub(crate) struct Layer {
    out: LayerOut,
}

#[pymethods]
impl Layer {
    /// The page group (index in the layout).
    #[getter]
    fn group(&self) -> usize {
        self.out.group
    }

    /// The layer within its group.
    #[getter]
    fn layer(&self) -> usize {
        self.out.layer
    }

    /// The stream's index in payload order (group by group, layer by layer).
    #[getter]
    fn stream(&self) -> usize {
        self.out.stream
    }

    /// Offset of the layer's first byte in the buffer (the snapshot encoding).
    #[getter]
    fn start(&self) -> u64 {
        self.out.start
    }

    /// Offset just past the layer's last byte in the buffer.
    #[getter]
    fn end(&self) -> u64 {
        self.out.end
    }

    /// How the layer was proven: `"stream-digest"` (against its own digest,
    /// which a v2.2 root records, before the rest of the snapshot was read)
    /// or `"whole-snapshot"` (the root records no stream digests: the whole
    /// snapshot was verified first).
    #[getter]
    fn proof(&self) -> &'static str {
        self.out.proof
    }

    fn __repr__(&self) -> String {
        let o = &self.out;
        format!(
            "Layer(group={}, layer={}, stream={}, start={}, end={}, proof='{}')",
            o.group, o.layer, o.stream, o.start, o.end, o.proof
        )
    }
}

/// The iterator of a layer-wise restore (`Store.restore_layers_into`),
/// sync (`for`) and async (`async for`): one `Layer` per proven layer, as
/// soon as it is proven, then one final item, the outcome (what
/// `restore_into` returns), then the end. The restore started when the
/// iterator was made, and runs to its end even if the iterator is dropped.
#[pyclass(frozen, module = "deltapack._native", name = "LayerIterator")]
pub(crate) struct LayerIterator {
    rx: Receiver,
    /// The runtime the restore runs on (`__next__` waits on it).
    rt: Handle,
    /// Address of the caller's buffer (the outcome's `address`).
    addr: usize,
    /// Builds the final item from the outcome tuple (`None`: the tuple).
    finish: Option<Py<PyAny>>,
    /// The outcome (or an exception) was handed out.
    ended: Arc<AtomicBool>,
}

/// Starts a layer-wise restore of `(ns, ctx)` into `out` (borrowed for
/// writing until the restore ends) as a task on `rt` and returns its
/// iterator.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    rt: &Handle,
    engine: Engine,
    ns: Namespace,
    ctx: ContextDigest,
    out: &Bound<'_, PyAny>,
    order: LayerOrder,
    timeout: Option<Duration>,
    finish: Option<Py<PyAny>>,
) -> PyResult<LayerIterator> {
    let mut buf = Borrowed::write(out, "out")?;
    let addr = buf.addr();
    let (tx, rx) = mpsc::unbounded_channel();
    rt.spawn(async move {
        let layers = tx.clone();
        let on_layer = move |l: LayerOut| {
            // The iterator may be gone: the restore goes on regardless.
            let _ = layers.send(Item::Layer(l));
        };
        let fut = match buf.bytes_mut() {
            Err(e) => Err(Failure::Other(e.to_string())),
            // SAFETY: `buf` (the buffer export, or a strong reference to
            // the memory's owner) keeps the memory valid until it is
            // dropped below, after the future has completed; its claim
            // keeps every other call of this crate from using the memory;
            // and the Python side is told (docs of `restore_layers_into`)
            // to read only the layers handed out, and to write nothing,
            // before the final item.
            Ok(bytes) => Ok(unsafe {
                engine.restore_layers(
                    ns,
                    ctx,
                    bytes.as_mut_ptr(),
                    bytes.len(),
                    timeout,
                    order,
                    on_layer,
                )
            }),
        };
        let outcome = match fut {
            Ok(f) => f.await,
            Err(e) => Err(e),
        };
        // Released (with the GIL) before the outcome is sent: once the
        // caller holds the final item, the buffer is theirs again.
        drop(buf);
        let _ = tx.send(Item::Done(outcome));
    });
    Ok(LayerIterator {
        rx: Arc::new(Mutex::new(rx)),
        rt: rt.clone(),
        addr,
        finish,
        ended: Arc::new(AtomicBool::new(false)),
    })
}

/// The Python value of the channel's next item (`None`: the iteration is
/// over).
fn item(
    py: Python<'_>,
    next: Option<Item>,
    addr: usize,
    finish: Option<&Py<PyAny>>,
    ended: &AtomicBool,
) -> PyResult<Option<Py<PyAny>>> {
    match next {
        Some(Item::Layer(out)) => Ok(Some(Py::new(py, Layer { out })?.into_any())),
        Some(Item::Done(r)) => {
            ended.store(true, Ordering::Release);
            let v = restore_into_value(py, r?, addr)?;
            Ok(Some(match finish {
                Some(f) => f.call1(py, (v,))?,
                None => v,
            }))
        }
        None if ended.swap(true, Ordering::AcqRel) => Ok(None),
        None => Err(Error::new_err(
            "the layer-wise restore ended without an outcome",
        )),
    }
}

/// Waits for the channel's next item.
async fn receive(rx: Receiver) -> Option<Item> {
    rx.lock().await.recv().await
}

#[pymethods]
impl LayerIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next item, waited for with the GIL released.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let rx = self.rx.clone();
        let next = py.detach(|| self.rt.block_on(receive(rx)));
        item(py, next, self.addr, self.finish.as_ref(), &self.ended)
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// An awaitable of the next item (raising `StopAsyncIteration` at the
    /// end).
    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (rx, addr, ended) = (self.rx.clone(), self.addr, self.ended.clone());
        let finish = self.finish.as_ref().map(|f| f.clone_ref(py));
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let next = receive(rx).await;
            Python::attach(move |py| {
                let v = item(py, next, addr, finish.as_ref(), &ended);
                // The reference is dropped here, with the GIL.
                drop(finish);
                v?.ok_or_else(|| PyStopAsyncIteration::new_err(()))
            })
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "LayerIterator(address={:#x}, ended={})",
            self.addr,
            self.ended.load(Ordering::Acquire)
        )
    }
}
