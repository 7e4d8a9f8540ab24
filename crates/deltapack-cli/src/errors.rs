//! How a failed command reports its error: one line per distinct cause, a
//! hint where the fix is known, and with `--json` one JSON object on stderr
//! whose `error.kind` is stable (scripts branch on it; the message is for
//! people and may change).
//!
//! Kinds: `usage` (clap's, exit 2), `config` (a bad configuration file),
//! `bad-url`, `credentials` (no or refused S3 credentials), `backend` (the
//! object store failed), `io`, `ledger`, `format` (an input that does not
//! decode: identity, snapshot, token file), `invalid-input`, `input-changed`
//! (the snapshot or tail changed while it was being published: no root),
//! `base-mismatch`, `capacity`, `unsupported`, `conflict` (a publication
//! lost to another writer), `ledger-unavailable` (the ledger cannot be
//! reached: reads still work, publication and deletion wait for it),
//! `ledger-mismatch` (this handle's ledger is not
//! the one the store names: it may read, not publish or delete),
//! `internal`, `other`.

use deltapack_store::{ConfigFileError, OpenError, StoreError};

/// The stable kind of an error (see the module docs).
pub(crate) fn kind(e: &anyhow::Error) -> &'static str {
    if credentials_problem(e) {
        return "credentials";
    }
    for cause in e.chain() {
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return match s {
                StoreError::Open(o) => open_kind(o),
                StoreError::Io { .. } => "io",
                StoreError::Invalid(_) => "invalid-input",
                StoreError::InputChanged(_) => "input-changed",
                StoreError::Format(_) => "format",
                StoreError::BaseMismatch { .. } => "base-mismatch",
                StoreError::Capacity(_) => "capacity",
                StoreError::Ledger(deltapack_store::LedgerError::OtherStore { .. }) => {
                    "ledger-mismatch"
                }
                StoreError::Ledger(_) => "ledger",
                StoreError::LedgerUnavailable(_) => "ledger-unavailable",
                StoreError::Unsupported(_) => "unsupported",
                StoreError::LedgerMismatch { .. } => "ledger-mismatch",
                StoreError::Concurrent(_) => "conflict",
                _ => "internal",
            };
        }
        if let Some(o) = cause.downcast_ref::<OpenError>() {
            return open_kind(o);
        }
        if cause.downcast_ref::<ConfigFileError>().is_some() {
            return "config";
        }
        if cause.downcast_ref::<crate::exit::Usage>().is_some() {
            return "usage";
        }
        if cause.downcast_ref::<crate::exit::Conflict>().is_some() {
            return "conflict";
        }
        if cause.downcast_ref::<deltapack_format::Error>().is_some() {
            return "format";
        }
        if cause.downcast_ref::<object_store::Error>().is_some() {
            return "backend";
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return "io";
        }
    }
    "other"
}

fn open_kind(o: &OpenError) -> &'static str {
    match o {
        OpenError::Url { .. } => "bad-url",
        OpenError::Local { .. } => "io",
        _ => "backend",
    }
}

/// The error's messages, outermost first, each cause once: libraries often
/// include their source's text in their own message, so a cause whose text
/// the previous message already contains is dropped, and so is a repeat.
pub(crate) fn causes(e: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if out.iter().any(|prev| prev.contains(text)) {
            continue;
        }
        out.push(text.to_string());
    }
    out
}

/// Whether the error says S3 credentials are missing or refused.
fn credentials_problem(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let t = c.to_string().to_ascii_lowercase();
        t.contains("credential")
            || t.contains("invalidaccesskeyid")
            || t.contains("signaturedoesnotmatch")
            || t.contains("access key")
            // No credentials in the environment: the SDK chain fell back to
            // the instance metadata service, which is not there.
            || t.contains("169.254.169.254")
    })
}

