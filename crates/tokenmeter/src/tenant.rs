//! Who sent a request: the `tenant` label (`--tenant-header`, `--tenant-from-key`).
//!
//! A shared inference server is paid for by whoever uses it, so the question after "how fast"
//! is "for whom". The gateway in front usually knows (it sets a header from the API key or the
//! JWT); otherwise the API key itself tells keys apart. This module turns a request's head into
//! one bounded label value, once per request, in [`crate::proxy::inspect`]:
//!
//! 1. `--tenant-header NAME` present and not empty: its value, when it is 1 to
//!    [`MAX_TENANT_LEN`] bytes of `A-Z a-z 0-9 . _ -`; any other value is [`INVALID`] (never
//!    cut or cleaned into a name: two tenants must not merge silently, and no byte a client
//!    sends can make an invalid label).
//! 2. else, with `--tenant-from-key`, the bearer token of `Authorization: Bearer ...` (or the
//!    `x-api-key` header Anthropic's clients send) as `key-` and the first [`KEY_HEX_DIGITS`]
//!    hex digits of its SHA-256 ([`key_id`]): stable across restarts, pods and releases, and
//!    computable by whoever holds the key (`printf %s "$KEY" | sha256sum | cut -c1-12`), never
//!    the key itself.
//! 3. else [`NO_TENANT`] (`none`).
//!
//! The value then passes [`Capped`], the mechanism that bounds `model`: the first
//! `--max-tenants` values seen keep their own series, names pinned by `--tenant-allow-file`
//! always do (and take no place under the cap), every other becomes [`OTHER`]. The fixed values
//! `none`, `invalid` and `other` never take a place either: a header that names one is counted
//! under it. So the label has at most `--max-tenants` + pinned + 3 values.
//!
//! **Invariant:** neither a header's value nor a token is ever logged, here or by any caller
//! (the label value itself appears only in the exposition); a token never reaches a label, only
//! its truncated hash.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use http::header::{HeaderName, AUTHORIZATION};
use http::HeaderMap;

use crate::host::Host;
use crate::metrics::{Capped, NO_TENANT, OTHER};

/// Longest tenant name kept. A tenant id, an organisation slug or a UUID (36) fits; a longer
/// value is more likely a token pasted into the wrong header than a name, and label values
/// are repeated on every line of every series that carries them.
pub const MAX_TENANT_LEN: usize = 64;

/// `--max-tenants`' default: the same as `--max-models`'. Every tenant multiplies the series
/// of the families that carry the label (docs/tenants.md), so the cap is a budget.
pub const DEFAULT_MAX_TENANTS: usize = 32;

/// Most names an allow-list file may pin. They never count against the cap, so this is the
/// guard against pointing the flag at the wrong file (a log, a key list) and minting its lines
/// into series; a deployment with more named tenants than this wants a recording rule, not
/// labels on every histogram.
pub const MAX_PINNED: usize = 1024;

/// The value of a header that is present but no tenant name (bytes outside the charset, or
/// longer than [`MAX_TENANT_LEN`]).
pub const INVALID: &str = "invalid";

/// What a key-derived tenant id starts with, so it never reads as a header's name.
pub const KEY_PREFIX: &str = "key-";

/// Hex digits of the token's SHA-256 in a key-derived id: 48 bits, so two of a few thousand
/// keys share an id with a probability below one in ten million (birthday bound), while the id
/// says nothing about the token that could help guess it.
pub const KEY_HEX_DIGITS: usize = 12;

/// Headers whose value is a credential: never a label (`--tenant-from-key` hashes the key).
const CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
];

/// The header Anthropic's API (and its SDKs) carry the key in, instead of `Authorization`.
const API_KEY_HEADER: &str = "x-api-key";

