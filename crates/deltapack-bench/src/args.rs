//! args.rs: the command-line types the suites share — which suite runs
//! ([`Suite`]), the options of every suite ([`BenchArgs`]) and the hidden
//! child command's ([`BenchOneArgs`]). A leaf: it imports nothing from the
//! modules that read these arguments (scenarios, runner, bench_one, main).

use std::path::PathBuf;

use crate::shaped::ShapingArgs;

/// Which scenarios to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Suite {
    /// `restore`.
    Restore,
    /// `publish`.
    Publish,
    /// `chain`.
    Chain,
    /// `shaped`.
    Shaped,
    /// `all`.
    All,
}

/// The options of every suite.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Workload scale: 1 is the reference (result at 262,144 tokens, a
    /// ≈ 1.576 GB delta); F multiplies the result tokens.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) scale: f64,
    /// `s3://bucket/prefix` (with `?endpoint=…` for a local server): also
    /// publish and restore there (at --s3-scale). Without it,
    /// DELTAPACK_TEST_S3_ENDPOINT (+ DELTAPACK_TEST_S3_BUCKET) is used if set.
    /// A `file://` URL or a path instead chooses where the temporary local
    /// stores are created (default: the system temp dir).
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// Print the report as JSON on stdout (the files are written either way).
    #[arg(long)]
    pub(crate) json: bool,
    /// Directory for results.json, results.md, results.svg and machine.txt.
    #[arg(long, value_name = "DIR", default_value = "benches/results")]
    pub(crate) out: PathBuf,
    /// Repetitions of every timing (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=25))]
    pub(crate) repeats: u32,
    /// Simulated per-GET latency of the S3-like scenario, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub(crate) latency_ms: u64,
    /// The shaped S3 emulation's options.
    #[command(flatten)]
    pub(crate) shaped: ShapingArgs,
    /// Scale of the real-S3 scenario (default: min(--scale, 1/16)).
    #[arg(long, value_name = "F")]
    pub(crate) s3_scale: Option<f64>,
    /// Extent size M of the v2 stores (power of two; default 64 MiB).
    #[arg(long, value_name = "BYTES")]
    pub(crate) extent_bytes: Option<u64>,
    /// Keep the temporary stores (their path is printed).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Conversation lengths of the chain scenario (comma-separated; default
    /// 1,4,16,64,256). N = 1 (the flat root) always runs; an N larger than
    /// the final snapshot's number of chunks is skipped.
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    pub(crate) chain_turns: Option<Vec<u32>>,
    /// Before each timed child, wait up to this many seconds for the
    /// machine to be idle (other processes using < 0.3 cores over 1 s), so
    /// that a shared machine's load disturbs the figures less.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub(crate) wait_idle: u64,
}

/// The hidden child command.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchOneArgs {
    /// The job, as JSON (written by the parent `deltapack-bench`).
    #[arg(long)]
    pub(crate) job: String,
}
