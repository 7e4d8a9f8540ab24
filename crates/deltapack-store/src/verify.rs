//! One check of one stored object, and one verification of a whole root.
//!
//! A root says what each object it references must be: its stored size,
//! and for a v2 extent its stored digest (zstd), its decompressed length
//! and its raw name; for a v1 chunk its SHA-256. [`check_object`] is the
//! one place these are compared with bytes read from storage: the restore's
//! blame pass, the sweep and [`crate::Store::verify_root`] all call it, and
//! a failure says which check failed, expected against found
//! ([`ObjectCheck`]). The streamed restore hashes extents as it places
//! them (restore/read.rs) and reports the same [`ObjectCheck::Name`].
//!
//! [`crate::Store::verify_root`] never writes: it reports, it does not
//! quarantine (the restore and the sweep do, by the proof rule).

use bytes::Bytes;
use deltapack_format::root::{DecodedRoot, ManifestV2};
use deltapack_format::{Digest, ExtentCodec, ExtentEntry, ExtentPlan};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use crate::error::{MissReason, Result};
use crate::keys::{ObjectKey, RootKey};
use crate::object_check::ObjectCheck;
use crate::store::{RootStatus, Store};

/// What a root says one object is.
#[derive(Debug, Clone)]
pub(crate) enum Expected {
    /// Extent `index` of a v2 root with extent plan `plan`.
    V2 {
        plan: ExtentPlan,
        index: u64,
        entry: ExtentEntry,
    },
    /// A v1 chunk object: `len` bytes with SHA-256 `digest`.
    V1 { digest: Digest, len: u64 },
}

impl Expected {
    /// The object's name.
    pub(crate) fn object(&self) -> ObjectKey {
        match self {
            Expected::V2 { entry, .. } => ObjectKey(entry.object_digest()),
            Expected::V1 { digest, .. } => ObjectKey(*digest),
        }
    }

    /// Its stored size.
    pub(crate) fn stored_len(&self) -> u64 {
        match self {
            Expected::V2 { entry, .. } => entry.stored_len,
            Expected::V1 { len, .. } => *len,
        }
    }

    /// Every object a decoded root references, in the root's order.
    pub(crate) fn of_root(
        root: &DecodedRoot,
    ) -> std::result::Result<Vec<Expected>, deltapack_format::Error> {
        Ok(match root {
            DecodedRoot::V2(m) => Self::of_manifest(m)?,
            DecodedRoot::V1(m) => m
                .chunks
                .iter()
                .map(|c| Expected::V1 {
                    digest: c.digest,
                    len: c.bytes,
                })
                .collect(),
            DecodedRoot::Incompatible { .. } => Vec::new(),
        })
    }

    /// Every extent of a v2 manifest.
    pub(crate) fn of_manifest(
        m: &ManifestV2,
    ) -> std::result::Result<Vec<Expected>, deltapack_format::Error> {
        let plan = ExtentPlan::new(m.payload_len, m.max_extent_bytes)?;
        Ok(m.extents
            .iter()
            .enumerate()
            .map(|(i, e)| Expected::V2 {
                plan,
                index: i as u64,
                entry: *e,
            })
            .collect())
    }
}

/// Checks an object's stored bytes against what its root says it is and
/// returns its raw bytes (a zstd extent decompressed). The one comparison
/// of stored bytes with a root's record outside the streamed restore.
pub(crate) fn check_object(
    want: &Expected,
    stored: Bytes,
) -> std::result::Result<Bytes, ObjectCheck> {
    if stored.len() as u64 != want.stored_len() {
        return Err(ObjectCheck::Size {
            expected: want.stored_len(),
            found: stored.len() as u64,
        });
    }
    match want {
        Expected::V1 { digest, .. } => {
            let found = Digest::sha256(&stored);
            if found != *digest {
                return Err(ObjectCheck::Name {
                    expected: *digest,
                    found,
                });
            }
            Ok(stored)
        }
        Expected::V2 { plan, index, entry } => check_extent(plan, *index, entry, stored),
    }
}

/// Checks one extent's stored bytes (zstd: stored digest, then bounded
/// decompression) against its raw name and returns the raw bytes.
pub(crate) fn check_extent(
    plan: &ExtentPlan,
    index: u64,
    e: &ExtentEntry,
    stored: Bytes,
) -> std::result::Result<Bytes, ObjectCheck> {
    let raw = match e.codec {
        ExtentCodec::Raw => stored,
        ExtentCodec::Zstd => Bytes::from(unpack_zstd(e, &stored)?),
    };
    let found = plan
        .name(index, &raw, false)
        .map_err(|x| ObjectCheck::Decompress {
            detail: x.to_string(),
        })?;
    if found != e.raw_digest {
        return Err(ObjectCheck::Name {
            expected: e.raw_digest,
            found,
        });
    }
    Ok(raw)
}