/// A hint for errors with a known fix.
pub(crate) fn hint(e: &anyhow::Error) -> Option<String> {
    if credentials_problem(e) {
        return Some(
            "S3 credentials were not found or were refused: set AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY (and AWS_REGION; for an S3-compatible server also \
             AWS_ENDPOINT_URL or ?endpoint=… in the store URL), or run where an instance \
             profile or web identity provides them"
                .into(),
        );
    }
    if e.chain().any(|c| c.to_string().contains("NoSuchBucket")) {
        return Some(
            "the bucket does not exist: deltapack never creates buckets; create it first \
             (`aws s3 mb s3://BUCKET`, with --endpoint-url for an S3-compatible server, or \
             the server's own tool) and check the bucket name and endpoint in the store URL"
                .into(),
        );
    }
    // The ledger's own advice (PostgreSQL authentication, privileges, a
    // missing database, TLS names).
    let ledger = e
        .chain()
        .find_map(|c| match c.downcast_ref::<StoreError>() {
            Some(StoreError::Ledger(l) | StoreError::LedgerUnavailable(l)) => l.hint(),
            _ => c
                .downcast_ref::<deltapack_store::LedgerError>()
                .and_then(|l| l.hint()),
        });
    if let Some(h) = ledger {
        return Some(h.into());
    }
    let mismatch = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<StoreError>(),
            Some(StoreError::LedgerMismatch { .. })
        )
    });
    let unavailable = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<StoreError>(),
            Some(StoreError::LedgerUnavailable(_))
        )
    });
    if unavailable {
        return Some(
            "the capacity ledger cannot be reached: restore and lookup still answer from the \
             store, but publication and deletion need the ledger (they would break garbage \
             collection without it) and work again once it is back; check the database server \
             and the --ledger URL"
                .into(),
        );
    }
    if mismatch {
        return Some(
            "use the store's own ledger: --ledger URL, DELTAPACK_LEDGER or the `ledger` \
             configuration key (`deltapack ledger show --store URL` names it); if that ledger \
             is gone for good, `deltapack ledger adopt --store URL` makes this one the store's"
                .into(),
        );
    }
    None
}

/// Prints the error on stderr: text, or one JSON object with `--json`.
pub(crate) fn report(e: &anyhow::Error, json: bool) {
    let causes = causes(e);
    let hint = hint(e);
    if json {
        let v = serde_json::json!({
            "error": {
                "kind": kind(e),
                "message": causes.first().cloned().unwrap_or_default(),
                "causes": causes.get(1..).unwrap_or_default(),
                "hint": hint,
            }
        });
        eprintln!("{v}");
        return;
    }
    let mut lines = causes.iter();
    match lines.next() {
        Some(first) => eprintln!("error: {first}"),
        None => eprintln!("error: {e}"),
    }
    for c in lines {
        eprintln!("  caused by: {c}");
    }
    if let Some(h) = hint {
        eprintln!("  hint: {h}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("Generic S3 error: {0}")]
    struct Wrapper(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("Error performing token request: {0}")]
    struct Inner(#[source] Leaf);

    #[derive(Debug, thiserror::Error)]
    #[error("Missing credentials")]
    struct Leaf;

    #[test]
    fn each_cause_is_printed_once() {
        let e = anyhow::Error::new(Wrapper(Inner(Leaf))).context("cannot open store s3://b/p");
        let c = causes(&e);
        assert_eq!(
            c,
            vec![
                "cannot open store s3://b/p".to_string(),
                "Generic S3 error: Error performing token request: Missing credentials".into(),
            ],
            "{c:?}"
        );
        assert_eq!(kind(&e), "credentials");
        assert!(hint(&e).is_some_and(|h| h.contains("AWS_ACCESS_KEY_ID")));
    }

    #[test]
    fn distinct_causes_are_kept() {
        let e = anyhow::anyhow!("disk full").context("cannot write out.bin");
        assert_eq!(causes(&e), vec!["cannot write out.bin", "disk full"]);
        assert_eq!(kind(&e), "other");
        assert!(hint(&e).is_none());
    }
}
