//! Stored bytes as they are, for tools that check formats themselves.
//!
//! `deltapack compat` re-encodes a root and compares bytes, `compat freeze`
//! copies a root's objects into a fixture set, and `inspect` shows a
//! root's size: they need the bytes before (or without) verification. The
//! store hands them out here, read-only and named by typed keys, so no
//! caller reaches into the object store itself. Nothing read here is
//! trusted: a caller verifies what it uses ([`crate::Store::verify_root`],
//! a restore).

use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::error::{Result, StoreError};
use crate::keys::{ObjectKey, RootKey};
use crate::store::Store;

impl Store {
    /// The stored bytes of the root at `key`, unverified; `None` if absent.
    pub async fn raw_root(&self, key: impl Into<RootKey>) -> Result<Option<Bytes>> {
        self.raw(&key.into().path()).await
    }

    /// The stored bytes of an object, unverified; `None` if absent.
    pub async fn raw_object(&self, key: &ObjectKey) -> Result<Option<Bytes>> {
        self.raw(&key.path()).await
    }

    /// The stored size of the root at `key`; `None` if absent.
    pub async fn root_size(&self, key: impl Into<RootKey>) -> Result<Option<u64>> {
        let path = key.into().path();
        match self.object_store().head(&path).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }

    async fn raw(&self, path: &Path) -> Result<Option<Bytes>> {
        let got = match self.object_store().get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(StoreError::io(path, e)),
        };
        Ok(Some(
            got.bytes().await.map_err(|e| StoreError::io(path, e))?,
        ))
    }
}
