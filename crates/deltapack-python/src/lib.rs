//! # deltapack-python — the `deltapack._native` extension module
//!
//! The Rust half of the `deltapack` Python package (the Python half, with
//! the documented public API, is `python/deltapack/`). Built by maturin
//! into one abi3 wheel for CPython ≥ 3.9.
//!
//! * `store` — the only module that calls `deltapack-store`.
//! * `buffer` — zero-copy borrowing of the caller's buffers (read for
//!   publication, written in place by `restore_into`).
//! * `errors` — the exception hierarchy.
//! * `fresh` — fresh buffers in Rust memory (`FreshBuffer`), allocated by
//!   the store's `fresh_buffer` for the caller to restore into.
//! * `identity` — `CacheIdentity`: the namespace and the contexts under it.
//! * `layers` — the layer-wise restore's iterator (`LayerIterator`) and
//!   its items (`Layer`).
//! * `outcome` — the Python values of restores.
//! * `memory` — deltapack's own memory as Python sees it: snapshots in
//!   Rust memory (`SnapshotData`), the array interface, layouts.
//! * `snapshot` — layouts and prefixes of any buffer, synthetic data, and
//!   snapshot arguments.
//!
//! Every store call runs with the GIL released (`Python::detach`) on the
//! asyncio bridge's multi-thread tokio runtime, which the `*_async`
//! methods use too; so Python threads restore concurrently and an event
//! loop never blocks.

use std::future::Future;
use std::time::Duration;

use deltapack_format::ContextDigest;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

mod buffer;
mod errors;
mod fresh;
mod identity;
mod layers;
mod memory;
mod outcome;
mod snapshot;
mod store;

use buffer::Borrowed;
use errors::bad_input;
use fresh::{fresh_buffer, FreshBuffer};
use identity::CacheIdentity;
use layers::{Layer, LayerIterator};
use outcome::{restore_into_value, restore_value};
use snapshot::{
    buffer_address, snapshot_arg, snapshot_layout, snapshot_prefix, synth, SnapshotData,
};
use store::{Engine, Failure};

/// The runtime every store call runs on (the asyncio bridge's, so that
/// sync and async calls share one set of worker threads).
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

// ------------------------------------------------------------------ store

/// `serde_json::Value` → Python.
fn to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value as V;
    Ok(match v {
        V::Null => py.None(),
        V::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        V::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        V::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        V::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
        V::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// A layer order from Python: `None` or `"layer-major"` (the default),
/// `"group-major"`, or an iterable of `(group, layer)` pairs (each named
/// once; whether the layout has them is checked by the restore).
fn layer_order(order: Option<&Bound<'_, PyAny>>) -> PyResult<store::LayerOrder> {
    let Some(order) = order.filter(|o| !o.is_none()) else {
        return Ok(store::LayerOrder::LayerMajor);
    };
    if let Ok(name) = order.extract::<String>() {
        return match name.as_str() {
            "layer-major" => Ok(store::LayerOrder::LayerMajor),
            "group-major" => Ok(store::LayerOrder::GroupMajor),
            other => Err(bad_input(format!(
                "order={other:?}: use \"layer-major\" (default), \"group-major\" or a list of \
                 (group, layer) pairs"
            ))),
        };
    }
    let not_pairs =
        || bad_input("order: a list of (group, layer) pairs of non-negative ints is required");
    let mut seen = std::collections::HashSet::new();
    let mut pairs = Vec::new();
    for item in order.try_iter().map_err(|_| not_pairs())? {
        let pair: Vec<usize> = item?.extract().map_err(|_| not_pairs())?;
        let &[g, l] = pair.as_slice() else {
            return Err(not_pairs());
        };
        if !seen.insert((g, l)) {
            return Err(bad_input(format!(
                "order: layer {l} of group {g} is named twice"
            )));
        }
        pairs.push((g, l));
    }
    Ok(store::LayerOrder::Custom(pairs))
}

/// Seconds (float) → duration; `None` stays `None`.
fn seconds(s: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    s.map(|s| {
        Duration::try_from_secs_f64(s)
            .map_err(|_| bad_input(format!("{what} must be a non-negative number of seconds")))
    })
    .transpose()
}

/// Runs a store future on the runtime with the GIL released.
fn blocking<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = store::Result<T>> + Send,
) -> PyResult<T> {
    py.detach(|| runtime().block_on(fut)).map_err(PyErr::from)
}

/// Runs a store future as a Python awaitable on the runtime; `convert`
/// builds its Python value (with the GIL).
fn awaitable<'py, T: Send + 'static, R: for<'a> IntoPyObject<'a> + Send + 'static>(
    py: Python<'py>,
    fut: impl Future<Output = store::Result<T>> + Send + 'static,
    convert: impl FnOnce(Python<'_>, T) -> PyResult<R> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let v = fut.await?;
        Python::attach(|py| convert(py, v))
    })
}

