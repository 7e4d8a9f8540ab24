//! A PostgreSQL ledger URL, read exactly as the driver reads it, and the
//! only forms of it that ever leave the process.
//!
//! Why a parser of our own in front of the driver's: the URL carries
//! settings we act on (`sslmode`, `sslrootcert`: `tls.rs`) and secrets we
//! must never write anywhere (the password). Matching parameter names as
//! raw text, as this code once did, let `ssl%6Dode=disable` slip past the
//! TLS check while the driver, which percent-decodes names, turned TLS
//! off. So the query is decoded here the way tokio-postgres decodes it
//! (percent-decoding of names and values, no `+` for space, UTF-8), a name
//! given twice is refused (the driver would silently keep the last), and
//! the URL handed to the driver is rebuilt from the decoded pairs: the
//! driver sees exactly the parameters this module judged.
//!
//! What leaves the process:
//! - [`LedgerUrl::identity`] — engine, host(s), port(s) and database:
//!   what the store's binding records and `ledger show` prints. Never a
//!   user name, a password or any query parameter.
//! - [`LedgerUrl::redacted`] — the URL with every secret value replaced by
//!   `***` (the user-info password and the [`SECRET_PARAMS`]): what errors,
//!   logs and `config show` print.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::error::LedgerError;

/// Query parameters whose values are secrets. The driver knows only
/// `password`; libpq's `sslpassword` (the client key's passphrase) is
/// refused by the driver as unknown, but a URL written for libpq may carry
/// it, so it is redacted as well.
pub(crate) const SECRET_PARAMS: &[&str] = &["password", "sslpassword"];

/// Characters left as they are when a decoded name or value is written
/// back for the driver (RFC 3986's unreserved set); everything else is
/// percent-encoded, so no byte can change meaning on the way.
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A `postgres://` (or `postgresql://`) ledger URL, split and decoded.
pub(crate) struct LedgerUrl {
    /// `postgres` or `postgresql`.
    scheme: String,
    /// The user-info's user name, decoded (empty: none given).
    user: Option<String>,
    /// Whether the user-info has a password, and if so whether it is the
    /// `***` mask a shown form writes (its value is kept only in
    /// [`LedgerUrl::driver_url`]'s input, never shown).
    password_masked: Option<bool>,
    /// The authority's host list as written (`h1:5432,h2`), no user-info.
    hosts: String,
    /// The path's database name, decoded (`None`: not in the path).
    dbname: Option<String>,
    /// The part before the query, as written (the driver parses it).
    base: String,
    /// The query's parameters in order, names and values decoded; no name
    /// twice.
    params: Vec<(String, String)>,
}

