//! Lookup: the longest stored prefix of a request, from the ledger's root
//! index when it answers in time, else from the store itself (roots probed
//! by name). Owns the read path's view of the ledger's health (the retry
//! interval, the once-per-outage warning); never writes anything.

use deltapack_format::{CacheIdentity, ContextDigest, Namespace};
use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::error::{Result, StoreError};
use crate::keys;
use crate::store::Store;

/// Root existence checks in flight at once when a lookup probes the store
/// by name (the ledger down, slow, or knowing none of the candidates): a
/// 262,144-token request (1,024 candidates at 256 tokens) is at most 16
/// rounds of requests.
pub const LOOKUP_PROBES_IN_FLIGHT: usize = 64;

/// How long reads leave a failed ledger alone before asking it again: a
/// ledger that comes back is used again within this interval.
pub const LEDGER_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a lookup's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum LookupSource {
    /// The ledger's root index (confirmed with one HEAD).
    Ledger,
    /// The store itself, probed by root name: the ledger was unreachable,
    /// failing, slower than the deadline, or knew none of the candidates.
    Store,
    /// The node's tier: a publication acknowledged there and not uploaded
    /// yet is the longest, or the origin did not answer in time.
    Tier,
}

/// What [`Store::lookup_detailed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lookup {
    /// The longest stored boundary and its context, if any.
    pub found: Option<(u64, ContextDigest)>,
    /// Where the answer came from.
    pub source: LookupSource,
}

impl Store {
    /// Given `(boundary, context)` candidates (e.g. every 256-token boundary
    /// of a request), returns the longest boundary that has a root, checking
    /// existence only (no payload reads). See [`Store::lookup_detailed`].
    pub async fn lookup(
        &self,
        identity: &CacheIdentity,
        candidates: &[(u64, ContextDigest)],
    ) -> Result<Option<(u64, ContextDigest)>> {
        Ok(self.lookup_detailed(identity, candidates).await?.found)
    }