/// The native store handle (the public class is `deltapack.Store`).
#[pyclass(frozen, module = "deltapack._native", name = "Store")]
struct Store {
    engine: Engine,
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (url, *, ledger=None, ledger_url=None, budget=None, min_free=None,
        grace=None, root_key=None, max_extent_bytes=None, compression=None, max_chain_depth=None,
        max_read_overhead=None, prefill_rate=None, tier=None, tier_budget=None, tier_ack=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: String,
        ledger: Option<&str>,
        ledger_url: Option<String>,
        budget: Option<u64>,
        min_free: Option<u64>,
        grace: Option<f64>,
        root_key: Option<Vec<u8>>,
        max_extent_bytes: Option<u64>,
        compression: Option<i32>,
        max_chain_depth: Option<u32>,
        max_read_overhead: Option<f64>,
        prefill_rate: Option<f64>,
        tier: Option<String>,
        tier_budget: Option<u64>,
        tier_ack: Option<&str>,
    ) -> PyResult<Self> {
        let tier_ack_tier = match tier_ack {
            None | Some("origin") => false,
            Some("tier") => true,
            Some(other) => {
                return Err(bad_input(format!(
                    "tier_ack={other:?}: use \"origin\" (default) or \"tier\""
                )))
            }
        };
        if tier.is_none() && (tier_budget.is_some() || tier_ack.is_some()) {
            return Err(bad_input("tier_budget and tier_ack need tier"));
        }
        let ledger = match ledger {
            None | Some("load") => store::LedgerPolicy::Load,
            Some("rebuild") => store::LedgerPolicy::Rebuild,
            Some(other) => {
                return Err(bad_input(format!(
                    "ledger={other:?}: use \"load\" (default) or \"rebuild\""
                )))
            }
        };
        if root_key.as_ref().is_some_and(|k| k.is_empty()) {
            return Err(bad_input("root_key is empty"));
        }
        // As the CLI's `--ledger`: the environment when not given.
        let ledger_url = ledger_url
            .or_else(|| std::env::var("DELTAPACK_LEDGER").ok())
            .filter(|u| !u.is_empty());
        let opts = store::OpenOptions {
            url,
            ledger,
            ledger_url,
            budget,
            min_free,
            grace: seconds(grace, "grace")?,
            root_key,
            max_extent_bytes,
            compression,
            max_chain_depth,
            max_read_overhead,
            prefill_rate,
            tier,
            tier_budget,
            tier_ack_tier,
        };
        let engine = py.detach(|| {
            let _rt = runtime().enter();
            Engine::open(opts)
        })?;
        Ok(Store { engine })
    }

    /// The URL the store was opened with.
    #[getter]
    fn url(&self) -> &str {
        self.engine.url()
    }

    /// Publishes a snapshot (see `deltapack.Store.publish`); returns the receipt.
    #[pyo3(signature = (identity, tokens, snapshot, base_tokens=None, base_snapshot=None))]
    fn publish(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        snapshot: &Bound<'_, PyAny>,
        base_tokens: Option<&Bound<'_, PyAny>>,
        base_snapshot: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let fut = self.publish_future(identity, tokens, snapshot, base_tokens, base_snapshot)?;
        let v = blocking(py, fut)?;
        receipt_py(py, v)
    }

