//! `deltapack synth`: deterministic synthetic snapshots and token files.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use deltapack_format::synth::{self, Preset};

use crate::common;

/// A synthetic model geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PresetArg {
    /// The reference geometry (24 layers × 65,024 B per 256-token page plus
    /// a recurrent checkpoint; ≈ 6.1 MiB per 1,000 tokens).
    Default,
    /// KiB-sized pages for tests.
    Tiny,
}

impl PresetArg {
    /// The format crate's preset.
    pub(crate) fn preset(self) -> Preset {
        match self {
            PresetArg::Default => Preset::Default,
            PresetArg::Tiny => Preset::Tiny,
        }
    }

    /// The preset's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PresetArg::Default => "default",
            PresetArg::Tiny => "tiny",
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct SynthArgs {
    /// Tokens covered by the snapshot (its boundary). `publish` requires a
    /// multiple of the identity's chunk_tokens (256 by default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    tokens: u64,
    /// Model geometry.
    #[arg(long, value_enum, default_value = "default")]
    preset: PresetArg,
    /// Conversation seed: the same seed with more tokens extends the
    /// conversation (full pages stay byte-identical).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to write the encoded snapshot.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Also write the conversation's token ids (u32 little-endian).
    #[arg(long, value_name = "FILE")]
    tokens_out: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack synth`.
pub(crate) fn run(args: SynthArgs) -> Result<ExitCode> {
    let pb = common::spinner(format!("synthesizing {} tokens", args.tokens));
    let snap = synth::snapshot(args.preset.preset(), args.seed, args.tokens)
        .context("synthesizing the snapshot")?;
    pb.finish_and_clear();
    common::write_atomic(&args.out, snap.encoded())?;
    if let Some(path) = &args.tokens_out {
        let n = usize::try_from(args.tokens).context("token count does not fit in memory")?;
        let bytes = deltapack_format::context::tokens_to_le_bytes(&synth::tokens(args.seed, n));
        common::write_atomic(path, &bytes)?;
    }
    let digest = snap.digest();
    // What a v2.2 root records for this snapshot (the layered digest).
    let layers = deltapack_format::layer_digest::of_snapshot(&snap)
        .map(|d| d.snapshot.to_string())
        .ok();
    if args.json {
        common::print_json(&serde_json::json!({
            "out": args.out,
            "tokens_out": args.tokens_out,
            "preset": args.preset.name(),
            "seed": args.seed,
            "boundary": snap.boundary(),
            "block_counts": snap.block_counts(),
            "bytes": snap.encoded().len(),
            "digest": digest.to_string(),
            "layers_digest": layers,
        }))?;
    } else {
        // The digest a root records (and `publish`/`restore` print) first,
        // so the two can be matched; the whole-encoding digest after it.
        let recorded = layers.clone().unwrap_or_else(|| digest.to_string());
        println!(
            "wrote {}: {} tokens, preset {}, seed {}, {} ({} bytes), snapshot {recorded} (whole encoding {digest})",
            args.out.display(),
            snap.boundary(),
            args.preset.name(),
            args.seed,
            common::human_bytes(snap.encoded().len() as u64),
            snap.encoded().len(),
        );
        if let Some(path) = &args.tokens_out {
            println!(
                "wrote {}: {} token ids (u32 LE)",
                path.display(),
                args.tokens
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
