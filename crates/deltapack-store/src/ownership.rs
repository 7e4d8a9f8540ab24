//! Which ledger may change a store: the ledger binding, the owner check and
//! adoption. Owns `ledger/binding.json`; never deletes or publishes itself.
//!
//! Garbage collection is exact only inside one ledger: a ledger condemns an
//! object when no root *it knows* references it. Two ledgers accounting for
//! one bucket (two nodes with their default SQLite ledgers) therefore lose
//! data: A evicts a root and condemns its objects, B republishes the same
//! bytes and reuses them (B's ledger protects them, A's does not know), A
//! collects them, and B's acknowledged root references deleted objects.
//!
//! So the store names the one ledger that accounts for it
//! ([`deltapack_format::binding`]). The first persisted ledger that writes to
//! a store binds it (create-if-absent, generation 1) and records the
//! generation in its own database. An in-memory ledger (`memory://` stores,
//! `sqlite://:memory:`) dies with its handle, so it never binds: it may
//! change a store only while no persisted ledger has bound it. Before every operation that deletes from the store or
//! relies on what is in it — publication, garbage collection, eviction,
//! prune, clear, invalidate, holds, the sweep's moves, migration — a handle
//! checks that the binding names its ledger at the generation its ledger
//! recorded; otherwise the operation fails with
//! [`StoreError::LedgerMismatch`] before it changes anything. Reads never
//! need the binding: a handle with any ledger restores, looks up and
//! inspects. A restore that finds damage quarantines only if its handle's
//! ledger owns (or nobody has bound) the store.
//!
//! **Adoption** ([`Store::adopt`]) makes this handle's ledger the store's:
//! it replaces the binding conditionally on the bytes it read (a raised
//! generation, the old ledger's id kept as `previous`), records the new
//! generation, waits out a *fence*, then rebuilds its account from a
//! listing. The old ledger is refused from then on. Deleting operations
//! re-read the binding before they start and again at least every
//! [`DELETION_RECHECK`] while they run, so an old owner that is still
//! running stops deleting within one recheck of the adoption; the fence
//! (default [`DEFAULT_FENCE`]) covers a request it issued just before, with
//! the object store client's retries, and the adopting listing starts only
//! after it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use deltapack_format::binding::{LedgerBinding, BINDING_KEY};
use deltapack_format::LedgerId;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::{put_create, PutOutcome};
use crate::error::{Result, StoreError};
use crate::ledger::{now_ms, Ledger, LedgerLocation, MergeReport};
use crate::store::Store;

/// How often an operation that deletes re-reads the binding while it runs.
pub(crate) const DELETION_RECHECK: Duration = Duration::from_secs(1);

/// How long [`Store::adopt`] waits, by default, between replacing the
/// binding and listing the store: longer than a deletion request the old
/// owner checked just before the adoption can take with the object store
/// client's retries (3 minutes by default), plus one recheck.
pub const DEFAULT_FENCE: Duration = Duration::from_secs(200);

/// Largest binding object parsed (a stored length is bounded before reading).
const MAX_BINDING_OBJECT: u64 = deltapack_format::binding::MAX_BINDING_BYTES as u64;

/// Largest binding object read at all: one larger than a binding may be
/// is still read, up to this, so that an adoption can replace it
/// conditionally on its exact bytes. Larger ones are not read (an
/// adoption asks for them to be removed by hand).
const MAX_BINDING_READ: u64 = 1 << 20;

/// The store's binding as read: what it says, and the exact bytes (for a
/// conditional replacement).
struct Read {
    binding: std::result::Result<LedgerBinding, String>,
    bytes: Bytes,
    /// The object's size; above [`MAX_BINDING_READ`], `bytes` is empty.
    size: u64,
}

/// Whether this handle's ledger accounts for the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
#[non_exhaustive]
pub enum Ownership {
    /// The binding names this handle's ledger at the generation it recorded.
    Owner,
    /// The store names no ledger yet (the first write binds it).
    Unbound,
    /// The store names another ledger (or another generation of this one,
    /// e.g. a copy restored from a backup), or its binding is unreadable.
    Foreign {
        /// Why, for people.
        detail: String,
    },
}

/// What `deltapack ledger show` prints about the binding.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BindingStatus {
    /// The store's binding, if it has one (`None` also when unreadable:
    /// see `ownership`).
    pub store_ledger: Option<BindingView>,
    /// This handle's ledger: its id, engine and location.
    pub this_ledger: BindingView,
    /// Whether this handle's ledger is the store's.
    pub ownership: Ownership,
}