/// The tenant settings, validated ([`Flags::build`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    /// `--tenant-header`, lowercased.
    pub header: Option<HeaderName>,
    /// `--tenant-from-key`.
    pub from_key: bool,
    /// `--max-tenants`.
    pub max: usize,
    /// `--tenant-allow-file`'s names.
    pub pinned: Vec<String>,
}

/// Why the tenant flags were refused: each names its flag.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TenantError {
    #[error("--tenant-header {0:?} is not a valid header name")]
    BadHeader(String),
    #[error("--tenant-header {0:?} carries credentials, which must never become label values: use --tenant-from-key (a hash of the key) instead")]
    CredentialHeader(String),
    #[error("--{0} needs --tenant-header or --tenant-from-key")]
    NoSource(&'static str),
    #[error("--max-tenants must be at least 1")]
    Zero,
    #[error("--tenant-allow-file {0}: cannot read it: {1}")]
    Unreadable(String, String),
    #[error("--tenant-allow-file {file} line {line}: not a tenant name (1 to {MAX_TENANT_LEN} of A-Z a-z 0-9 . _ -)")]
    BadName { file: String, line: usize },
    #[error("--tenant-allow-file {file} line {line}: {name:?} is a fixed value (none, invalid, other), not a tenant")]
    Reserved {
        file: String,
        line: usize,
        name: String,
    },
    #[error("--tenant-allow-file {0}: more than {MAX_PINNED} names")]
    TooMany(String),
}

/// The raw tenant flags, as `config` has them.
#[derive(Debug, Clone, Default)]
pub struct Flags<'a> {
    pub header: Option<&'a str>,
    pub from_key: bool,
    /// `None`: not given ([`DEFAULT_MAX_TENANTS`]).
    pub max: Option<usize>,
    pub allow_file: Option<&'a Path>,
}

impl Flags<'_> {
    /// The validated settings, `None` when no tenant source is given (the label does not
    /// exist). The allow-list file is read through `host`.
    pub fn build(&self, host: &dyn Host) -> Result<Option<TenantConfig>, TenantError> {
        let header = match self.header.map(str::trim) {
            None | Some("") => None,
            Some(h) => {
                let name = HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| TenantError::BadHeader(h.to_string()))?;
                if CREDENTIAL_HEADERS.contains(&name.as_str()) {
                    return Err(TenantError::CredentialHeader(h.to_string()));
                }
                Some(name)
            }
        };
        if header.is_none() && !self.from_key {
            if self.max.is_some() {
                return Err(TenantError::NoSource("max-tenants"));
            }
            if self.allow_file.is_some() {
                return Err(TenantError::NoSource("tenant-allow-file"));
            }
            return Ok(None);
        }
        let max = self.max.unwrap_or(DEFAULT_MAX_TENANTS);
        if max == 0 {
            return Err(TenantError::Zero);
        }
        let pinned = match self.allow_file {
            None => Vec::new(),
            Some(path) => {
                let file = path.display().to_string();
                let text = host
                    .read_file(path)
                    .map_err(|e| TenantError::Unreadable(file.clone(), e.to_string()))?;
                parse_allow_list(&file, &text)?
            }
        };
        Ok(Some(TenantConfig {
            header,
            from_key: self.from_key,
            max,
            pinned,
        }))
    }
}

