//! `deltapack publish`: one snapshot, flat or as a delta, with a receipt.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::ArgGroup;
use deltapack_format::{ContextDigest, ContextHasher};
use deltapack_store::{
    BaseInput, PublishOutcome, PublishReceipt, PublishRequest, RootFormat, Store,
};

use crate::common;

/// Root schema to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FormatArg {
    /// `deltapack-page-delta-manifest/v2`: ordered extents (production).
    V2,
    /// Legacy `deltapack-page-delta-manifest/v1`: one object per 256-token
    /// logical chunk.
    V1,
}

impl FormatArg {
    /// The store's root format.
    pub(crate) fn root_format(self) -> RootFormat {
        match self {
            FormatArg::V2 => RootFormat::V2,
            FormatArg::V1 => RootFormat::V1,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("target").args(["tokens", "context"]).required(true)))]
#[command(group(ArgGroup::new("base_id").args(["base_context", "base_tokens"]).requires("base_snapshot")))]
pub(crate) struct PublishArgs {
    #[command(flatten)]
    store: crate::settings::StoreArgs,
    /// Cache identity JSON file (see `deltapack identity --example`).
    #[arg(long, value_name = "FILE")]
    identity: PathBuf,
    /// Token ids of the conversation (u32 LE); the context digest is derived
    /// from them and their count must equal the snapshot's boundary.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Context digest (64 hex) instead of --tokens.
    #[arg(long, value_name = "HEX")]
    context: Option<String>,
    /// The encoded snapshot to publish.
    #[arg(long, value_name = "FILE", required_unless_present = "tail")]
    snapshot: Option<PathBuf>,
    /// Publish only the turn's new pages (instead of --snapshot): for every
    /// group and layer in payload order, the pages from the base's settled
    /// pages (those wholly below its boundary) to the new page count. Needs
    /// --tokens (the new boundary is their count) and --base-snapshot with
    /// its tokens or context; the base is proven against the turn state
    /// its root records (about one page per layer read and hashed; the
    /// whole base under a root written before turn states were recorded),
    /// the tail only read and written.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["snapshot", "context", "format"], requires_all = ["tokens", "base_snapshot"])]
    tail: Option<PathBuf>,
    /// Publish as a delta against this (already published) base snapshot.
    #[arg(long, value_name = "FILE", requires = "base_id")]
    base_snapshot: Option<PathBuf>,
    /// Context digest of the base root (64 hex).
    #[arg(long, value_name = "HEX")]
    base_context: Option<String>,
    /// Token ids of the base (u32 LE) instead of --base-context.
    #[arg(long, value_name = "FILE")]
    base_tokens: Option<PathBuf>,
    /// Root schema to write.
    #[arg(long, value_enum, default_value = "v2")]
    format: FormatArg,
    #[command(flatten)]
    extents: crate::settings::ExtentArgs,
    #[command(flatten)]
    chain: crate::settings::ChainArgs,
    /// Print the receipt as JSON.
    #[arg(long)]
    json: bool,
}

impl PublishArgs {
    /// Opens the store with these options (the extent and chain ones too).
    fn open_store(&self) -> Result<Store> {
        crate::settings::resolve(&self.store, Some(&self.extents), Some(&self.chain))?.open()
    }

    /// The base root's context: `--base-context`, else the digest of
    /// `--base-tokens` (returned too), whose count must be the base
    /// snapshot's `boundary`.
    fn base_context(
        &self,
        hasher: &ContextHasher,
        boundary: u64,
    ) -> Result<(ContextDigest, Option<Vec<u32>>)> {
        match (&self.base_context, &self.base_tokens) {
            (Some(hex), _) => Ok((common::parse_context(hex)?, None)),
            (None, Some(path)) => {
                let t = common::read_tokens(path)?;
                if t.len() as u64 != boundary {
                    bail!(
                        "{} holds {} tokens but the base snapshot covers {}",
                        path.display(),
                        t.len(),
                        boundary
                    );
                }
                Ok((hasher.digest(&t), Some(t)))
            }
            (None, None) => bail!("--base-snapshot needs --base-context or --base-tokens"),
        }
    }
}