impl std::fmt::Debug for LedgerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl LedgerUrl {
    /// Splits and decodes `url`. Fails, without echoing the URL, on another
    /// scheme, a parameter without `=`, a name or value that is not UTF-8
    /// once decoded, or a name given twice.
    pub(crate) fn parse(url: &str) -> Result<LedgerUrl, LedgerError> {
        let shown = shown_base(url);
        let bad = |m: String| LedgerError::Url(format!("{shown}: {m}"));
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| *s == "postgres" || *s == "postgresql")
            .ok_or_else(|| bad("not a postgres:// or postgresql:// URL".into()))?;
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let rest = rest.split('?').next().unwrap_or("");
        // The driver takes the user-info up to the first `@`, then the
        // hosts up to the first `/`.
        let (userinfo, hostpath) = match rest.split_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (user, password_masked) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (name, pw) = match u.split_once(':') {
                    Some((n, p)) => (n, Some(p == "***")),
                    None => (u, None),
                };
                (
                    Some(decode(name).map_err(|e| bad(format!("user name: {e}")))?),
                    pw,
                )
            }
        };
        let (hosts, path) = match hostpath.split_once('/') {
            Some((h, p)) => (h, Some(p)),
            None => (hostpath, None),
        };
        let dbname = match path.filter(|p| !p.is_empty()) {
            Some(p) => Some(decode(p).map_err(|e| bad(format!("database name: {e}")))?),
            None => None,
        };
        let mut params: Vec<(String, String)> = Vec::new();
        for raw in query.split('&').filter(|p| !p.is_empty()) {
            let Some((k, v)) = raw.split_once('=') else {
                let name = decode(raw).unwrap_or_else(|_| "?".into());
                return Err(bad(format!("parameter {name:?} has no value")));
            };
            let name = decode(k).map_err(|e| bad(format!("a parameter name: {e}")))?;
            let value = decode(v).map_err(|e| bad(format!("parameter {name}: {e}")))?;
            if params.iter().any(|(n, _)| *n == name) {
                return Err(bad(format!(
                    "parameter {name} is given twice (after percent-decoding); give it once"
                )));
            }
            params.push((name, value));
        }
        Ok(LedgerUrl {
            scheme: scheme.to_string(),
            user,
            password_masked,
            hosts: hosts.to_string(),
            dbname,
            base: base.to_string(),
            params,
        })
    }

    /// The decoded value of parameter `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The URL for the driver: the part before the query as written, and
    /// the parameters `keep` returns (`None` drops one; `Some(v)` passes
    /// it with value `v`), each name and value percent-encoded again, so
    /// the driver decodes exactly the pairs this module judged.
    pub(crate) fn driver_url(&self, keep: impl Fn(&str, &str) -> Option<String>) -> String {
        let kept: Vec<String> = self
            .params
            .iter()
            .filter_map(|(n, v)| {
                keep(n, v).map(|v| {
                    format!(
                        "{}={}",
                        utf8_percent_encode(n, ENCODE),
                        utf8_percent_encode(&v, ENCODE)
                    )
                })
            })
            .collect();
        if kept.is_empty() {
            self.base.clone()
        } else {
            format!("{}?{}", self.base, kept.join("&"))
        }
    }

    /// Engine, hosts, ports and database: `postgres://HOST[:PORT][,…]/DB`
    /// (hosts, ports and database from the authority and path, or from the
    /// `host`, `port` and `dbname` parameters when given there). What the
    /// store's binding records: no user, no password, no parameter.
    pub(crate) fn identity(&self) -> String {
        let hosts = match self.get("host") {
            Some(h) => h.to_string(),
            None => self.hosts.clone(),
        };
        let hosts = match self.get("port") {
            Some(p) if !hosts.contains(':') => hosts
                .split(',')
                .map(|h| format!("{h}:{p}"))
                .collect::<Vec<_>>()
                .join(","),
            _ => hosts,
        };
        let db = self
            .get("dbname")
            .map(str::to_string)
            .or_else(|| self.dbname.clone())
            .unwrap_or_default();
        format!("postgres://{hosts}/{}", utf8_percent_encode(&db, ENCODE))
    }

    /// The URL with every secret value replaced by `***`: the user-info's
    /// password and the values of [`SECRET_PARAMS`]. Other parameters are
    /// shown decoded and encoded again (so `ssl%6Dode` shows as `sslmode`).
    pub(crate) fn redacted(&self) -> String {
        let user = match (&self.user, self.password_masked.is_some()) {
            (None, _) => String::new(),
            (Some(u), false) => format!("{}@", utf8_percent_encode(u, ENCODE)),
            (Some(u), true) => format!("{}:***@", utf8_percent_encode(u, ENCODE)),
        };
        let path = match &self.dbname {
            Some(d) => format!("/{}", utf8_percent_encode(d, ENCODE)),
            None => String::new(),
        };
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(n, v)| {
                let v = if is_secret(n) {
                    "***".to_string()
                } else {
                    utf8_percent_encode(v, ENCODE).to_string()
                };
                format!("{}={v}", utf8_percent_encode(n, ENCODE))
            })
            .collect();
        let query = if params.is_empty() {
            String::new()
        } else {
            format!("?{}", params.join("&"))
        };
        format!("{}://{user}{}{path}{query}", self.scheme, self.hosts)
    }
}

/// Whether parameter `name` (decoded) holds a secret.
pub(crate) fn is_secret(name: &str) -> bool {
    SECRET_PARAMS.contains(&name)
}