/// Checks a zstd extent's stored digest and decompresses it within its
/// declared raw length.
pub(crate) fn unpack_zstd(
    e: &ExtentEntry,
    stored: &[u8],
) -> std::result::Result<Vec<u8>, ObjectCheck> {
    let found = Digest::blake3(stored);
    match e.stored_digest {
        Some(expected) if expected == found => {}
        Some(expected) => return Err(ObjectCheck::StoredDigest { expected, found }),
        None => {
            return Err(ObjectCheck::Decompress {
                detail: "zstd extent without stored digest".into(),
            })
        }
    }
    deltapack_format::extent::decompress(stored, e.raw_len).map_err(|x| ObjectCheck::Decompress {
        detail: x.to_string(),
    })
}

/// One referenced object's result in a [`RootVerdict`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ObjectVerdict {
    /// The object.
    pub object: ObjectKey,
    /// `None`: it verifies; else the check it failed.
    pub failed: Option<ObjectCheck>,
}

/// What [`Store::verify_root`] found: whether the root reads and decodes,
/// and every object it references, each checked on its own.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RootVerdict {
    /// The root.
    #[serde(skip)]
    pub root: RootKey,
    /// Why the root itself is unusable (absent, damaged, incompatible,
    /// unauthenticated); `None` when it decodes.
    pub unusable: Option<MissReason>,
    /// Its schema, when it decodes.
    pub schema: Option<&'static str>,
    /// Every referenced object, in the root's order.
    pub objects: Vec<ObjectVerdict>,
}

impl RootVerdict {
    /// Whether the root decodes and every object verifies.
    pub fn is_intact(&self) -> bool {
        self.unusable.is_none() && self.objects.iter().all(|o| o.failed.is_none())
    }

    /// The first object that failed, with its check.
    pub fn first_failure(&self) -> Option<(&ObjectKey, &ObjectCheck)> {
        self.objects
            .iter()
            .find_map(|o| o.failed.as_ref().map(|c| (&o.object, c)))
    }
}

/// Objects a verification reads at once.
const VERIFY_IN_FLIGHT: usize = 4;

impl Store {
    /// Reads the root at `key` (checking its MAC on a keyed store) and every
    /// object it references, each against the root's record: size, stored
    /// digest and decompression (zstd), name. Never writes: a damaged root
    /// or object is reported, not quarantined, and every object is read
    /// once (a failed check is not re-read, so it may be damage in
    /// transit). `Err` only when the backend fails.
    pub async fn verify_root(&self, key: impl Into<RootKey>) -> Result<RootVerdict> {
        let root = key.into();
        let mut verdict = RootVerdict {
            root,
            unusable: None,
            schema: None,
            objects: Vec::new(),
        };
        let decoded = match self.peek_root(&root.namespace, &root.context).await? {
            RootStatus::Found(d) => d,
            RootStatus::Absent => {
                verdict.unusable = Some(MissReason::Absent);
                return Ok(verdict);
            }
            RootStatus::Unusable(m) => {
                verdict.unusable = Some(m);
                return Ok(verdict);
            }
        };
        verdict.schema = decoded.summary().map(|s| s.schema);
        let expected = match Expected::of_root(&decoded) {
            Ok(e) => e,
            Err(e) => {
                verdict.unusable = Some(MissReason::damaged(format!("extent plan: {e}")));
                return Ok(verdict);
            }
        };
        verdict.objects = futures::stream::iter(expected)
            .map(|want| self.verify_one(want))
            .buffered(VERIFY_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(verdict)
    }

    /// Reads and checks one object (once).
    async fn verify_one(&self, want: Expected) -> Result<ObjectVerdict> {
        let object = want.object();
        let failed = match self.fetch_exact(&object.path(), want.stored_len()).await {
            Ok(stored) => tokio::task::spawn_blocking(move || check_object(&want, stored).err())
                .await
                .map_err(|e| crate::StoreError::task("verify", e))?,
            Err(fault) => Some(
                fault
                    .into_error()?
                    .check
                    .map_or(ObjectCheck::Missing, |c| *c),
            ),
        };
        Ok(ObjectVerdict { object, failed })
    }
}