    /// `publish` as an awaitable.
    #[pyo3(signature = (identity, tokens, snapshot, base_tokens=None, base_snapshot=None))]
    fn publish_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
        snapshot: &Bound<'py, PyAny>,
        base_tokens: Option<&Bound<'py, PyAny>>,
        base_snapshot: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.publish_future(identity, tokens, snapshot, base_tokens, base_snapshot)?;
        awaitable(py, fut, receipt_py)
    }

    /// Publishes the turn after `prev` from its new pages `tail` (any
    /// buffer, read in place); returns the receipt (with its `turn`).
    fn publish_turn(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        prev: &Turn,
        tail: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let fut = self.publish_turn_future(identity, tokens, prev, tail)?;
        let v = blocking(py, fut)?;
        receipt_py(py, v)
    }

    /// `publish_turn` as an awaitable.
    fn publish_turn_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
        prev: &Turn,
        tail: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.publish_turn_future(identity, tokens, prev, tail)?;
        awaitable(py, fut, receipt_py)
    }

    /// A turn handle for `snapshot`, published under `tokens`' context.
    fn turn_from(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        snapshot: &Bound<'_, PyAny>,
    ) -> PyResult<Turn> {
        let (ctx, _) = identity.context_of(tokens)?;
        let snap = snapshot_arg(snapshot, "snapshot")?;
        let (e, id) = (self.engine.clone(), identity.inner.clone());
        let t = blocking(py, async move { e.turn_from(id, ctx, snap).await })?;
        Ok(Turn { inner: t })
    }

    /// Restores into deltapack memory: `("hit", data, digest, schema)` or `("miss", reason, detail, object)`.
    #[pyo3(signature = (identity, tokens, timeout=None))]
    fn restore(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let fut = self.restore_future(identity, tokens, timeout)?;
        restore_value(py, blocking(py, fut)?)
    }

    /// `restore` as an awaitable.
    #[pyo3(signature = (identity, tokens, timeout=None))]
    fn restore_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.restore_future(identity, tokens, timeout)?;
        awaitable(py, fut, restore_value)
    }

    /// Restores into `out` in place: `("hit", len, digest, address)` or `("miss", reason, detail, object)`.
    #[pyo3(signature = (identity, tokens, out, timeout=None))]
    fn restore_into(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let (fut, addr) = self.restore_into_future(identity, tokens, out, timeout)?;
        restore_into_value(py, blocking(py, fut)?, addr)
    }

    /// `restore_into` as an awaitable (`out` is borrowed until it completes).
    #[pyo3(signature = (identity, tokens, out, timeout=None))]
    fn restore_into_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (fut, addr) = self.restore_into_future(identity, tokens, out, timeout)?;
        awaitable(py, fut, move |py, r| restore_into_value(py, r, addr))
    }

    /// Starts a layer-wise restore into `out` in place and returns its
    /// iterator: a `Layer` per proven layer, then the outcome (the
    /// `restore_into` tuple, passed through `finish` when given).
    #[pyo3(signature = (identity, tokens, out, order=None, timeout=None, finish=None))]
    fn restore_layers_into(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        order: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
        finish: Option<Py<PyAny>>,
    ) -> PyResult<LayerIterator> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        let order = layer_order(order)?;
        let t = seconds(timeout, "timeout")?;
        layers::start(runtime().handle(), e, ns, ctx, out, order, t, finish)
    }

    /// Exact encoded size from the root alone, or None.
    fn snapshot_size(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u64>> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        blocking(py, async move { e.snapshot_size(ns, ctx).await })
    }

    /// `snapshot_size` as an awaitable.
    fn snapshot_size_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        awaitable(
            py,
            async move { e.snapshot_size(ns, ctx).await },
            |_, size| Ok(size),
        )
    }

    /// The longest stored prefix `(boundary, context, source)` of the token
    /// ids, or None (`source`: `ledger` or `store`).
    fn lookup(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(u64, String, &'static str)>> {
        let fut = self.lookup_future(identity, tokens)?;
        Ok(lookup_value(blocking(py, fut)?))
    }

    /// `lookup` as an awaitable.
    fn lookup_async<'py>(
        &self,
        py: Python<'py>,
        identity: &CacheIdentity,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.lookup_future(identity, tokens)?;
        awaitable(py, fut, |_, r| Ok(lookup_value(r)))
    }

    /// Ledger gauges and counters.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.report(py, |e| async move { e.stats().await })
    }

    /// Uploads what was acknowledged in the tier; returns the report.
    fn tier_upload(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.report(py, |e| async move { e.tier_upload().await })
    }

    /// Integrity sweep; returns the report.
    #[pyo3(signature = (grace=3600.0, dry_run=false))]
    fn sweep(&self, py: Python<'_>, grace: f64, dry_run: bool) -> PyResult<Py<PyAny>> {
        let g = seconds(Some(grace), "grace")?.unwrap_or_default();
        self.report(py, move |e| async move { e.sweep(g, dry_run).await })
    }

    /// Evicts least recently used roots down to `to` bytes; returns the report.
    #[pyo3(signature = (to, dry_run=false))]
    fn evict(&self, py: Python<'_>, to: u64, dry_run: bool) -> PyResult<Py<PyAny>> {
        self.report(py, move |e| async move { e.evict(to, dry_run).await })
    }

    /// Places a named, persistent hold on a stored context.
    fn hold(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        name: String,
    ) -> PyResult<()> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        blocking(py, async move { e.hold(&name, ns, ctx).await })
    }

    /// Releases a named hold; whether it existed.
    fn release(
        &self,
        py: Python<'_>,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        name: String,
    ) -> PyResult<bool> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        blocking(py, async move { e.release(&name, ns, ctx).await })
    }

    /// One dict per root (optionally one identity's namespace).
    #[pyo3(signature = (identity=None))]
    fn inspect(&self, py: Python<'_>, identity: Option<&CacheIdentity>) -> PyResult<Py<PyAny>> {
        let ns = identity.map(|i| i.inner.namespace());
        self.report(py, move |e| async move { e.inspect(ns).await })
    }

    /// Waits for the moves to quarantine this handle's restores queued
    /// (a restore refuses damaged bytes at once and moves them aside in the
    /// background), then persists its counters into the ledger.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let e = self.engine.clone();
        blocking(py, async move { e.flush().await })
    }
}