/// One ledger as a binding names it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BindingView {
    /// The ledger's id (32 hex digits).
    pub ledger_id: String,
    /// `sqlite` or `postgres`.
    pub engine: String,
    /// Where the ledger is.
    pub description: String,
    /// The binding's generation (for this handle's ledger: the one it
    /// recorded, 0 if it never bound the store).
    pub generation: u64,
}

/// What [`Store::adopt`] did.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct AdoptReport {
    /// The binding replaced (`None`: the store had none, or what it had
    /// was not a binding: see [`AdoptReport::replaced_unreadable`]).
    pub previous: Option<BindingView>,
    /// What the store held at the binding's key when that was not a
    /// readable binding (oversized, truncated, garbage), replaced by this
    /// adoption: its size and why it did not decode.
    pub replaced_unreadable: Option<String>,
    /// The binding now in the store.
    pub binding: BindingView,
    /// Whether the binding changed (`false`: this ledger already owned it;
    /// its account was still rebuilt).
    pub changed: bool,
    /// How long the adoption waited for the old owner's deletions (ms).
    pub fenced_ms: u64,
    /// The rebuild from the store's listing.
    pub merge: MergeReport,
}

fn view(b: &LedgerBinding) -> BindingView {
    BindingView {
        ledger_id: b.ledger_id.hex(),
        engine: b.engine.clone(),
        description: crate::redact_ledger_url(&b.description),
        generation: b.generation,
    }
}

/// This host's name, for binding descriptions.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is a valid, writable buffer of the length passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// How a binding describes `location` (never with a password: PostgreSQL
/// locations are already redacted).
fn describe(location: &LedgerLocation) -> String {
    match (location.engine, location.persisted) {
        ("postgres", _) => location.location.clone(),
        (_, true) => format!("sqlite on host {}: {}", host_name(), location.location),
        (_, false) => format!(
            "sqlite in memory (process {} on host {})",
            std::process::id(),
            host_name()
        ),
    }
}

impl Store {
    fn binding_key(&self) -> Path {
        Path::from(BINDING_KEY)
    }

    /// The store's name in messages (`s3://bucket/prefix`, `file:///dir`).
    pub(crate) fn store_name(&self) -> String {
        self.backend_kind().identity()
    }

    /// Reads the binding object (`None`: absent). A binding that does not
    /// decode is returned as such, with its bytes.
    async fn read_binding(&self) -> Result<Option<Read>> {
        let key = self.binding_key();
        let got = match self.object_store().get(&key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(StoreError::io(&key, e)),
        };
        let size = got.meta.size;
        if size > MAX_BINDING_READ {
            return Ok(Some(Read {
                binding: Err(format!("{key} is {size} bytes, limit {MAX_BINDING_OBJECT}")),
                bytes: Bytes::new(),
                size,
            }));
        }
        let bytes = got.bytes().await.map_err(|e| StoreError::io(&key, e))?;
        if bytes.len() as u64 > MAX_BINDING_READ {
            return Ok(Some(Read {
                binding: Err(format!(
                    "{key} is over {MAX_BINDING_READ} bytes, limit {MAX_BINDING_OBJECT}"
                )),
                bytes: Bytes::new(),
                size: bytes.len() as u64,
            }));
        }
        let binding = if bytes.len() as u64 > MAX_BINDING_OBJECT {
            Err(format!(
                "{key} is {} bytes, limit {MAX_BINDING_OBJECT}",
                bytes.len()
            ))
        } else {
            LedgerBinding::decode(&bytes).map_err(|e| format!("{key}: {e}"))
        };
        Ok(Some(Read {
            binding,
            size: bytes.len() as u64,
            bytes,
        }))
    }

    /// The binding this handle's ledger would write for `generation`.
    fn binding_for(
        &self,
        ledger: &Ledger,
        generation: u64,
        previous: Option<LedgerId>,
    ) -> LedgerBinding {
        LedgerBinding {
            generation,
            ledger_id: ledger.id(),
            engine: ledger.location().engine.to_string(),
            description: describe(ledger.location()),
            bound_at_ms: now_ms(),
            previous,
        }
    }

