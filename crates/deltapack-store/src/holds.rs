//! Pins and holds: what keeps a root from eviction and pruning.
//!
//! A [`Pin`] protects a root in this process while it lives; a hold is
//! named and persistent (a marker object under `holds/`, cached in the
//! ledger). Nothing here removes a root.

use bytes::Bytes;
use deltapack_format::{ContextDigest, Namespace};
use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::backend::put_create;
use crate::error::{Result, StoreError};
use crate::keys::{self, HoldName};
use crate::store::{RootStatus, Store};

/// A root protected from eviction while this guard lives (in-process).
#[derive(Debug)]
pub struct Pin {
    store: Store,
    key: (Namespace, ContextDigest),
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Ok(mut pins) = self.store.inner.pins.lock() {
            if let Some(n) = pins.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(&self.key);
                }
            }
        }
    }
}

/// `name` as a hold name, or the caller's error.
pub(crate) fn hold_name(name: &str) -> Result<HoldName> {
    HoldName::new(name).ok_or_else(|| {
        StoreError::Invalid(format!(
            "hold name {name:?}: use 1–64 characters [A-Za-z0-9._-], not starting with '.'"
        ))
    })
}

impl Store {
    pub(crate) async fn list_holds(&self) -> Result<Vec<(HoldName, Namespace, ContextDigest)>> {
        let prefix = Path::from(keys::HOLDS);
        Ok(self
            .list_all(&prefix)
            .await?
            .iter()
            .filter_map(|m| keys::parse_hold_key(&m.location))
            .collect())
    }

    /// Pins a root against eviction by this process while the guard lives.
    pub fn pin(&self, ns: Namespace, ctx: ContextDigest) -> Pin {
        if let Ok(mut pins) = self.inner.pins.lock() {
            *pins.entry((ns, ctx)).or_insert(0) += 1;
        }
        Pin {
            store: self.clone(),
            key: (ns, ctx),
        }
    }

    pub(crate) fn is_pinned(&self, key: &(Namespace, ContextDigest)) -> bool {
        self.inner
            .pins
            .lock()
            .map(|p| p.contains_key(key))
            .unwrap_or(true)
    }

    /// Places a named, persistent hold on a root (it must exist).
    pub async fn hold(&self, name: &str, ns: Namespace, ctx: ContextDigest) -> Result<()> {
        let name = &hold_name(name)?;
        self.require_owner("hold").await?;
        if !matches!(self.peek_root(&ns, &ctx).await?, RootStatus::Found(_)) {
            return Err(StoreError::Invalid(format!(
                "no readable root {}",
                keys::root_key(&ns, &ctx)
            )));
        }
        self.hold_root(name, ns, ctx).await
    }

    /// [`Store::hold`] on a root this handle's caller has just created
    /// (owner and root already checked): the marker, durable, then the
    /// ledger's row.
    pub(crate) async fn hold_root(
        &self,
        name: &HoldName,
        ns: Namespace,
        ctx: ContextDigest,
    ) -> Result<()> {
        self.hold_root_with(name, ns, ctx, Bytes::new()).await?;
        Ok(())
    }

    /// [`Store::hold_root`] whose marker carries `contents` (a tier's
    /// journal entry records the publication's identity). The root need
    /// not exist yet. Whether this call created the marker (`false`: it was
    /// there already, with whatever it holds).
    pub(crate) async fn hold_root_with(
        &self,
        name: &HoldName,
        ns: Namespace,
        ctx: ContextDigest,
        contents: Bytes,
    ) -> Result<bool> {
        let marker = keys::hold_key(name, &ns, &ctx);
        let created = put_create(self.object_store().as_ref(), &marker, contents).await?;
        let name = name.to_string();
        self.ledger()
            .await?
            .run(move |l| l.add_hold(&name, &ns, &ctx))
            .await?;
        Ok(created == crate::backend::PutOutcome::Created)
    }

    /// Releases a named hold. Returns whether it existed.
    pub async fn release(&self, name: &str, ns: Namespace, ctx: ContextDigest) -> Result<bool> {
        let name = &hold_name(name)?;
        self.require_owner("release").await?;
        let marker = keys::hold_key(name, &ns, &ctx);
        // Whether the hold existed: its marker (the source of truth) or the
        // ledger's row. Both are looked at before anything is removed, since
        // a reconciliation running meanwhile drops a row whose marker is
        // gone. The row goes first (with a tombstone, so that no
        // reconciliation brings it back from the marker), then the marker.
        let marked = match self.object_store().head(&marker).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(StoreError::io(&marker, e)),
        };
        let name = name.to_string();
        let recorded = self
            .ledger()
            .await?
            .run(move |l| l.release_hold(&name, &ns, &ctx))
            .await?;
        match self.object_store().delete(&marker).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StoreError::io(&marker, e)),
        }
        Ok(marked || recorded)
    }
}
