//! An `ObjectStore` layer ([`Intercept`]) that forwards every call to a
//! real backend while counting what restore and publication hold at once:
//! object payloads fetched and not yet dropped (tracked through the
//! lifetime of the returned `Bytes`), puts in flight, and GETs per key.
//! Optional per-GET latency makes concurrency observable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deltapack_store::wrap::{Intercept, ReadHead, Wrapped};
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore, PutOptions, PutPayload, PutResult, Result};

use super::InFlight;

/// Counters shared by a wrapper and the test.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Object bodies fetched and not yet dropped.
    pub(crate) held: InFlight,
    /// Object GETs (not roots) in flight.
    pub(crate) object_gets: InFlight,
    /// PUTs in flight; the most at once is sampled when an object PUT
    /// starts.
    pub(crate) puts: InFlight,
    /// Root GETs in flight.
    pub(crate) root_gets: InFlight,
    pub(crate) gets: Mutex<HashMap<String, usize>>,
    /// Body bytes of every object GET (roots not counted).
    pub(crate) object_bytes: AtomicU64,
    /// Root GETs started.
    pub(crate) root_gets_started: AtomicUsize,
    /// A gate: the GET of this key waits until this many root GETs have
    /// started in all (or [`GATE_PATIENCE`] passed; see `gate_gave_up`).
    pub(crate) gate: Mutex<Option<(String, usize)>>,
    /// Whether a gated GET stopped waiting without its count reached.
    pub(crate) gate_gave_up: AtomicBool,
}

/// How long a gated GET waits for its count of root GETs at most.
pub(crate) const GATE_PATIENCE: Duration = Duration::from_secs(10);

impl Counters {
    pub(crate) fn max_held(&self) -> usize {
        self.held.max()
    }
    pub(crate) fn max_object_gets(&self) -> usize {
        self.object_gets.max()
    }
    pub(crate) fn max_puts(&self) -> usize {
        self.puts.max()
    }
    pub(crate) fn max_root_gets(&self) -> usize {
        self.root_gets.max()
    }
    pub(crate) fn object_bytes(&self) -> u64 {
        self.object_bytes.load(Ordering::SeqCst)
    }
    pub(crate) fn gets_of_roots(&self) -> usize {
        self.gets_under("roots/")
    }
    pub(crate) fn gets_of_objects(&self) -> usize {
        self.gets_under("objects/")
    }
    /// GETs of keys under `prefix`.
    fn gets_under(&self, prefix: &str) -> usize {
        self.gets
            .lock()
            .map(|g| {
                g.iter()
                    .filter(|(k, _)| k.starts_with(prefix))
                    .map(|(_, v)| *v)
                    .sum()
            })
            .unwrap_or(0)
    }
}

struct Held {
    bytes: Bytes,
    counters: Arc<Counters>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counters.held.leave();
    }
}

/// The wrapper.
#[derive(Debug)]
pub(crate) struct Instrumented {
    pub(crate) inner: Arc<dyn ObjectStore>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) get_delay: Duration,
}

#[async_trait::async_trait]
impl Intercept for Instrumented {
    deltapack_store::layer_basics!("Instrumented");

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let object = location.as_ref().starts_with("objects/");
        self.counters.puts.enter_recording(object);
        let r = self.inner.put_opts(location, payload, opts).await;
        self.counters.puts.leave();
        r
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if let Ok(mut g) = self.counters.gets.lock() {
            *g.entry(location.to_string()).or_default() += 1;
        }
        let object = location.as_ref().starts_with("objects/");
        if object {
            self.counters.object_gets.enter();
        }
        let root = location.as_ref().starts_with("roots/");
        if root {
            self.counters.root_gets.enter();
            self.counters
                .root_gets_started
                .fetch_add(1, Ordering::SeqCst);
            let gate = self.counters.gate.lock().ok().and_then(|g| g.clone());
            if let Some((key, want)) = gate.filter(|(k, _)| k == location.as_ref()) {
                let start = std::time::Instant::now();
                while self.counters.root_gets_started.load(Ordering::SeqCst) < want {
                    if start.elapsed() > GATE_PATIENCE {
                        eprintln!("gate on {key}: gave up waiting for {want} root reads");
                        self.counters.gate_gave_up.store(true, Ordering::SeqCst);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        if !self.get_delay.is_zero() {
            tokio::time::sleep(self.get_delay).await;
        }
        let r = self.inner.get_opts(location, options).await;
        if root {
            self.counters.root_gets.leave();
        }
        if object {
            self.counters.object_gets.leave();
        }
        let r = r?;
        if !object {
            return Ok(r);
        }
        let (reply, bytes) = ReadHead::read(r).await?;
        self.counters
            .object_bytes
            .fetch_add(bytes.len() as u64, Ordering::SeqCst);
        self.counters.held.enter();
        let held = Bytes::from_owner(Held {
            bytes,
            counters: self.counters.clone(),
        });
        Ok(reply.once(held))
    }
}

/// A store over `inner` wrapped in an [`Instrumented`] layer (reported as a
/// memory backend, so restores stream through `object_store`), with its
/// counters.
pub(crate) fn instrumented_store(
    inner: deltapack_store::Backend,
    delay: Duration,
    config: deltapack_store::StoreConfig,
) -> (deltapack_store::Store, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let store = Wrapped::arc(Instrumented {
        inner: inner.store,
        counters: counters.clone(),
        get_delay: delay,
    });
    (super::memory_kind(store, config), counters)
}
