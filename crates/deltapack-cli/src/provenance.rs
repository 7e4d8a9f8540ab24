//! Where each store setting came from: the command's clap matches, and
//! the choice of flag or environment over file over default for one
//! option, recorded for `deltapack config show`.
//!
//! Owns the kept matches ([`set_matches`]) and the provenance of values.
//! It must never know the options themselves: those are `settings`'.

use std::sync::OnceLock;

use anyhow::{bail, Result};
use clap::parser::ValueSource;
use serde::Serialize;

/// The matches of the command being run (the innermost subcommand).
static MATCHES: OnceLock<clap::ArgMatches> = OnceLock::new();

/// Keeps the innermost subcommand's matches for [`source_of`].
pub(crate) fn set_matches(top: &clap::ArgMatches) {
    let mut m = top;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    let _ = MATCHES.set(m.clone());
}

/// Whether the running command was given `--json` (for error output).
pub(crate) fn json_requested() -> bool {
    MATCHES
        .get()
        .and_then(|m| m.try_get_one::<bool>("json").ok().flatten().copied())
        .unwrap_or(false)
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    /// A command-line flag.
    Flag,
    /// A `DELTAPACK_*` environment variable.
    Env,
    /// The configuration file.
    File,
    /// The built-in default.
    Default,
}

impl Source {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::File => "file",
            Source::Default => "default",
        }
    }
}

/// How clap filled the argument `id` (None when not given or unknown).
pub(crate) fn source_of(id: &str) -> Option<ValueSource> {
    MATCHES
        .get()
        .and_then(|m| m.try_contains_id(id).ok().filter(|c| *c).map(|_| m))
        .and_then(|m| m.value_source(id))
}

/// Chooses flag/env over file over default for one option.
pub(crate) fn pick<T: Clone>(id: &str, cli: &Option<T>, file: &Option<T>) -> Option<(T, Source)> {
    match (cli, source_of(id)) {
        (Some(v), Some(ValueSource::EnvVariable)) => Some((v.clone(), Source::Env)),
        (Some(v), Some(ValueSource::DefaultValue)) => match file {
            Some(f) => Some((f.clone(), Source::File)),
            None => Some((v.clone(), Source::Default)),
        },
        // A value not from the environment nor a default is the flag's
        // (also when no matches were kept, as in unit tests).
        (Some(v), _) => Some((v.clone(), Source::Flag)),
        (None, _) => file.clone().map(|f| (f, Source::File)),
    }
}

/// One resolved option, as `config show` prints it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Setting {
    /// The flag's (and file key's) name.
    pub(crate) name: &'static str,
    /// The environment variable.
    pub(crate) env: String,
    /// The value as text (human units; `none` when unset).
    pub(crate) value: String,
    /// Where it came from.
    pub(crate) source: Source,
}

fn env_name(name: &str) -> String {
    format!("DELTAPACK_{}", name.replace('-', "_").to_uppercase())
}

/// Collects resolved settings for `config show`.
#[derive(Default)]
pub(crate) struct Shown(pub(crate) Vec<Setting>);

impl Shown {
    pub(crate) fn push(&mut self, name: &'static str, value: String, source: Source) {
        self.0.push(Setting {
            name,
            env: env_name(name),
            value,
            source,
        });
    }

    /// Resolves the option `name` (flag or environment, then file, then
    /// `default`) and records it as `show` writes it.
    pub(crate) fn value<T: Clone>(
        &mut self,
        name: &'static str,
        cli: &Option<T>,
        file: &Option<T>,
        default: T,
        show: impl FnOnce(&T) -> String,
    ) -> T {
        let (v, src) = pick(&arg_id(name), cli, file).unwrap_or((default, Source::Default));
        self.push(name, show(&v), src);
        v
    }

    /// Resolves the option `name`, which has no default (`None` when no
    /// source gives it), and records it as `show` writes it.
    pub(crate) fn optional<T: Clone>(
        &mut self,
        name: &'static str,
        cli: &Option<T>,
        file: &Option<T>,
        show: impl FnOnce(Option<&T>) -> String,
    ) -> Option<T> {
        let picked = pick(&arg_id(name), cli, file);
        let src = picked.as_ref().map_or(Source::Default, |(_, s)| *s);
        let v = picked.map(|(v, _)| v);
        self.push(name, show(v.as_ref()), src);
        v
    }

    /// [`Shown::value`] for a request count; refuses 0.
    pub(crate) fn count(
        &mut self,
        name: &'static str,
        cli: &Option<usize>,
        file: &Option<usize>,
        default: usize,
    ) -> Result<usize> {
        let v = self.value(name, cli, file, default, |v| v.to_string());
        if v == 0 {
            bail!("{name} must be at least 1");
        }
        Ok(v)
    }
}

/// The clap argument id of the option `name` (its field name).
fn arg_id(name: &str) -> String {
    name.replace('-', "_")
}