    /// Judges `read` against this handle's ledger. A binding that names
    /// this ledger while the ledger recorded no generation (a crash between
    /// writing the binding and recording it: the id is this database's own)
    /// is recorded now.
    async fn judge(&self, ledger: &Ledger, read: &Read) -> Result<Ownership> {
        let b = match &read.binding {
            Ok(b) => b,
            Err(e) => {
                return Ok(Ownership::Foreign {
                    detail: format!("the store's ledger binding is unreadable ({e})"),
                })
            }
        };
        if b.ledger_id != ledger.id() {
            return Ok(Ownership::Foreign {
                detail: format!(
                    "the store is accounted for by the ledger {} ({}, id {}, generation {})",
                    crate::redact_ledger_url(&b.description),
                    b.engine,
                    b.ledger_id,
                    b.generation
                ),
            });
        }
        let recorded = ledger.run(|l| l.binding_generation()).await?;
        match recorded {
            Some(g) if g == b.generation => {
                self.scrub_binding(ledger, read, b).await;
                Ok(Ownership::Owner)
            }
            None => {
                let g = b.generation;
                ledger.run(move |l| l.set_binding_generation(g)).await?;
                Ok(Ownership::Owner)
            }
            Some(g) => Ok(Ownership::Foreign {
                detail: format!(
                    "the store's binding names this ledger at generation {}, but this ledger \
                     database recorded generation {g} (a copy of the ledger from before an \
                     adoption, e.g. restored from a backup)",
                    b.generation
                ),
            }),
        }
    }

