//! The engine's own view of itself: its KV cache, its queue and its preemptions, read from its
//! metrics (`--engine-metrics`).
//!
//! tokenmeter sees every request on the wire, but not the engine's memory: how big its KV cache
//! is, how full, how many requests wait inside it, how often it preempts. The engine states
//! those on its own `/metrics`. A task of its own ([`reader`]) reads them on a schedule, off the
//! request path, bounded in time and size; [`view`] turns a page into an [`view::EngineView`] in
//! the dialects it knows (vLLM, SGLang, TGI and llama.cpp with the JSON document each keeps its
//! limits in, [`stated`]). The cache's size goes to the capacity model (the flags
//! `--kv-cache-tokens`, `--block-size` win over it), and the rest is exported as
//! `tokenmeter_engine_*` beside the wire's own figures.
//!
//! `--engine-metrics auto` (the default) reads the upstream's `/metrics`; an upstream that has
//! none, or speaks no dialect known here, is tried again every minute and costs nothing else.

pub mod observed;
pub mod reader;
pub mod stated;
pub mod view;

use std::fmt;

use hyper::Uri;

use crate::units::HumanDuration;

/// `--engine-metrics-interval`'s default: as often as Prometheus scrapes a fast job, and the
/// capacity model refits every 5 s anyway.
pub const DEFAULT_INTERVAL: HumanDuration = HumanDuration::secs(5);

/// `--engine-metrics`; `auto` by default.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Setting {
    Off,
    /// The upstream's `/metrics`.
    #[default]
    Auto,
    /// This URL.
    Url(Uri),
}

/// As the flag spells it: `off`, `auto`, or the URL.
impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Off => f.write_str("off"),
            Setting::Auto => f.write_str("auto"),
            Setting::Url(u) => write!(f, "{u}"),
        }
    }
}

/// Why `--engine-metrics` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--engine-metrics must be auto, off or an http:// or https:// URL, got {0:?}")]
pub struct BadSetting(pub String);

/// Parses `--engine-metrics`.
pub fn parse(s: &str) -> Result<Setting, BadSetting> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(Setting::Auto);
    }
    if t.eq_ignore_ascii_case("off") {
        return Ok(Setting::Off);
    }
    match t.parse::<Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
            Ok(Setting::Url(u))
        }
        _ => Err(BadSetting(s.to_string())),
    }
}

impl Setting {
    /// The URL to read, given the upstream's origin (`scheme://host:port`); `None` when off.
    /// Auto reads `/metrics` at the origin's root, where engines serve it, whatever path prefix
    /// the API is under.
    pub fn url(&self, origin: &Uri) -> Option<Uri> {
        match self {
            Setting::Off => None,
            Setting::Url(u) => Some(u.clone()),
            Setting::Auto => format!("{}/metrics", origin.to_string().trim_end_matches('/'))
                .parse()
                .ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_and_a_bad_one() {
        assert_eq!(parse("auto"), Ok(Setting::Auto));
        assert_eq!(parse(" OFF "), Ok(Setting::Off));
        let url = parse("http://vllm:8000/metrics").expect("a url");
        assert_eq!(
            url,
            Setting::Url("http://vllm:8000/metrics".parse().expect("uri"))
        );
        assert!(parse("ftp://x/metrics").is_err());
        assert!(parse("vllm:8000").is_err());
        assert!(parse("").is_err());
        let origin: Uri = "http://127.0.0.1:8000".parse().expect("uri");
        assert_eq!(
            Setting::Auto.url(&origin).map(|u| u.to_string()),
            Some("http://127.0.0.1:8000/metrics".to_string())
        );
        assert_eq!(Setting::Off.url(&origin), None);
    }
}