/// Runs `deltapack publish`.
pub(crate) async fn run(args: PublishArgs) -> Result<ExitCode> {
    let identity = common::read_identity(&args.identity)?;
    let ns = identity.namespace();
    let hasher = ContextHasher::new(ns, identity.chunk_tokens)?;
    if let Some(tail) = &args.tail {
        return run_tail(&args, identity, &hasher, tail).await;
    }
    let Some(snapshot_path) = &args.snapshot else {
        bail!("give --snapshot or --tail");
    };
    let file = common::open_snapshot(snapshot_path).await?;
    let snapshot = file.header().clone();

    let mut tokens = None;
    let context = match (&args.context, &args.tokens) {
        (Some(hex), _) => common::parse_context(hex)?,
        (None, Some(path)) => {
            let t = common::read_tokens(path)?;
            if t.len() as u64 != snapshot.boundary {
                bail!(
                    "{} holds {} tokens but the snapshot covers {}: the context would not name this snapshot",
                    path.display(),
                    t.len(),
                    snapshot.boundary
                );
            }
            let c = hasher.digest(&t);
            tokens = Some(t);
            c
        }
        (None, None) => bail!("give --tokens or --context"),
    };

    let store = args.open_store()?;
    let format = args.format.root_format();
    if args.base_snapshot.is_none() && format == RootFormat::V2 && store.tier_store().is_none() {
        // Flat: straight from the file, each extent read once with
        // `pread` into a staging buffer, named, hashed and written from
        // there (never mapped).
        let pb = common::byte_bar("publishing");
        let progress = |done: u64, total: u64| {
            pb.set_length(total);
            pb.set_position(done);
        };
        let receipt = store
            .publish_file(&identity, context, Arc::new(file), &progress)
            .await;
        common::persist_counters(&store).await;
        pb.finish_and_clear();
        return report(&args, receipt?);
    }
    // A delta, a v1 root or a tier: the snapshot is read whole into
    // memory of its own (never mapped).
    let snapshot = Arc::new(common::read_whole(Arc::new(file)).await?);
    let base = match &args.base_snapshot {
        None => None,
        Some(path) => {
            let base_snapshot =
                common::read_whole(Arc::new(common::open_snapshot(path).await?)).await?;
            let (base_context, base_tokens) =
                args.base_context(&hasher, base_snapshot.boundary())?;
            if let (Some(full), Some(t)) = (&tokens, &base_tokens) {
                if !full.starts_with(t) {
                    tracing::warn!(
                        "the base tokens are not a prefix of the tokens: publishing a delta between unrelated conversations"
                    );
                }
            }
            Some(BaseInput {
                context: base_context,
                snapshot: Arc::new(base_snapshot),
            })
        }
    };

    let req = PublishRequest {
        identity,
        context,
        snapshot,
        base,
        format,
    };
    let pb = common::byte_bar("publishing");
    let progress = |done: u64, total: u64| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let receipt = store.publish_with_progress(req, &progress).await;
    common::persist_counters(&store).await;
    pb.finish_and_clear();
    report(&args, receipt?)
}

