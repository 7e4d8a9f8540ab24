//! libpq's conventions for what a PostgreSQL ledger URL leaves out: the
//! password from `PGPASSWORD` or the password file (`PGPASSFILE`, else
//! `~/.pgpass`), the user from `PGUSER`, and `PGAPPNAME`,
//! `PGCONNECT_TIMEOUT` — as `psql` reads them, so an operator's existing
//! setup works and a password need not sit in a URL (or a shell history).
//!
//! The URL always wins: a variable fills only what it leaves out. Read
//! only here, and never for what decides where the ledger is or how it is
//! protected: the host, port and database are the ledger's identity (the
//! store's binding records them, so they must be in the URL), and the TLS
//! settings come from the URL alone (`PGSSLMODE` is not read: an
//! environment variable must not be able to turn `verify-full` off).
//!
//! The password file is read as libpq reads it: lines of
//! `host:port:database:user:password`, `*` matching anything, `\:` and
//! `\\` escaping, `#` comments, the first matching line winning; on Unix a
//! file that the group or others can read is ignored (with a warning), as
//! libpq ignores it.

use std::path::{Path, PathBuf};

/// Fills what `config` leaves out from the environment `var` reads (the
/// process's, in use), with `home` the user's home directory.
pub(crate) fn apply(
    config: &mut tokio_postgres::Config,
    var: &dyn Fn(&str) -> Option<String>,
    home: Option<PathBuf>,
) {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if config.get_user().is_none() {
        if let Some(u) = set("PGUSER") {
            config.user(&u);
        }
    }
    if config.get_application_name().is_none() {
        if let Some(a) = set("PGAPPNAME") {
            config.application_name(&a);
        }
    }
    if config.get_connect_timeout().is_none() {
        let secs = set("PGCONNECT_TIMEOUT").and_then(|t| t.trim().parse::<u64>().ok());
        if let Some(s) = secs.filter(|s| *s > 0) {
            config.connect_timeout(std::time::Duration::from_secs(s));
        }
    }
    if config.get_password().is_some() {
        return;
    }
    if let Some(p) = set("PGPASSWORD") {
        config.password(p);
        return;
    }
    let file = match set("PGPASSFILE") {
        Some(f) => Some(PathBuf::from(f)),
        None => home.map(|h| h.join(".pgpass")),
    };
    let Some(file) = file else { return };
    if let Some(p) = password_from_file(&file, config) {
        config.password(p);
    }
}

/// The password the file at `path` gives `config`'s first host, port,
/// database and user, if it is readable, private and has a matching line.
fn password_from_file(path: &Path, config: &tokio_postgres::Config) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                "password file has group or world access; it is ignored (chmod 0600, as libpq requires)"
            );
            return None;
        }
    }
    let text = std::fs::read_to_string(path).ok()?;
    let host = match config.get_hosts().first()? {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => "localhost".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user()?;
    let db = config.get_dbname().unwrap_or(user);
    lookup(&text, [&host, &port, db, user])
}

/// The password of the first line of a password file's `text` whose
/// first four fields match `want` (host, port, database, user).
fn lookup(text: &str, want: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        if fields.len() < 5 {
            continue;
        }
        if fields
            .iter()
            .zip(want)
            .all(|(f, w)| f.as_str() == "*" || f.as_str() == w)
        {
            // libpq takes the rest of the line as the password (an
            // unescaped `:` in it included).
            return Some(fields[4..].join(":"));
        }
    }
    None
}

/// A password file line's fields: split at unescaped `:`, `\x` read as `x`.
fn split(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(last)) = (chars.next(), out.last_mut()) {
                    last.push(n);
                }
            }
            ':' => out.push(String::new()),
            c => {
                if let Some(last) = out.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> tokio_postgres::Config {
        url.parse().expect("url")
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn private_file(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("pgpass");
        std::fs::write(&p, text).expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        p
    }

    /// Every variable `apply` reads but the password file's.
    const ALL: &[(&str, &str)] = &[
        ("PGPASSWORD", "env-pw"),
        ("PGUSER", "v"),
        ("PGAPPNAME", "b"),
        ("PGCONNECT_TIMEOUT", "9"),
    ];

    #[test]
    fn the_url_wins_over_every_variable() {
        let mut c = config("postgres://u:url-pw@h:5433/db?application_name=a&connect_timeout=3");
        apply(&mut c, &env(ALL), None);
        assert_eq!(c.get_password(), Some(&b"url-pw"[..]));
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_application_name(), Some("a"));
        assert_eq!(
            c.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
    }

    #[test]
    fn variables_fill_what_the_url_leaves_out() {
        let mut c = config("postgres://h/db");
        apply(&mut c, &env(ALL), None);
        assert_eq!(c.get_password(), Some(&b"env-pw"[..]));
        assert_eq!(c.get_user(), Some("v"));
        assert_eq!(c.get_application_name(), Some("b"));
        assert_eq!(
            c.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(9))
        );
    }

    #[test]
    fn the_password_file_is_read_as_libpq_reads_it() {
        let dir = tempfile::tempdir().expect("dir");
        let file = private_file(
            dir.path(),
            "# comment\n\
             other:5432:db:u:not-this-host\n\
             h:5433:*:u:not-this-port\n\
             h:*:db:u:pa\\:ss:with-colon\n\
             *:*:*:*:catch-all\n",
        );
        let mut c = config("postgres://u@h/db");
        let vars = env(&[("PGPASSFILE", file.to_str().expect("utf-8"))]);
        apply(&mut c, &vars, None);
        assert_eq!(c.get_password(), Some(&b"pa:ss:with-colon"[..]));
        // Another user: the catch-all.
        let mut c = config("postgres://w@h/db");
        apply(&mut c, &vars, None);
        assert_eq!(c.get_password(), Some(&b"catch-all"[..]));
        // ~/.pgpass without PGPASSFILE.
        std::fs::rename(&file, dir.path().join(".pgpass")).expect("rename");
        let mut c = config("postgres://w@h/db");
        apply(&mut c, &env(&[]), Some(dir.path().to_path_buf()));
        assert_eq!(c.get_password(), Some(&b"catch-all"[..]));
        // PGPASSWORD before the file.
        let mut c = config("postgres://w@h/db");
        apply(
            &mut c,
            &env(&[("PGPASSWORD", "env")]),
            Some(dir.path().to_path_buf()),
        );
        assert_eq!(c.get_password(), Some(&b"env"[..]));
    }

    #[cfg(unix)]
    #[test]
    fn a_password_file_others_can_read_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let file = private_file(dir.path(), "*:*:*:*:secret\n");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut c = config("postgres://u@h/db");
        apply(
            &mut c,
            &env(&[("PGPASSFILE", file.to_str().expect("utf-8"))]),
            None,
        );
        assert_eq!(c.get_password(), None);
    }
}