impl Store {
    /// The engine and the `(namespace, context)` that `tokens` name under
    /// `identity`.
    fn at(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<(Engine, deltapack_format::Namespace, ContextDigest)> {
        let (ctx, _) = identity.context_of(tokens)?;
        Ok((self.engine.clone(), identity.inner.namespace(), ctx))
    }

    /// Runs a store call that returns a JSON report (with the GIL
    /// released) and returns the report as Python values.
    fn report<F: Future<Output = store::Result<serde_json::Value>> + Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(Engine) -> F,
    ) -> PyResult<Py<PyAny>> {
        let v = blocking(py, call(self.engine.clone()))?;
        to_py(py, &v)
    }

    /// Validates a restore's arguments (with the GIL) and returns the
    /// future that performs it.
    fn restore_future(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<impl Future<Output = store::Result<store::Restore>> + Send + 'static> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        let t = seconds(timeout, "timeout")?;
        Ok(async move { e.restore(ns, ctx, t).await })
    }

    /// Validates a `restore_into`'s arguments (with the GIL) and returns the
    /// future that performs it, which holds `out` until it completes, and
    /// `out`'s address.
    fn restore_into_future(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<(
        impl Future<Output = store::Result<store::RestoreInto>> + Send + 'static,
        usize,
    )> {
        let (e, ns, ctx) = self.at(identity, tokens)?;
        let mut buf = Borrowed::write(out, "out")?;
        let addr = buf.addr();
        let t = seconds(timeout, "timeout")?;
        let fut = async move {
            let bytes = buf.bytes_mut().map_err(|e| Failure::Other(e.to_string()))?;
            e.restore_into(ns, ctx, bytes, t).await
        };
        Ok((fut, addr))
    }

    /// Hashes a lookup's candidate boundaries (with the GIL) and returns the
    /// future that checks them.
    fn lookup_future(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<impl Future<Output = store::Result<LookupAnswer>> + Send + 'static> {
        let candidates = identity.hasher()?.boundaries(&buffer::tokens(tokens)?);
        let (e, id) = (self.engine.clone(), identity.inner.clone());
        Ok(async move { e.lookup(&id, &candidates).await })
    }

    /// Validates the arguments of a publication (with the GIL) and returns
    /// the future that performs it.
    fn publish_future(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        snapshot: &Bound<'_, PyAny>,
        base_tokens: Option<&Bound<'_, PyAny>>,
        base_snapshot: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<impl Future<Output = store::Result<store::Published>> + Send + 'static> {
        let (ctx, n) = identity.context_of(tokens)?;
        let snap = snapshot_arg(snapshot, "snapshot")?;
        if let Some(n) = n.filter(|n| *n != snap.boundary()) {
            return Err(bad_input(format!(
                "{n} tokens, but the snapshot covers {}: the context would not name this snapshot",
                snap.boundary()
            )));
        }
        let base = match (base_tokens, base_snapshot) {
            (None, None) => None,
            (Some(t), Some(s)) => {
                let (bctx, bn) = identity.context_of(t)?;
                let bsnap = snapshot_arg(s, "base snapshot")?;
                if let Some(bn) = bn.filter(|bn| *bn != bsnap.boundary()) {
                    return Err(bad_input(format!(
                        "{bn} base tokens, but the base snapshot covers {}",
                        bsnap.boundary()
                    )));
                }
                Some(store::Base {
                    context: bctx,
                    snapshot: bsnap,
                })
            }
            _ => return Err(bad_input("a base needs both its tokens and its snapshot")),
        };
        let (e, id) = (self.engine.clone(), identity.inner.clone());
        Ok(async move { e.publish(id, ctx, snap, base).await })
    }
}

impl Store {
    /// Validates a turn publication's arguments (with the GIL) and returns
    /// the future that performs it. The tail is held, never copied.
    fn publish_turn_future(
        &self,
        identity: &CacheIdentity,
        tokens: &Bound<'_, PyAny>,
        prev: &Turn,
        tail: &Bound<'_, PyAny>,
    ) -> PyResult<impl Future<Output = store::Result<store::Published>> + Send + 'static> {
        let (ctx, n) = identity.context_of(tokens)?;
        let Some(boundary) = n else {
            return Err(bad_input(
                "publish_turn needs the token ids of the new boundary, not a context digest",
            ));
        };
        let tail = bytes::Bytes::from_owner(Borrowed::read(tail, "tail")?);
        let (e, id, prev) = (
            self.engine.clone(),
            identity.inner.clone(),
            prev.inner.clone(),
        );
        Ok(async move { e.publish_turn(prev, id, ctx, boundary, tail).await })
    }
}