/// Whether `text` (a stored binding's description) is a ledger URL that
/// shows a secret: a [`SECRET_PARAMS`] value other than `***`, or a
/// user-info password other than `***`. Older versions recorded the URL
/// with its query in the binding.
pub(crate) fn holds_secret(text: &str) -> bool {
    let Ok(u) = LedgerUrl::parse(text) else {
        return false;
    };
    u.password_masked == Some(false) || u.params.iter().any(|(n, v)| is_secret(n) && v != "***")
}

/// `s` percent-decoded as the driver decodes it (no `+` for space), as
/// UTF-8.
fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|e| format!("not UTF-8 once percent-decoded ({e})"))
}

/// What a message may show of a URL that did not parse: its scheme and
/// hosts, never its user-info or query.
fn shown_base(url: &str) -> String {
    let before_query = url.split('?').next().unwrap_or("");
    match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let after_user = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let hosts = after_user.split('/').next().unwrap_or("");
            format!("{scheme}://{hosts}/…")
        }
        None => "the ledger URL".into(),
    }
}

/// How a ledger setting may be shown anywhere (errors, logs, `config
/// show`): a PostgreSQL URL with the values of its secrets — the
/// user-info password, `password=`, `sslpassword=` — as `***` (names
/// shown decoded; a URL that does not parse shows its scheme and hosts
/// only); any other setting (`sqlite:///path`, a path) as it is.
pub fn redact_ledger_url(setting: &str) -> String {
    if setting.starts_with("postgres://") || setting.starts_with("postgresql://") {
        match LedgerUrl::parse(setting) {
            Ok(u) => u.redacted(),
            Err(_) => shown_base(setting),
        }
    } else {
        setting.to_string()
    }
}

