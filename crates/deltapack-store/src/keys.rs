//! The store's key layout (docs/design.md §4), in one place.
//!
//! ```text
//! objects/blake3/<hh>/<hex>            v2 extents (hh = first 2 hex chars)
//! objects/sha256/<hh>/<hex>            v1 chunk objects
//! roots/<namespace hex>/<context hex>  root envelopes (v1 and v2 share this)
//! quarantine/<original key>            objects and roots found corrupt
//! ```
//!
//! Keys are only ever built from typed digests, so they contain nothing but
//! lowercase hex and fixed words: no caller string reaches a key.

use deltapack_format::{Algorithm, CacheIdentity, ContextDigest, Digest, Namespace};
use object_store::path::Path;

/// Prefix of all objects.
pub const OBJECTS: &str = "objects";
/// Prefix of all roots.
pub const ROOTS: &str = "roots";
/// Prefix of quarantined keys.
pub const QUARANTINE: &str = "quarantine";
/// Prefix of hold markers.
pub const HOLDS: &str = "holds";

/// Names one root: the namespace (a cache identity's) and the context.
/// Everything that addresses a root takes `impl Into<RootKey>`, so a caller
/// passes `(&identity, context)` or `(namespace, context)` as it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RootKey {
    /// The namespace.
    pub namespace: Namespace,
    /// The context digest.
    pub context: ContextDigest,
}

impl RootKey {
    /// The root of `context` in `namespace`.
    pub fn new(namespace: Namespace, context: ContextDigest) -> Self {
        RootKey { namespace, context }
    }

    /// The object key the root is stored under.
    pub fn path(&self) -> Path {
        root_key(&self.namespace, &self.context)
    }
}

impl From<(Namespace, ContextDigest)> for RootKey {
    fn from((namespace, context): (Namespace, ContextDigest)) -> Self {
        RootKey { namespace, context }
    }
}

impl From<(&CacheIdentity, ContextDigest)> for RootKey {
    fn from((identity, context): (&CacheIdentity, ContextDigest)) -> Self {
        RootKey {
            namespace: identity.namespace(),
            context,
        }
    }
}

/// Names one stored object by its content address (a v2 extent's BLAKE3
/// object digest, a v1 chunk's SHA-256). Its text form is its store key,
/// `objects/<algorithm>/<hh>/<hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(pub Digest);

impl ObjectKey {
    /// The key the object is stored under.
    pub fn path(&self) -> Path {
        object_key(&self.0)
    }

    /// The object stored under `p`, if `p` is an object key.
    pub fn from_path(p: &Path) -> Option<Self> {
        parse_object_key(p).map(ObjectKey)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path())
    }
}

impl serde::Serialize for ObjectKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Key of the object named by `d`.
pub fn object_key(d: &Digest) -> Path {
    let hex = d.hex();
    Path::from(format!(
        "{OBJECTS}/{}/{}/{}",
        d.algorithm().as_str(),
        &hex[..2],
        hex
    ))
}

/// Key of the root of `(namespace, context)`.
pub fn root_key(ns: &Namespace, ctx: &ContextDigest) -> Path {
    Path::from(format!("{ROOTS}/{}/{}", ns.hex(), ctx.hex()))
}

/// Prefix of all roots of one namespace.
pub fn namespace_prefix(ns: &Namespace) -> Path {
    Path::from(format!("{ROOTS}/{}", ns.hex()))
}

/// Where a corrupt key is moved.
pub fn quarantine_key(original: &Path) -> Path {
    Path::from(format!("{QUARANTINE}/{original}"))
}

/// The name of a hold: 1–64 characters of `[A-Za-z0-9._-]`, not starting
/// with a dot, so it is exactly one safe path segment. Only
/// [`HoldName::new`] makes one, so every hold key built from it is safe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HoldName(String);

impl HoldName {
    /// `name` as a hold name, if it is a valid one (see [`valid_hold_name`]).
    pub fn new(name: &str) -> Option<Self> {
        valid_hold_name(name).then(|| HoldName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for HoldName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Key of the marker by which the hold `name` keeps `(namespace, context)`
/// from eviction.
pub fn hold_key(name: &HoldName, ns: &Namespace, ctx: &ContextDigest) -> Path {
    Path::from(format!("{HOLDS}/{name}/{}/{}", ns.hex(), ctx.hex()))
}

/// Whether `name` may name a hold: 1–64 characters of `[A-Za-z0-9._-]`,
/// not starting with a dot, so it is exactly one safe path segment.
pub fn valid_hold_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Parses a hold marker key back into `(name, namespace, context)`; `None`
/// for anything else, a name that is not a valid hold name included.
pub fn parse_hold_key(p: &Path) -> Option<(HoldName, Namespace, ContextDigest)> {
    let parts: Vec<_> = p.parts().collect();
    if parts.len() != 4 || parts[0].as_ref() != HOLDS {
        return None;
    }
    Some((
        HoldName::new(parts[1].as_ref())?,
        parts[2].as_ref().parse().ok()?,
        parts[3].as_ref().parse().ok()?,
    ))
}

/// Parses an object key back into its digest.
pub fn parse_object_key(p: &Path) -> Option<Digest> {
    let parts: Vec<_> = p.parts().collect();
    if parts.len() != 4 || parts[0].as_ref() != OBJECTS {
        return None;
    }
    let alg = match parts[1].as_ref() {
        "blake3" => Algorithm::Blake3,
        "sha256" => Algorithm::Sha256,
        _ => return None,
    };
    let d: Digest = format!("{}:{}", alg.as_str(), parts[3].as_ref())
        .parse()
        .ok()?;
    (parts[2].as_ref() == &d.hex()[..2]).then_some(d)
}

/// Parses a root key back into `(namespace, context)`.
pub fn parse_root_key(p: &Path) -> Option<(Namespace, ContextDigest)> {
    let parts: Vec<_> = p.parts().collect();
    if parts.len() != 3 || parts[0].as_ref() != ROOTS {
        return None;
    }
    Some((
        parts[1].as_ref().parse().ok()?,
        parts[2].as_ref().parse().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let d = Digest::blake3(b"x");
        let k = object_key(&d);
        assert!(k.as_ref().starts_with("objects/blake3/"));
        assert_eq!(parse_object_key(&k), Some(d));
        let s = Digest::sha256(b"x");
        assert_eq!(parse_object_key(&object_key(&s)), Some(s));
        let (ns, ctx) = (Namespace([1; 32]), ContextDigest([2; 32]));
        assert_eq!(parse_root_key(&root_key(&ns, &ctx)), Some((ns, ctx)));
        assert_eq!(parse_object_key(&Path::from("objects/blake3/zz/abc")), None);
        assert_eq!(quarantine_key(&k).as_ref(), format!("quarantine/{k}"));
        let name = HoldName::new("pinned-demo").expect("valid");
        let h = hold_key(&name, &ns, &ctx);
        assert_eq!(parse_hold_key(&h), Some((name, ns, ctx)));
        assert_eq!(HoldName::new(".x"), None);
        let stray = Path::from(format!("holds/.x/{}/{}", ns.hex(), ctx.hex()));
        assert_eq!(
            parse_hold_key(&stray),
            None,
            "a marker with an invalid name"
        );
        assert!(valid_hold_name("a.b_c-1") && !valid_hold_name(".x") && !valid_hold_name("a/b"));
    }
}
