//! `--inject-usage auto|on|off`: when a usage report is asked for on a client's behalf.
//!
//! The rewrite ([`super::add_usage`], [`super::StripUsage`]) gives the client the bytes it would
//! have had without it only where the upstream adds nothing but the one usage-only chunk. vLLM,
//! SGLang, TGI and llama.cpp do exactly that. OpenAI's own API does not: asked for usage, it
//! puts `"usage": null` into every chunk, which the client would then see. So `auto` (the
//! default) rewrites once the upstream is known to be one of those engines, and never while it is
//! not:
//!
//! - **known** when the engine's own metrics are read in one of their dialects (`--engine-metrics
//!   auto`, the default, reads the upstream's `/metrics` at start and then on its interval);
//! - **vetoed for good** when a response carries OpenAI's own headers (`openai-version`,
//!   `openai-processing-ms`, `openai-organization`): whatever else is said later, that upstream
//!   (or something behind it) is OpenAI's API.
//!
//! Until one or the other is known, nothing is rewritten: a request counted by its events is a
//! smaller error than a client that sees bytes it did not ask for. `on` rewrites always, `off`
//! never.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use http::HeaderMap;

/// `--inject-usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Setting {
    /// Rewrite once the upstream is known to be an engine that adds nothing else.
    #[default]
    Auto,
    On,
    Off,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Setting::Auto => "auto",
            Setting::On => "on",
            Setting::Off => "off",
        })
    }
}

/// Why `--inject-usage` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--inject-usage must be auto, on or off, got {0:?}")]
pub struct BadSetting(pub String);

impl FromStr for Setting {
    type Err = BadSetting;

    fn from_str(s: &str) -> Result<Self, BadSetting> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Setting::Auto),
            // `true`: the flag was a bare switch before it took a value (`--inject-usage`,
            // `TOKENMETER_INJECT_USAGE=true`).
            "on" | "true" => Ok(Setting::On),
            "off" | "false" => Ok(Setting::Off),
            _ => Err(BadSetting(s.to_owned())),
        }
    }
}

/// What is known of the upstream, for `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Upstream {
    /// Nothing yet: no rewrite.
    Unknown = 0,
    /// An engine that adds only the usage chunk: rewrite.
    Engine = 1,
    /// OpenAI's API (its headers were seen): never rewrite.
    OpenAi = 2,
}

impl Upstream {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Upstream::Engine,
            2 => Upstream::OpenAi,
            _ => Upstream::Unknown,
        }
    }
}

/// Response headers only OpenAI's own API sends.
const OPENAI_HEADERS: [&str; 3] = [
    "openai-version",
    "openai-processing-ms",
    "openai-organization",
];

/// The setting and what is known of the upstream; shared by every request (one atomic read per
/// request, one write when something new is learnt).
#[derive(Debug, Default)]
pub struct Policy {
    setting: Setting,
    upstream: AtomicU8,
}

impl Policy {
    pub fn new(setting: Setting) -> Self {
        Policy {
            setting,
            upstream: AtomicU8::new(Upstream::Unknown as u8),
        }
    }

    pub fn setting(&self) -> Setting {
        self.setting
    }

    /// What `auto` knows of the upstream.
    pub fn upstream(&self) -> Upstream {
        Upstream::from_u8(self.upstream.load(Ordering::Relaxed))
    }

    /// Whether a request that did not ask for usage is rewritten to ask for it now.
    pub fn rewrites(&self) -> bool {
        match self.setting {
            Setting::On => true,
            Setting::Off => false,
            Setting::Auto => self.upstream() == Upstream::Engine,
        }
    }

    /// The engine's metrics were read in the dialect of `engine` (vLLM, SGLang, TGI or
    /// llama.cpp): `auto` rewrites from now on, unless OpenAI's headers were seen.
    pub fn engine_recognised(&self, engine: &str) {
        let was = self.upstream.compare_exchange(
            Upstream::Unknown as u8,
            Upstream::Engine as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if was.is_ok() && self.setting == Setting::Auto {
            tracing::info!(
                engine,
                "the upstream is a known engine: streaming requests without usage ask for it, and the extra chunk is removed (--inject-usage auto)"
            );
        }
    }

    /// A response head arrived: OpenAI's own headers veto `auto` for good.
    pub fn response_head(&self, headers: &HeaderMap) {
        // Only `auto` listens, and only until it is vetoed.
        if self.setting != Setting::Auto || self.upstream() == Upstream::OpenAi {
            return;
        }
        if OPENAI_HEADERS.iter().any(|h| headers.contains_key(*h)) {
            let was = self
                .upstream
                .swap(Upstream::OpenAi as u8, Ordering::Relaxed);
            if was != Upstream::OpenAi as u8 {
                tracing::info!(
                    "the upstream answers with OpenAI's headers: usage is not asked for on clients' behalf (--inject-usage auto)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_as_written_and_as_the_old_switch() {
        for (s, want) in [
            ("auto", Setting::Auto),
            ("ON", Setting::On),
            ("true", Setting::On),
            ("off", Setting::Off),
            ("false", Setting::Off),
        ] {
            assert_eq!(s.parse::<Setting>(), Ok(want), "{s}");
        }
        assert_eq!(
            "yes".parse::<Setting>().map_err(|e| e.to_string()),
            Err(r#"--inject-usage must be auto, on or off, got "yes""#.to_owned())
        );
        assert_eq!(Setting::default().to_string(), "auto");
    }

    #[test]
    fn auto_rewrites_only_for_a_known_engine_and_never_after_openai() {
        let p = Policy::new(Setting::Auto);
        assert!(!p.rewrites(), "nothing known yet");
        p.response_head(&HeaderMap::new());
        assert!(!p.rewrites());
        p.engine_recognised("vllm");
        assert!(p.rewrites());
        let mut openai = HeaderMap::new();
        openai.insert("openai-version", "2020-10-01".parse().expect("header"));
        p.response_head(&openai);
        assert!(!p.rewrites(), "vetoed");
        p.engine_recognised("vllm");
        assert!(!p.rewrites(), "for good");
        assert_eq!(p.upstream(), Upstream::OpenAi);
    }

    #[test]
    fn on_and_off_do_not_listen() {
        let on = Policy::new(Setting::On);
        let off = Policy::new(Setting::Off);
        assert!(on.rewrites() && !off.rewrites());
        off.engine_recognised("vllm");
        assert!(!off.rewrites());
        let mut openai = HeaderMap::new();
        openai.insert("openai-processing-ms", "12".parse().expect("header"));
        on.response_head(&openai);
        assert!(on.rewrites());
    }
}