    /// Rewrites a binding of this ledger whose description holds a secret
    /// (written by a version that recorded the connection string with its
    /// query: a `password=` there reached the bucket in clear) with the
    /// description this version writes (engine, hosts, ports, database).
    /// Conditional on the bytes read, like an adoption; best effort: a
    /// failure is logged and the next owner check tries again.
    async fn scrub_binding(&self, ledger: &Ledger, read: &Read, b: &LedgerBinding) {
        if !crate::ledger::holds_secret(&b.description) {
            return;
        }
        let mut clean = b.clone();
        clean.description = describe(ledger.location());
        let bytes = match clean.encode() {
            Ok(v) => Bytes::from(v),
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode the scrubbed ledger binding");
                return;
            }
        };
        match self
            .replace_root_if_unchanged(&self.binding_key(), &read.bytes, bytes)
            .await
        {
            Ok(crate::local::Replaced::Yes) => tracing::warn!(
                store = %self.store_name(),
                "the store's ledger binding held a credential of the ledger URL; \
                 rewritten without it (rotate that password: it was readable in the store)"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot rewrite the ledger binding without its credential")
            }
        }
    }

    /// Whether this handle's ledger accounts for the store (one read of the
    /// binding; binds nothing).
    pub async fn ownership(&self) -> Result<Ownership> {
        let ledger = self.ledger().await?;
        match self.read_binding().await? {
            None => Ok(Ownership::Unbound),
            Some(read) => self.judge(ledger, &read).await,
        }
    }

    /// The binding and this handle's relation to it (`deltapack ledger show`).
    pub async fn binding_status(&self) -> Result<BindingStatus> {
        let ledger = self.ledger().await?;
        let read = self.read_binding().await?;
        let ownership = match &read {
            None => Ownership::Unbound,
            Some(r) => self.judge(ledger, r).await?,
        };
        let generation = ledger.run(|l| l.binding_generation()).await?.unwrap_or(0);
        Ok(BindingStatus {
            store_ledger: read.and_then(|r| r.binding.ok()).map(|b| view(&b)),
            this_ledger: BindingView {
                ledger_id: ledger.id().hex(),
                engine: ledger.location().engine.to_string(),
                description: describe(ledger.location()),
                generation,
            },
            ownership,
        })
    }

    /// Fails with [`StoreError::LedgerMismatch`] unless this handle's ledger
    /// accounts for the store; binds an unbound store to it. Reads the
    /// binding every time (one small GET): an adoption by another ledger
    /// takes effect at this handle's next publication or deletion.
    pub(crate) async fn require_owner(&self, op: &'static str) -> Result<()> {
        let ledger = self.ledger().await?;
        self.require_owner_with(ledger, op).await
    }

    /// [`Store::require_owner`] with the ledger at hand (the ledger's own
    /// opening calls it, before [`Store::ledger`] can answer).
    pub(crate) async fn require_owner_with(&self, ledger: &Ledger, op: &'static str) -> Result<()> {
        let verdict = match self.read_binding().await? {
            Some(read) => self.judge(ledger, &read).await?,
            // An in-memory ledger dies with its handle: binding a store to
            // it would lock every later ledger out. It never binds, and may
            // change only a store no persisted ledger has bound.
            None if !ledger.location().persisted => Ownership::Unbound,
            None => self.bind(ledger).await?,
        };
        match verdict {
            Ownership::Owner => Ok(()),
            Ownership::Unbound if !ledger.location().persisted => Ok(()),
            Ownership::Unbound => Err(StoreError::Internal(
                "the store is still unbound after binding it".into(),
            )),
            Ownership::Foreign { detail } => Err(StoreError::LedgerMismatch {
                op,
                // Whole, so that the adopt command it suggests goes to the
                // same server when pasted.
                store: self.backend_kind().url(),
                detail,
                this_ledger: format!("{} (id {})", describe(ledger.location()), ledger.id()),
            }),
        }
    }

    /// Binds an unbound store to `ledger` (create-if-absent); if another
    /// ledger bound it first, judges that binding instead.
    async fn bind(&self, ledger: &Ledger) -> Result<Ownership> {
        // Record the generation first: a binding naming this ledger is then
        // never seen without it (and `judge` repairs the other order). A
        // ledger that bound the store before (its binding object was
        // deleted since) binds it again at the generation it recorded.
        let generation = match ledger.run(|l| l.binding_generation()).await? {
            Some(g) => g,
            None => {
                ledger.run(|l| l.set_binding_generation(1)).await?;
                1
            }
        };
        let binding = self.binding_for(ledger, generation, None);
        let bytes = binding.encode()?;
        let key = self.binding_key();
        match put_create(self.object_store().as_ref(), &key, bytes).await? {
            PutOutcome::Created => {
                tracing::info!(
                    store = %self.store_name(),
                    ledger = %binding.description,
                    id = %binding.ledger_id,
                    "bound the store to this ledger"
                );
                Ok(Ownership::Owner)
            }
            PutOutcome::Existed => match self.read_binding().await? {
                Some(read) => self.judge(ledger, &read).await,
                None => Ok(Ownership::Foreign {
                    detail: "the store's binding was created and removed again while this \
                             handle bound it"
                        .into(),
                }),
            },
        }
    }

    /// Whether a restore or publication of this handle may move damaged
    /// data to quarantine: only if its ledger owns the store, or nobody has
    /// bound it. Never binds; an unreachable ledger or binding means no.
    pub(crate) async fn may_quarantine(&self) -> bool {
        let Ok(ledger) = self.ledger().await else {
            return false;
        };
        match self.read_binding().await {
            Ok(None) => true,
            Ok(Some(read)) => matches!(self.judge(ledger, &read).await, Ok(Ownership::Owner)),
            Err(_) => false,
        }
    }

    /// Makes this handle's ledger the one that accounts for the store, then
    /// rebuilds its account from a listing (see the module docs). `fence`:
    /// how long to wait, after replacing the binding, for deletions an old
    /// owner still running checked just before it ([`DEFAULT_FENCE`];
    /// zero when the old owner's processes are known to be stopped).
    pub async fn adopt(&self, fence: Duration) -> Result<AdoptReport> {
        let ledger = self.ledger().await?;
        if !ledger.location().persisted {
            return Err(StoreError::Invalid(
                "an in-memory ledger cannot adopt a store (it would be lost with this process): \
                 adopt with a persisted ledger (sqlite:///path or postgres://…)"
                    .into(),
            ));
        }
        let read = self.read_binding().await?;
        let (previous, changed) = match &read {
            None => {
                if self.bind(ledger).await? != Ownership::Owner {
                    return Err(StoreError::Concurrent(
                        "another ledger bound the store while this one adopted it; run the \
                         adoption again"
                            .into(),
                    ));
                }
                (None, true)
            }
            Some(r) => match self.judge(ledger, r).await? {
                Ownership::Owner => (r.binding.as_ref().ok().map(view), false),
                _ => {
                    if r.size > MAX_BINDING_READ {
                        return Err(StoreError::Invalid(format!(
                            "{} is {} bytes, not a ledger binding: too large to replace safely \
                             (an adoption replaces it only if it still holds the bytes it read, \
                             and reads at most {MAX_BINDING_READ}); remove it by hand and run \
                             `ledger adopt` again",
                            self.binding_key(),
                            r.size
                        )));
                    }
                    let old_generation = r.binding.as_ref().map_or(0, |b| b.generation);
                    let generation = old_generation
                        .max(ledger.run(|l| l.binding_generation()).await?.unwrap_or(0))
                        + 1;
                    let previous_id = r.binding.as_ref().ok().map(|b| b.ledger_id);
                    let new = self.binding_for(ledger, generation, previous_id);
                    let bytes = Bytes::from(new.encode()?);
                    ledger
                        .run(move |l| l.set_binding_generation(generation))
                        .await?;
                    let replaced = self
                        .replace_root_if_unchanged(&self.binding_key(), &r.bytes, bytes)
                        .await?;
                    if replaced != crate::local::Replaced::Yes {
                        return Err(StoreError::Concurrent(
                            "the store's ledger binding changed while this ledger adopted the \
                             store; look at `deltapack ledger show` and run the adoption again"
                                .into(),
                        ));
                    }
                    tracing::warn!(
                        store = %self.store_name(),
                        ledger = %new.description,
                        generation,
                        "adopted the store: the previous ledger is refused from now on"
                    );
                    (r.binding.as_ref().ok().map(view), true)
                }
            },
        };
        let fenced = if changed && previous.is_some() && !fence.is_zero() {
            tracing::info!(
                seconds = fence.as_secs_f64(),
                "waiting for deletions the previous owner started before the adoption"
            );
            tokio::time::sleep(fence).await;
            fence
        } else {
            Duration::ZERO
        };
        let merge = self.reconcile_into(ledger, true).await?;
        let now = self.read_binding().await?.and_then(|r| r.binding.ok());
        let binding = match now {
            Some(b) if b.ledger_id == ledger.id() => view(&b),
            _ => {
                return Err(StoreError::Concurrent(
                    "the store's ledger binding changed again during the adoption".into(),
                ))
            }
        };
        let replaced_unreadable = match (&read, changed) {
            (Some(r), true) => r
                .binding
                .as_ref()
                .err()
                .map(|e| format!("{} bytes, not a binding ({e})", r.size)),
            _ => None,
        };
        Ok(AdoptReport {
            previous,
            replaced_unreadable,
            binding,
            changed,
            fenced_ms: fenced.as_millis() as u64,
            merge,
        })
    }
}

