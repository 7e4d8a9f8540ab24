//! Read-only store handles: every check reads through
//! [`deltapack_store::Backend::read_only`] with an in-memory ledger, so a
//! check can never change the store it checks.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use deltapack_format::root::{self};
use deltapack_store::{Backend, BackendKind, Refusals, Store, StoreConfig};
use object_store::ObjectStore;

/// A store handle that cannot write: see the module docs. Returns the
/// handle and the count of writes it refused.
///
/// A local store must exist (a mistyped path is an error, not an empty
/// store created on the spot); no staging file is cleaned up.
pub(crate) fn open_read_only(url: &str, config: StoreConfig) -> Result<(Store, Refusals)> {
    let inner: Arc<dyn ObjectStore> = if url.starts_with("s3://") || url.starts_with("memory:") {
        deltapack_store::open_backend(url)
            .with_context(|| format!("cannot open store {url}"))?
            .store
    } else {
        let path = match url.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None if url.contains("://") => {
                bail!("store URL {url}: expected file://, s3:// or memory://")
            }
            None => PathBuf::from(url),
        };
        if !path.is_dir() {
            bail!("store {url}: {} is not a directory", path.display());
        }
        let root =
            std::fs::canonicalize(&path).with_context(|| format!("cannot open store {url}"))?;
        Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(&root)
                .with_context(|| format!("cannot open store {url}"))?,
        )
    };
    let (backend, refused) = Backend {
        store: inner,
        kind: BackendKind::Memory,
    }
    .read_only();
    let config = config
        .with_ledger(Some("sqlite://:memory:".into()))
        .with_cold_start(deltapack_store::ColdStart::Load)
        .with_budget_bytes(None)
        .with_min_free_bytes(None)
        // Every restore reads the store: a base verified for an earlier
        // root is not reused from memory.
        .with_base_cache_bytes(0);
    let store =
        Store::from_backend(backend, config).with_context(|| format!("cannot open store {url}"))?;
    Ok((store, refused))
}

/// The two handles a check needs: without a key (unkeyed roots, and keyed
/// ones when no key is given) and with the key (keyed roots).
pub(super) struct Handles {
    pub(super) plain: Store,
    pub(super) keyed: Option<Store>,
    pub(super) key: Option<[u8; 32]>,
    pub(super) refused: Vec<Refusals>,
}

impl Handles {
    pub(super) fn open(url: &str, secret: Option<Vec<u8>>) -> Result<Self> {
        let (plain, r1) = open_read_only(url, StoreConfig::default())?;
        let mut refused = vec![r1];
        let key = secret.as_deref().map(root::mac_key);
        let keyed = match secret {
            Some(s) => {
                let (k, r2) = open_read_only(url, StoreConfig::default().with_mac_secret(Some(s)))?;
                refused.push(r2);
                Some(k)
            }
            None => None,
        };
        Ok(Handles {
            plain,
            keyed,
            key,
            refused,
        })
    }

    pub(super) fn refused(&self) -> u64 {
        self.refused.iter().map(Refusals::count).sum()
    }
}
