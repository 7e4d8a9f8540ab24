//! Opening a store handle: a backend from a URL (or one the caller
//! built), the configuration checked, and the tier in front of it, if one
//! is configured.
//!
//! Owns the handle's construction. Must never do I/O beyond preparing a
//! local directory: the ledger opens on first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deltapack_format::root;

use crate::backend::{self, Backend, BackendKind};
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::restore::cache::BaseCache;
use crate::stats::Stats;
use crate::store::{Inner, Store};
use crate::tier::TierState;

impl Store {
    /// Opens a store from a URL: `file:///path` (or a plain path) for local
    /// disk (fsync'd, direct I/O), `s3://bucket[/prefix]` for an
    /// S3-compatible bucket (`AWS_*` settings, `?endpoint=…`), `memory://`
    /// for a process-local store. See [`crate::open_backend`].
    pub fn open(url: &str, config: StoreConfig) -> Result<Self> {
        let backend = backend::open(url)?;
        Self::from_backend(backend, config)
    }

    /// Wraps an already-built backend (used by tests to inject an
    /// instrumented or fault-injecting `ObjectStore`).
    pub fn from_backend(backend: Backend, config: StoreConfig) -> Result<Self> {
        if deltapack_format::ExtentPlan::new(0, config.publication.max_extent_bytes).is_err() {
            return Err(StoreError::Invalid(format!(
                "max_extent_bytes {} must be a power of two between 1 KiB and 1 GiB",
                config.publication.max_extent_bytes
            )));
        }
        if deltapack_format::ExtentPlan::new(0, config.remote.range_bytes).is_err() {
            return Err(StoreError::Invalid(format!(
                "range_bytes {} must be a power of two between 1 KiB and 1 GiB",
                config.remote.range_bytes
            )));
        }
        if config.remote.part_bytes < 5 << 20 || config.remote.part_bytes > 5 << 30 {
            return Err(StoreError::Invalid(format!(
                "part_bytes {} must be between 5 MiB and 5 GiB (the S3 multipart limits)",
                config.remote.part_bytes
            )));
        }
        if config.remote.ranges_in_flight == 0
            || config.remote.parts_in_flight == 0
            || config.remote.roots_in_flight == 0
        {
            return Err(StoreError::Invalid(
                "ranges_in_flight, parts_in_flight and roots_in_flight must be at least 1".into(),
            ));
        }
        let mac_key = config.mac_secret.as_deref().map(root::mac_key);
        let (tier_store, tier) = match &config.tier {
            Some(tc) => {
                let (state, tier_config) = TierState::new(&config, tc)?;
                let backend = backend::open(&tc.url)?;
                if !matches!(backend.kind, BackendKind::Local { .. }) {
                    return Err(StoreError::Invalid(format!(
                        "tier {}: a tier is a local directory (file:///path or a plain path)",
                        tc.url
                    )));
                }
                let store = Store::from_backend(backend, tier_config)?;
                (Some(store), Some(Arc::new(state)))
            }
            None => (None, None),
        };
        let store = Store {
            inner: Arc::new(Inner {
                backend,
                config,
                mac_key,
                stats: Stats::default(),
                metrics: Default::default(),
                inflight: Mutex::new(HashMap::new()),
                base_cache: Mutex::new(BaseCache::default()),
                ledger: tokio::sync::OnceCell::new(),
                pins: Mutex::new(HashMap::new()),
                touches: Mutex::new(HashMap::new()),
                touch_flush_scheduled: std::sync::atomic::AtomicBool::new(false),
                touch_task: Mutex::new(None),
                ledger_down_logged: std::sync::atomic::AtomicBool::new(false),
                ledger_rest_until: Mutex::new(None),
                reconciled: tokio::sync::OnceCell::new(),
                reconcile_full: std::sync::atomic::AtomicBool::new(false),
                root_mutex: Arc::new(tokio::sync::Mutex::new(())),
                flushed: Mutex::new(Default::default()),
                tier_store,
                tier,
                quarantines: Default::default(),
            }),
        };
        // Publications a previous process acknowledged in the tier and did
        // not upload are resumed (in the background, when there is a
        // runtime; else at the first publication or `tier_upload`).
        if let Some(t) = store.tier() {
            t.start_uploader();
        }
        Ok(store)
    }
}