/// Re-checks ownership while a deleting operation runs: at most every
/// [`DELETION_RECHECK`], a fresh read of the binding. Every loop that
/// deletes from a store (GC, removals, the sweep's reclaim, clear) checks
/// it before each deletion, so it stops within a second (plus one
/// request) of an adoption, which the adoption's fence waits out.
pub(crate) struct OwnerFence {
    op: &'static str,
    ledger: Ledger,
    last: Instant,
}

impl OwnerFence {
    /// Checks now (fresh) and starts the fence.
    pub(crate) async fn start(store: &Store, op: &'static str) -> Result<Self> {
        let ledger = store.ledger().await?.clone();
        Self::start_with(store, ledger, op).await
    }

    /// [`OwnerFence::start`] with the ledger at hand (while the ledger is
    /// being opened, [`Store::ledger`] cannot answer yet).
    pub(crate) async fn start_with(
        store: &Store,
        ledger: Ledger,
        op: &'static str,
    ) -> Result<Self> {
        store.require_owner_with(&ledger, op).await?;
        Ok(OwnerFence {
            op,
            ledger,
            last: Instant::now(),
        })
    }

    /// Re-checks now, whenever the last check was.
    pub(crate) async fn check_now(&mut self, store: &Store) -> Result<()> {
        store.require_owner_with(&self.ledger, self.op).await?;
        self.last = Instant::now();
        Ok(())
    }

    /// Before the next deletion: re-checks if the last check is older than
    /// [`DELETION_RECHECK`].
    pub(crate) async fn check(&mut self, store: &Store) -> Result<()> {
        if self.last.elapsed() >= DELETION_RECHECK {
            store.require_owner_with(&self.ledger, self.op).await?;
            self.last = Instant::now();
        }
        Ok(())
    }
}

/// The owner fence of a local store where no async check can run (inside
/// a ledger call): the binding file, re-read at most every
/// [`DELETION_RECHECK`], must still hold the bytes it held when the watch
/// began (right after an owner check). Any change — an adoption, a
/// removal — stops the deleting loop; the caller then checks ownership
/// properly ([`OwnerFence::check_now`]).
pub(crate) struct LocalBindingWatch {
    path: std::path::PathBuf,
    bytes: Option<Vec<u8>>,
    last: Instant,
}

impl LocalBindingWatch {
    /// Starts watching `root`'s binding file.
    pub(crate) fn new(root: &std::path::Path) -> Self {
        let path = root.join(BINDING_KEY);
        let bytes = read_bounded(&path);
        LocalBindingWatch {
            path,
            bytes,
            last: Instant::now(),
        }
    }

    /// Whether the binding is as it was (re-read if the last look is older
    /// than [`DELETION_RECHECK`]).
    pub(crate) fn unchanged(&mut self) -> bool {
        if self.last.elapsed() < DELETION_RECHECK {
            return true;
        }
        self.last = Instant::now();
        read_bounded(&self.path) == self.bytes
    }
}

/// A binding file's bytes (at most [`MAX_BINDING_READ`] + 1, enough to see
/// a change); `None` when it cannot be read.
fn read_bounded(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).ok()?;
    let mut out = Vec::new();
    f.take(MAX_BINDING_READ + 1).read_to_end(&mut out).ok()?;
    Some(out)
}
