//! The spans an operator's subscriber sees: publish, restore (hit and
//! miss), lookup and sweep each open an `info` span named after the
//! operation whose fields say what it was about and how it ended —
//! namespace and context as 12 hex digits, the root's schema, the outcome,
//! the miss reason, the bytes — recorded once known; inner steps (resolving
//! a root) are `debug` spans. Captured by a real `tracing-subscriber`
//! registry with a small collecting layer, installed for this test's
//! thread only, on a current-thread runtime so every span the store opens
//! (including in the task a restore spawns) is opened on that thread.
//!
//! This test is a binary of its own, unlike the crate's other store tests
//! (`tests/store/`): `tracing` caches per call site whether any subscriber
//! is interested, and a call site first reached by another test's thread
//! (no subscriber) while this test installs its thread-local one can stay
//! cached as "never" — the restore span then went missing in one run of
//! the whole suite. Alone in its process, no other thread reaches the
//! store's call sites.

#[allow(dead_code, unused_imports)]
#[path = "../store/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::common::*;
use deltapack_format::root;
use deltapack_store::{MissReason, RootFormat, SweepOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A closed span: its name, level and fields as recorded.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    level: Level,
    fields: BTreeMap<String, String>,
}

/// Fields of a span still open (kept in its extensions).
struct Fields(BTreeMap<String, String>);

struct Visitor<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

/// Collects every span into `closed` when it closes.
#[derive(Clone, Default)]
struct Collect {
    closed: Arc<Mutex<Vec<Closed>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collect {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Visitor(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Fields(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(f) = span.extensions_mut().get_mut::<Fields>() {
                values.record(&mut Visitor(&mut f.0));
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions_mut()
                .remove::<Fields>()
                .map(|f| f.0)
                .unwrap_or_default();
            self.closed.lock().expect("lock").push(Closed {
                name: span.name(),
                level: *span.metadata().level(),
                fields,
            });
        }
    }
}

impl Collect {
    /// The closed spans named `name`, oldest first; clears the record.
    fn take(&self, name: &str) -> Vec<Closed> {
        let mut all = self.closed.lock().expect("lock");
        let (these, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|c| c.name == name);
        *all = rest;
        these
    }

    /// The one closed span named `name` (`what` in a failure), at level
    /// `info`, with each `(field, value)` of `want`.
    fn info(&self, name: &str, what: &str, want: &[(&str, String)]) -> Closed {
        let span = one(self.take(name), what);
        assert_eq!(span.level, Level::INFO, "{what}");
        fields(&span, want);
        span
    }
}

fn one(mut spans: Vec<Closed>, what: &str) -> Closed {
    assert_eq!(spans.len(), 1, "{what}: {spans:#?}");
    spans.remove(0)
}

/// Asserts each `(field, value)` of a closed span.
fn fields(c: &Closed, want: &[(&str, String)]) {
    for (name, value) in want {
        assert_eq!(
            field(c, name),
            value.as_str(),
            "span {} field {name}",
            c.name
        );
    }
}

fn field<'a>(c: &'a Closed, name: &str) -> &'a str {
    c.fields
        .get(name)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("span {} has no field {name}: {c:#?}", c.name))
}

#[test]
fn operations_open_spans_with_their_outcome() {
    let collect = Collect::default();
    let subscriber = tracing_subscriber::registry().with(collect.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let t = local(config());
        let s = &t.store;
        let id = identity("spans");
        let snap = turn(41, 2048);
        let c = ctx(&id, 41, 2048);
        let short = |hex: String| hex[..12].to_string();
        let ns = short(id.namespace().hex());

        let receipt = publish_base(s, &id, c, snap.clone(), RootFormat::V2).await;
        collect.info(
            "publish",
            "publish",
            &[
                ("namespace", ns.to_string()),
                ("context", short(c.hex())),
                ("schema", root::SCHEMA_V2_2.to_string()),
                ("outcome", "created".to_string()),
                ("bytes", receipt.payload_len.to_string()),
                ("delta", "false".to_string()),
            ],
        );
        assert!(!collect.take("write_v2").is_empty(), "inner write span");

        assert_eq!(restore_bytes(s, &id, c).await, snap.encoded());
        let r = collect.info(
            "restore",
            "restore hit",
            &[
                ("namespace", ns.to_string()),
                ("context", short(c.hex())),
                ("schema", root::SCHEMA_V2_2.to_string()),
                ("outcome", "hit".to_string()),
                ("bytes", snap.encoded().len().to_string()),
            ],
        );
        assert!(!r.fields.contains_key("reason"), "{r:#?}");
        let resolve = collect.take("resolve");
        assert!(
            resolve.iter().all(|c| c.level == Level::DEBUG) && !resolve.is_empty(),
            "{resolve:#?}"
        );

        let unknown = ctx(&id, 42, 2048);
        let miss = s
            .restore((&id, unknown), Default::default())
            .await
            .expect("restore");
        assert_eq!(miss.miss(), Some(&MissReason::Absent));
        let r = one(collect.take("restore"), "restore miss");
        fields(
            &r,
            &[
                ("context", short(unknown.hex())),
                ("outcome", "miss".to_string()),
                ("reason", "absent".to_string()),
                ("schema", "unknown".to_string()),
            ],
        );
        assert!(!r.fields.contains_key("bytes"), "{r:#?}");

        let mut pool = vec![0u8; snap.encoded().len()];
        s.restore_into((&id, c), &mut pool, Default::default())
            .await
            .expect("restore_into");
        let r = one(collect.take("restore_into"), "restore_into");
        assert_eq!(field(&r, "outcome"), "hit");
        assert_eq!(field(&r, "bytes"), pool.len().to_string());

        let found = s
            .lookup(&id, &[(2048, c), (4096, ctx(&id, 41, 4096))])
            .await
            .expect("lookup");
        assert_eq!(found, Some((2048, c)));
        collect.info(
            "lookup",
            "lookup",
            &[
                ("namespace", ns.to_string()),
                ("candidates", "2".to_string()),
                ("found", "2048".to_string()),
            ],
        );

        let report = s.sweep(&SweepOptions::default()).await.expect("sweep");
        collect.info(
            "sweep",
            "sweep",
            &[
                ("roots", "1".to_string()),
                ("checked", report.checked.to_string()),
                ("corrupt", "0".to_string()),
                ("dry_run", "false".to_string()),
            ],
        );
    });
}