/// The names of an allow-list file: one a line, `#` starts a comment, blank lines skipped.
pub fn parse_allow_list(file: &str, text: &str) -> Result<Vec<String>, TenantError> {
    let mut names = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let name = line.split('#').next().unwrap_or("").trim();
        if name.is_empty() {
            continue;
        }
        let at = || (file.to_string(), i + 1);
        if !is_name(name.as_bytes()) {
            let (file, line) = at();
            return Err(TenantError::BadName { file, line });
        }
        if fixed(name).is_some() {
            let (file, line) = at();
            let name = name.to_string();
            return Err(TenantError::Reserved { file, line, name });
        }
        if seen.insert(name) {
            if names.len() == MAX_PINNED {
                return Err(TenantError::TooMany(file.to_string()));
            }
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// A tenant name: 1 to [`MAX_TENANT_LEN`] bytes of `A-Z a-z 0-9 . _ -`.
fn is_name(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_TENANT_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Which fixed value `v` is, if any.
fn fixed(v: &str) -> Option<usize> {
    [NO_TENANT, INVALID, OTHER].iter().position(|f| *f == v)
}

/// A key-derived tenant id, `key-` and [`KEY_HEX_DIGITS`] hex digits, on the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyId([u8; KEY_PREFIX.len() + KEY_HEX_DIGITS]);

impl KeyId {
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written into it.
        std::str::from_utf8(&self.0).unwrap_or(NO_TENANT)
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The tenant id of an API key: `key-` and the first [`KEY_HEX_DIGITS`] hex digits of the
/// SHA-256 of its bytes. SHA-256 is fixed by its standard (std's `DefaultHasher` may change
/// with any Rust release, and would relabel every tenant on an upgrade); ring computes it, the
/// same crate that does rustls's cryptography.
pub fn key_id(token: &[u8]) -> KeyId {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = ring::digest::digest(&ring::digest::SHA256, token);
    let mut id = [0u8; KEY_PREFIX.len() + KEY_HEX_DIGITS];
    id[..KEY_PREFIX.len()].copy_from_slice(KEY_PREFIX.as_bytes());
    for (i, b) in digest.as_ref().iter().take(KEY_HEX_DIGITS / 2).enumerate() {
        id[KEY_PREFIX.len() + 2 * i] = HEX[usize::from(b >> 4)];
        id[KEY_PREFIX.len() + 2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    KeyId(id)
}

/// The API key a request carries: the token of `Authorization: Bearer TOKEN` (the scheme in
/// any case), else the `x-api-key` header's value.
fn api_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(AUTHORIZATION) {
        let v = v.as_bytes();
        let scheme = b"bearer ";
        if v.len() > scheme.len() && v[..scheme.len()].eq_ignore_ascii_case(scheme) {
            let token = v[scheme.len()..].trim_ascii();
            if !token.is_empty() {
                return Some(token);
            }
        }
    }
    let v = headers.get(API_KEY_HEADER)?.as_bytes().trim_ascii();
    (!v.is_empty()).then_some(v)
}

/// Resolves a request's tenant label (see the module docs); one per proxy.
#[derive(Debug)]
pub struct Tenants {
    header: Option<HeaderName>,
    from_key: bool,
    labels: Capped,
    /// `none`, `invalid` and `other`, allocated once: a request in them allocates nothing.
    fixed: [Arc<str>; 3],
}

impl Tenants {
    pub fn new(cfg: &TenantConfig) -> Self {
        Tenants {
            header: cfg.header.clone(),
            from_key: cfg.from_key,
            labels: Capped::new("tenant", cfg.max, cfg.pinned.iter().cloned()),
            fixed: [NO_TENANT, INVALID, OTHER].map(Arc::from),
        }
    }

    /// The `tenant` label value of a request with these headers. Allocates only for a value
    /// seen for the first time (and under the cap).
    pub fn resolve(&self, headers: &HeaderMap) -> Arc<str> {
        let named = self
            .header
            .as_ref()
            .and_then(|h| headers.get(h))
            .map(|v| v.as_bytes().trim_ascii())
            .filter(|v| !v.is_empty());
        if let Some(v) = named {
            return match std::str::from_utf8(v) {
                Ok(name) if is_name(v) => self.admit(name),
                _ => Arc::clone(&self.fixed[1]),
            };
        }
        if self.from_key {
            if let Some(token) = api_key(headers) {
                return self.admit(key_id(token).as_str());
            }
        }
        Arc::clone(&self.fixed[0])
    }

    fn admit(&self, name: &str) -> Arc<str> {
        if let Some(i) = fixed(name) {
            return Arc::clone(&self.fixed[i]);
        }
        self.labels
            .admit(name)
            .unwrap_or_else(|| Arc::clone(&self.fixed[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MapHost;

    fn tenants(header: Option<&str>, from_key: bool, max: usize, pinned: &[&str]) -> Tenants {
        Tenants::new(&TenantConfig {
            header: header.map(|h| HeaderName::from_bytes(h.as_bytes()).expect("name")),
            from_key,
            max,
            pinned: pinned.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn head(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            let name = HeaderName::from_bytes(k.as_bytes()).expect("name");
            h.append(name, http::HeaderValue::from_bytes(v).expect("value"));
        }
        h
    }

    fn resolve(t: &Tenants, pairs: &[(&str, &[u8])]) -> String {
        t.resolve(&head(pairs)).to_string()
    }

    #[test]
    fn a_header_value_is_the_tenant_when_it_is_a_name_else_invalid() {
        let t = tenants(Some("x-tenant"), false, 32, &[]);
        let cases: [(&[u8], &str); 9] = [
            (b"team-a", "team-a"),
            (b"  Org_7.prod  ", "Org_7.prod"),
            (b"a b", INVALID),
            (b"caf\xc3\xa9", INVALID),
            (b"x\"y", INVALID),
            (b"{x}", INVALID),
            (b"\xff\xfe", INVALID),
            (b"", NO_TENANT),
            (b"   ", NO_TENANT),
        ];
        for (v, want) in cases {
            assert_eq!(resolve(&t, &[("x-tenant", v)]), want, "{v:?}");
        }
        assert_eq!(resolve(&t, &[("x-other", b"team-a")]), NO_TENANT);
        let longest = "a".repeat(MAX_TENANT_LEN);
        assert_eq!(resolve(&t, &[("x-tenant", longest.as_bytes())]), longest);
        let long = "a".repeat(MAX_TENANT_LEN + 1);
        assert_eq!(resolve(&t, &[("x-tenant", long.as_bytes())]), INVALID);
    }

    #[test]
    fn beyond_the_cap_is_other_and_pinned_names_keep_their_own() {
        let t = tenants(Some("x-tenant"), false, 3, &["vip"]);
        let got: HashSet<String> = (0..100)
            .map(|i| resolve(&t, &[("x-tenant", format!("t{i}").as_bytes())]))
            .collect();
        let want: HashSet<String> = ["t0", "t1", "t2", OTHER].map(String::from).into();
        assert_eq!(got, want);
        assert_eq!(resolve(&t, &[("x-tenant", b"vip")]), "vip");
        assert_eq!(resolve(&t, &[("x-tenant", b"t1")]), "t1");
        // The fixed values take no place under the cap.
        let t = tenants(Some("x-tenant"), false, 1, &[]);
        for v in [&b"other"[..], b"none", b"invalid", b"bad value"] {
            resolve(&t, &[("x-tenant", v)]);
        }
        assert_eq!(resolve(&t, &[("x-tenant", b"first")]), "first");
    }

    #[test]
    fn a_key_id_is_the_sha256_prefix_of_the_token() {
        // FIPS 180-2's test vector: SHA-256("abc") = ba7816bf8f01cfea...
        assert_eq!(key_id(b"abc").as_str(), "key-ba7816bf8f01");
        assert_eq!(key_id(b"sk-one"), key_id(b"sk-one"));
        assert_ne!(key_id(b"sk-one"), key_id(b"sk-two"));
    }

    #[test]
    fn from_key_reads_the_bearer_token_or_x_api_key_and_the_header_wins() {
        let t = tenants(Some("x-tenant"), true, 32, &[]);
        let id = key_id(b"sk-secret").as_str().to_string();
        assert_eq!(resolve(&t, &[("authorization", b"Bearer sk-secret")]), id);
        assert_eq!(resolve(&t, &[("authorization", b"bearer  sk-secret ")]), id);
        assert_eq!(resolve(&t, &[("x-api-key", b"sk-secret")]), id);
        let both: &[(&str, &[u8])] = &[("authorization", b"Bearer sk-secret"), ("x-tenant", b"a")];
        assert_eq!(resolve(&t, both), "a");
        // An empty tenant header leaves the decision to the key.
        let empty: &[(&str, &[u8])] = &[("authorization", b"Bearer sk-secret"), ("x-tenant", b"")];
        assert_eq!(resolve(&t, empty), id);
        for other in [
            &b"Basic dXNlcjpwYXNz"[..],
            b"Bearer ",
            b"Bearer",
            b"sk-secret",
        ] {
            assert_eq!(resolve(&t, &[("authorization", other)]), NO_TENANT);
        }
        // Without --tenant-from-key the key is not looked at.
        let t = tenants(Some("x-tenant"), false, 32, &[]);
        assert_eq!(
            resolve(&t, &[("authorization", b"Bearer sk-secret")]),
            NO_TENANT
        );
    }

    #[test]
    fn the_allow_list_is_names_one_a_line() {
        let text = "# pinned tenants\nteam-a\n  team-b   # the big one\n\nteam-a\n";
        assert_eq!(
            parse_allow_list("f", text),
            Ok(vec!["team-a".to_string(), "team-b".to_string()])
        );
        let e = parse_allow_list("f", "ok\nnot ok\n");
        assert_eq!(
            e,
            Err(TenantError::BadName {
                file: "f".into(),
                line: 2
            })
        );
        let e = parse_allow_list("f", "other\n");
        assert!(
            matches!(e, Err(TenantError::Reserved { line: 1, .. })),
            "{e:?}"
        );
        let many: String = (0..=MAX_PINNED).map(|i| format!("t{i}\n")).collect();
        assert_eq!(
            parse_allow_list("f", &many),
            Err(TenantError::TooMany("f".into()))
        );
    }

    #[test]
    fn flags_are_checked() {
        let host = MapHost::default().file("/etc/tenants", "vip\n");
        let build = |f: Flags| f.build(&host);
        assert_eq!(build(Flags::default()), Ok(None));
        let c = build(Flags {
            header: Some("X-Tenant"),
            allow_file: Some(Path::new("/etc/tenants")),
            ..Flags::default()
        });
        let c = c.expect("valid").expect("on");
        assert_eq!(c.header.as_ref().map(HeaderName::as_str), Some("x-tenant"));
        assert_eq!(
            (c.max, c.pinned),
            (DEFAULT_MAX_TENANTS, vec!["vip".to_string()])
        );
        let key = Flags {
            from_key: true,
            ..Flags::default()
        };
        assert!(build(key.clone()).expect("valid").is_some());
        let cases = [
            (
                Flags {
                    max: Some(0),
                    ..key.clone()
                },
                TenantError::Zero,
            ),
            (
                Flags {
                    max: Some(8),
                    ..Flags::default()
                },
                TenantError::NoSource("max-tenants"),
            ),
            (
                Flags {
                    allow_file: Some(Path::new("/etc/tenants")),
                    ..Flags::default()
                },
                TenantError::NoSource("tenant-allow-file"),
            ),
            (
                Flags {
                    header: Some("Authorization"),
                    ..Flags::default()
                },
                TenantError::CredentialHeader("Authorization".into()),
            ),
            (
                Flags {
                    header: Some("x tenant"),
                    ..Flags::default()
                },
                TenantError::BadHeader("x tenant".into()),
            ),
        ];
        for (flags, want) in cases {
            assert_eq!(build(flags), Err(want));
        }
        let e = build(Flags {
            allow_file: Some(Path::new("/nope")),
            ..key
        });
        assert!(
            matches!(e, Err(TenantError::Unreadable(ref f, _)) if f == "/nope"),
            "{e:?}"
        );
    }
}