/// The `statement_timeout` the driver's `options` (the server's run-time
/// parameters, `-c name=value` or `--name=value`, as the URL's `options=`
/// gives them) set, if any: a number of milliseconds, or with a unit
/// (`ms`, `s`, `min`), as PostgreSQL reads it. `0` (no limit) is refused:
/// a ledger call must have a deadline.
pub(crate) fn statement_timeout(options: &str) -> Result<Option<std::time::Duration>, LedgerError> {
    let mut found = None;
    let mut words = options.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next().unwrap_or("")
        } else if let Some(rest) = w.strip_prefix("-c") {
            rest
        } else if let Some(rest) = w.strip_prefix("--") {
            rest
        } else {
            continue;
        };
        let Some((name, value)) = setting.split_once('=') else {
            continue;
        };
        if name.trim().replace('-', "_") != "statement_timeout" {
            continue;
        }
        let v = value.trim().trim_matches('\'').to_ascii_lowercase();
        let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = v[digits.len()..].trim();
        let n: u64 = digits.trim().parse().map_err(|_| {
            LedgerError::Url(format!("statement_timeout={value:?} is not a duration"))
        })?;
        let ms = match unit {
            "" | "ms" => Some(n),
            "s" => n.checked_mul(1000),
            "min" => n.checked_mul(60_000),
            _ => None,
        }
        .ok_or_else(|| {
            LedgerError::Url(format!(
                "statement_timeout={value:?}: use a number of ms, or ms, s or min"
            ))
        })?;
        if ms == 0 {
            return Err(LedgerError::Url(
                "statement_timeout=0 (no limit) is refused: every ledger call needs a deadline"
                    .into(),
            ));
        }
        found = Some(std::time::Duration::from_millis(ms));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_timeout_is_read_from_the_options_as_the_server_reads_it() {
        let ms = |o: &str| statement_timeout(o).map(|d| d.map(|d| d.as_millis()));
        assert_eq!(ms("").expect("none"), None);
        assert_eq!(ms("-c search_path=x").expect("other"), None);
        assert_eq!(ms("-c statement_timeout=1500").expect("ms"), Some(1500));
        assert_eq!(ms("-cstatement_timeout=2s").expect("s"), Some(2000));
        assert_eq!(ms("--statement-timeout=1min").expect("min"), Some(60_000));
        assert_eq!(
            ms("-c statement_timeout=5s -c statement_timeout=250ms")
                .expect("last wins, as in the server"),
            Some(250)
        );
        for bad in [
            "-c statement_timeout=0",
            "-c statement_timeout=soon",
            "-c statement_timeout=5h",
        ] {
            assert!(statement_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_values_are_decoded_as_the_driver_decodes_them() {
        let u = LedgerUrl::parse("postgres://u@h/db?ssl%6Dode=disable&application_name=a+b%20c")
            .expect("parse");
        assert_eq!(u.get("sslmode"), Some("disable"));
        assert_eq!(u.get("application_name"), Some("a+b c"), "no + for space");
        // Rebuilt for the driver: the decoded names, encoded again.
        let d = u.driver_url(|_, v| Some(v.to_string()));
        assert_eq!(
            d,
            "postgres://u@h/db?sslmode=disable&application_name=a%2Bb%20c"
        );
    }

    #[test]
    fn a_name_given_twice_is_refused_whatever_its_encoding() {
        for q in [
            "sslmode=require&sslmode=disable",
            "sslmode=verify-full&ssl%6Dode=disable",
            "%73%73%6c%6d%6f%64%65=disable&sslmode=require",
            "password=a&pass%77ord=b",
        ] {
            let e = LedgerUrl::parse(&format!("postgres://u:pw@h/db?{q}"))
                .expect_err(q)
                .to_string();
            assert!(e.contains("given twice"), "{q}: {e}");
            assert!(!e.contains(":pw@"), "{e}");
        }
    }

    #[test]
    fn secrets_never_appear_in_the_shown_forms() {
        let url = "postgres://alice:hunter2@db.internal:5433/ledger?sslmode=require&password=s3cr%65t&sslpassword=k3y&application_name=x";
        let u = LedgerUrl::parse(url).expect("parse");
        let (id, red, dbg) = (u.identity(), u.redacted(), format!("{u:?}"));
        for shown in [&id, &red, &dbg, &redact_ledger_url(url)] {
            for secret in ["hunter2", "s3cret", "s3cr%65t", "k3y"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
        }
        assert_eq!(id, "postgres://db.internal:5433/ledger");
        assert_eq!(
            red,
            "postgres://alice:***@db.internal:5433/ledger?sslmode=require&password=***&sslpassword=***&application_name=x"
        );
        // Errors show no more than scheme and hosts.
        let e = LedgerUrl::parse("postgres://alice:hunter2@h/db?password=s3cret&password=x")
            .expect_err("twice")
            .to_string();
        assert!(!e.contains("hunter2") && !e.contains("s3cret"), "{e}");
        let e = LedgerUrl::parse("postgres://alice:hunter2@h/db?password")
            .expect_err("no value")
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(
            redact_ledger_url("postgres://a:hunter2@h/db?password=%ff"),
            "postgres://h/…"
        );
        assert_eq!(redact_ledger_url("sqlite:///x/l.db"), "sqlite:///x/l.db");
    }

    #[test]
    fn identity_takes_hosts_ports_and_database_from_parameters_too() {
        let u = LedgerUrl::parse("postgres:///?host=a,b&port=6543&dbname=acct&user=u&password=p")
            .expect("parse");
        assert_eq!(u.identity(), "postgres://a:6543,b:6543/acct");
        let u = LedgerUrl::parse("postgresql://u@h1:1,h2:2/d").expect("parse");
        assert_eq!(u.identity(), "postgres://h1:1,h2:2/d");
    }

    #[test]
    fn a_description_that_shows_a_secret_is_recognised() {
        assert!(holds_secret(
            "postgres://u:***@h/db?sslmode=disable&password=s3cret"
        ));
        assert!(holds_secret("postgres://u:pw@h/db"));
        assert!(!holds_secret(
            "postgres://u:***@h/db?sslmode=disable&password=***"
        ));
        assert!(!holds_secret("postgres://h:5432/db"));
        assert!(!holds_secret("sqlite on host x: /var/l.sqlite3"));
    }

    #[test]
    fn other_schemes_and_malformed_parameters_are_refused() {
        assert!(LedgerUrl::parse("mysql://h/db").is_err());
        assert!(LedgerUrl::parse("postgres://h/db?sslmode").is_err());
        assert!(LedgerUrl::parse("postgres://h/db?sslmode=%ff").is_err());
    }
}