    /// [`Store::lookup`], saying where the answer came from.
    ///
    /// The ledger's root index answers first: the longest candidate it
    /// records is confirmed with one HEAD (a stale row — a root deleted
    /// behind the ledger's back — moves on to the next). The answer comes
    /// from the store instead when the ledger knows none of the candidates,
    /// or is unreachable, fails, or does not answer within
    /// [`StoreConfig::capacity.ledger_deadline`](crate::CapacityConfig::ledger_deadline): the candidates' roots are probed by
    /// name, longest first, [`LOOKUP_PROBES_IN_FLIGHT`] at a time, and the
    /// first one present whose longer candidates are all absent is the
    /// answer — the boundary the ledger would have named. A lookup never
    /// waits for the ledger longer than the deadline; the fallback is
    /// counted (`deltapack_ledger_fallback_total{op="lookup"}`).
    #[tracing::instrument(level = "info", name = "lookup", skip_all, fields(
        namespace = %crate::metrics::short_hex(&identity.namespace().hex()),
        candidates = candidates.len(),
        found = tracing::field::Empty,
        source = tracing::field::Empty,
    ))]
    pub async fn lookup_detailed(
        &self,
        identity: &CacheIdentity,
        candidates: &[(u64, ContextDigest)],
    ) -> Result<Lookup> {
        let out = match self.tier() {
            Some(tier) => tier.lookup(identity, candidates).await,
            None => self.lookup_here(identity, candidates).await,
        };
        if let Ok(l) = &out {
            let span = tracing::Span::current();
            if let Some((b, _)) = l.found {
                span.record("found", b);
            }
            span.record(
                "source",
                match l.source {
                    LookupSource::Ledger => "ledger",
                    LookupSource::Store => "store",
                    LookupSource::Tier => "tier",
                },
            );
        }
        out
    }

    /// [`Store::lookup_detailed`] in this store alone (not its tier).
    pub(crate) async fn lookup_here(
        &self,
        identity: &CacheIdentity,
        candidates: &[(u64, ContextDigest)],
    ) -> Result<Lookup> {
        let ns = identity.namespace();
        let mut sorted = candidates.to_vec();
        sorted.sort_by_key(|c| std::cmp::Reverse(c.0));
        let ctxs: Vec<ContextDigest> = sorted.iter().map(|c| c.1).collect();
        let deadline = self.config().capacity.ledger_deadline;
        let asked = async {
            let ledger = self.ledger().await?;
            Ok::<_, StoreError>(ledger.run(move |l| l.recorded(&ns, &ctxs)).await?)
        };
        let known = if self.ledger_resting() {
            None
        } else {
            match tokio::time::timeout(deadline, asked).await {
                Ok(Ok(known)) => {
                    self.note_ledger_up();
                    Some(known)
                }
                Ok(Err(e)) => {
                    self.note_ledger_down(&format!("{e}"));
                    None
                }
                Err(_) => {
                    self.note_ledger_down(&format!(
                        "no answer within the ledger deadline ({} ms)",
                        deadline.as_millis()
                    ));
                    None
                }
            }
        };
        if let Some(known) = &known {
            for (b, c) in sorted.iter().filter(|c| known.contains(&c.1)) {
                let key = keys::root_key(&ns, c);
                match self.object_store().head(&key).await {
                    Ok(_) => {
                        return Ok(Lookup {
                            found: Some((*b, *c)),
                            source: LookupSource::Ledger,
                        });
                    }
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(StoreError::io(&key, e)),
                }
            }
        } else {
            self.metrics().ledger_fallback(self.stats_ref(), "lookup");
        }
        let found = self.probe_roots(&ns, sorted).await?;
        Ok(Lookup {
            found,
            source: LookupSource::Store,
        })
    }

    /// Logs that a read answered without the ledger: a warning the first
    /// time after the ledger last answered, then at debug level (a fleet
    /// whose ledger is down must not drown its logs).
    pub(crate) fn note_ledger_down(&self, why: &str) {
        use std::sync::atomic::Ordering;
        if let Ok(mut r) = self.inner.ledger_rest_until.lock() {
            *r = Some(std::time::Instant::now() + LEDGER_RETRY);
        }
        if !self.inner.ledger_down_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reason = why,
                "ledger unavailable: reads answer from the store until it is back"
            );
        } else {
            tracing::debug!(reason = why, "ledger unavailable");
        }
    }

    /// Whether reads skip the ledger for now: it failed or timed out less
    /// than [`LEDGER_RETRY`] ago. A ledger that is down is asked once per
    /// interval, not by every read (each attempt may leave a connection
    /// attempt or a stuck query on a blocking thread).
    pub(crate) fn ledger_resting(&self) -> bool {
        self.inner
            .ledger_rest_until
            .lock()
            .map(|r| r.is_some_and(|t| std::time::Instant::now() < t))
            .unwrap_or(false)
    }

    /// A ledger call succeeded: the next outage is warned about again.
    pub(crate) fn note_ledger_up(&self) {
        if let Ok(mut r) = self.inner.ledger_rest_until.lock() {
            *r = None;
        }
        self.metrics().ledger_reached();
        self.inner
            .ledger_down_logged
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The longest of `sorted` (longest first) whose root exists, by name:
    /// HEADs in order, [`LOOKUP_PROBES_IN_FLIGHT`] at a time, stopping at the
    /// first present root (every longer candidate was absent).
    async fn probe_roots(
        &self,
        ns: &Namespace,
        sorted: Vec<(u64, ContextDigest)>,
    ) -> Result<Option<(u64, ContextDigest)>> {
        let store = self.object_store().clone();
        let ns = *ns;
        let mut probes = futures::stream::iter(sorted)
            .map(|(b, c)| {
                let store = store.clone();
                async move {
                    let key = keys::root_key(&ns, &c);
                    match store.head(&key).await {
                        Ok(_) => Ok(Some((b, c))),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(StoreError::io(&key, e)),
                    }
                }
            })
            .buffered(LOOKUP_PROBES_IN_FLIGHT);
        while let Some(probe) = probes.next().await {
            if let Some(hit) = probe? {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }
}