/// A lookup's answer from the store: the longest stored prefix's
/// `(boundary, context, source)`, if any.
type LookupAnswer = Option<(u64, ContextDigest, &'static str)>;

/// A lookup's answer as Python values: `(boundary, context hex, source)`.
fn lookup_value(r: LookupAnswer) -> Option<(u64, String, &'static str)> {
    r.map(|(b, c, s)| (b, c.hex(), s))
}

/// A receipt as a Python dict, with its `turn` (a [`Turn`] or `None`).
fn receipt_py(py: Python<'_>, (v, turn): store::Published) -> PyResult<Py<PyAny>> {
    let obj = to_py(py, &v)?;
    let turn = match turn {
        Some(t) => Py::new(py, Turn { inner: t })?.into_any(),
        None => py.None(),
    };
    obj.bind(py).set_item("turn", turn)?;
    Ok(obj)
}

/// A published turn: what `Store.publish_turn` needs to publish the next
/// one from its new pages alone (no page bytes: a hashing state per layer).
#[pyclass(name = "Turn", module = "deltapack._native", frozen)]
pub(crate) struct Turn {
    inner: deltapack_store::Turn,
}

#[pymethods]
impl Turn {
    /// Tokens the turn covers.
    #[getter]
    fn boundary(&self) -> u64 {
        self.inner.boundary()
    }

    /// The turn's snapshot digest (`blake3-layers:…`).
    #[getter]
    fn digest(&self) -> String {
        self.inner.digest().to_string()
    }

    /// The turn's context digest (hex).
    #[getter]
    fn context(&self) -> String {
        self.inner.context().hex()
    }

    /// Pages per group the next turn keeps from this one.
    #[getter]
    fn kept_pages(&self) -> Vec<u64> {
        self.inner.kept_pages().to_vec()
    }

    /// Bytes of the tail a next turn at `boundary` tokens must give.
    fn tail_len(&self, boundary: u64) -> PyResult<u64> {
        self.inner
            .tail_len(boundary)
            .map_err(|e| bad_input(e.to_string()))
    }

    /// The tail of `snapshot` (the full next turn), copied into `bytes`.
    fn tail_of<'py>(
        &self,
        py: Python<'py>,
        snapshot: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let snap = snapshot_arg(snapshot, "snapshot")?;
        let t = self
            .inner
            .tail_of(&snap)
            .map_err(|e| bad_input(e.to_string()))?;
        Ok(PyBytes::new(py, &t))
    }

    fn __repr__(&self) -> String {
        format!(
            "Turn(boundary={}, digest={:?})",
            self.inner.boundary(),
            self.inner.digest().to_string()
        )
    }
}

/// The `deltapack._native` module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CacheIdentity>()?;
    m.add_class::<SnapshotData>()?;
    m.add_class::<FreshBuffer>()?;
    m.add_class::<Store>()?;
    m.add_class::<Turn>()?;
    m.add_class::<Layer>()?;
    m.add_class::<LayerIterator>()?;
    m.add_function(wrap_pyfunction!(snapshot_layout, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(synth, m)?)?;
    m.add_function(wrap_pyfunction!(buffer_address, m)?)?;
    m.add_function(wrap_pyfunction!(fresh_buffer, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