/// `publish --tail`: the turn after the base, from its new pages alone.
async fn run_tail(
    args: &PublishArgs,
    identity: deltapack_format::CacheIdentity,
    hasher: &ContextHasher,
    tail: &std::path::Path,
) -> Result<ExitCode> {
    let (Some(tpath), Some(bpath)) = (&args.tokens, &args.base_snapshot) else {
        bail!("--tail needs --tokens and --base-snapshot");
    };
    let tokens = common::read_tokens(tpath)?;
    let context = hasher.digest(&tokens);
    let base_file = Arc::new(common::open_snapshot(bpath).await?);
    let (base_context, _) = args.base_context(hasher, base_file.boundary())?;
    // Read later, once, with `pread` straight into the buffer the turn is
    // staged in (never mapped): a tail is new pages only.
    let tail_path = tail.to_path_buf();
    let tail = Arc::new(
        common::blocking(move || {
            deltapack_store::TailFile::open(&tail_path)
                .with_context(|| format!("tail file {}", tail_path.display()))
        })
        .await?,
    );
    let store = args.open_store()?;
    let out: Result<PublishReceipt> = async {
        // The base as far as proving the root's turn state needs it (its
        // prefix and about a page per stream, read with `pread`); read
        // whole only for a root that records no turn state.
        let f = base_file.clone();
        let base = Arc::new(common::blocking(move || Ok(f.read_for_turn()?)).await?);
        let turn = match store.turn_from(&identity, base_context, &base).await {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "the sparse base does not prove the turn state; reading it whole");
                let whole = Arc::new(common::read_whole(base_file).await?);
                store.turn_from(&identity, base_context, &whole).await?
            }
        };
        drop(base);
        Ok(store
            .publish_turn_file(&turn, identity, context, tokens.len() as u64, tail)
            .await?)
    }
    .await;
    common::persist_counters(&store).await;
    report(args, out?)
}

/// Prints a receipt; a conflict is an error.
fn report(args: &PublishArgs, receipt: PublishReceipt) -> Result<ExitCode> {
    if args.json {
        common::print_json(&receipt_json(&receipt)?)?;
    } else {
        print!("{}", receipt_text(&receipt));
    }
    if let Some(conflict) = receipt.conflict_message() {
        return Err(crate::exit::Conflict(conflict).into());
    }
    Ok(ExitCode::SUCCESS)
}

/// The receipt as JSON, with millisecond fields next to the serialized
/// durations.
pub(crate) fn receipt_json(r: &PublishReceipt) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(r)?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("encode_ms".into(), common::ms(r.encode_time).into());
        obj.insert("write_ms".into(), common::ms(r.write_time).into());
        obj.insert("total_ms".into(), common::ms(r.total_time).into());
    }
    Ok(v)
}

fn outcome_label(o: PublishOutcome) -> &'static str {
    match o {
        PublishOutcome::Created => "created",
        PublishOutcome::AlreadyPresent => "already-present",
        PublishOutcome::Conflict => "conflict",
    }
}

/// A few aligned lines describing a receipt.
fn receipt_text(r: &PublishReceipt) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("outcome", outcome_label(r.outcome).to_string()),
        ("namespace", r.namespace.hex()),
        ("context", r.context.hex()),
        ("schema", r.schema.clone()),
        ("snapshot", r.snapshot_digest.to_string()),
    ];
    if let Some(existing) = r.existing_snapshot_digest {
        rows.push(("existing", existing.to_string()));
    }
    if let Some(root) = r.root_digest {
        rows.push(("root", root.to_string()));
    }
    if r.outcome == PublishOutcome::Created {
        rows.push((
            "payload",
            format!(
                "{} ({} bytes)",
                common::human_bytes(r.payload_len),
                r.payload_len
            ),
        ));
        rows.push((
            "objects",
            format!("{} written, {} reused", r.objects_written, r.objects_reused),
        ));
        rows.push((
            "chain",
            if r.rebased {
                "flat (rebased by the chain policy)".to_string()
            } else {
                format!("{} delta(s) above the flat root", r.chain_depth)
            },
        ));
        rows.push((
            "written",
            format!(
                "{} ({} bytes)",
                common::human_bytes(r.bytes_written),
                r.bytes_written
            ),
        ));
    }
    rows.push((
        "time",
        format!(
            "{:.1} ms (encode {:.1} ms, write {:.1} ms)",
            common::ms(r.total_time),
            common::ms(r.encode_time),
            common::ms(r.write_time)
        ),
    ));
    rows.into_iter()
        .map(|(k, v)| format!("{k:<10} {v}\n"))
        .collect()
}
