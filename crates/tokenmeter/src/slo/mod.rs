//! SLO classes: what speed each kind of consumer was promised, which class a request is in, and
//! whether it got that speed.
//!
//! A TPS figure means nothing without its consumer: a person reads at 5-15 tokens/s and needs the
//! first token within about a second, while an agent or a batch pipeline gains from every token
//! per second and may wait minutes. A [`Class`] names such a consumer and its [`Targets`] (TTFT,
//! per-request decode speed, end-to-end time, and the share of requests that must meet them).
//! [`Classes`] is the table built from `--slo` / `--slo-file` ([`spec`]); it picks a request's
//! class from its headers, path and model ([`Classes::resolve`]), and [`judge`] says at the end
//! whether the request met its targets.
//!
//! Class names become the `class` label, so the table is closed: at most [`MAX_CLASSES`] names
//! of a restricted charset, and a request naming an unknown class counts in the default class,
//! never as a new label value.

mod judge;
pub mod spec;

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::HeaderMap;

pub use judge::{judge, End, Observation, Verdict};
pub use spec::SloError;

/// Most classes a table may hold. Every class multiplies the series of
/// `tokenmeter_slo_requests_total` (class x model x concurrency band x result: 8 x 34 x 9 x 6 =
/// 14,688 at worst, before most combinations ever occur); deployments name two to four
/// (llm-d's interactive and batch, OpenAI's flex / default / priority tiers).
pub const MAX_CLASSES: usize = 8;

/// Longest class name. Names are label values and header values; 32 characters is room for
/// any descriptive name and keeps a scrape line short.
pub const MAX_CLASS_NAME: usize = 32;

/// Most path-prefix and model rules in a file. They are tried in order for every request, so
/// the bound keeps that scan to well under a microsecond.
pub const MAX_RULES: usize = 64;

/// The share of requests that must meet their targets when a class does not say.
pub const DEFAULT_OBJECTIVE: f64 = 0.95;

/// The class header's default name.
pub const DEFAULT_CLASS_HEADER: &str = "x-tokenmeter-class";

/// The default class's default name.
pub const DEFAULT_CLASS: &str = "interactive";

/// llm-d's per-request TTFT target, in milliseconds.
pub const TTFT_HEADER: &str = "x-llm-d-slo-ttft-ms";

/// llm-d's per-request time-per-output-token target, in milliseconds: a decode-speed floor of
/// 1000 / ms tokens/s.
pub const TPOT_HEADER: &str = "x-llm-d-slo-tpot-ms";

/// Largest per-request target a header may set (one day); larger values are ignored as
/// nonsense rather than allowed to overflow a `Duration`.
const MAX_OVERRIDE_MS: f64 = 86_400_000.0;

/// What a class promises. Each target is optional; a class without any (`batch`) is met by
/// every request that completes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    /// Longest time from arrival to the first token.
    pub ttft: Option<Duration>,
    /// Lowest decode speed, in the tokens/s of `tokenmeter_request_tokens_per_second`.
    pub tps: Option<f64>,
    /// Longest time from arrival to the end of the response.
    pub e2e: Option<Duration>,
    /// The share of requests that must meet the targets, in (0, 1): `tokenmeter_slo_objective`.
    pub objective: f64,
}

impl Default for Targets {
    fn default() -> Self {
        Targets {
            ttft: None,
            tps: None,
            e2e: None,
            objective: DEFAULT_OBJECTIVE,
        }
    }
}

impl Targets {
    /// These targets with the request's own from llm-d's headers, where present and sane
    /// (a positive number of milliseconds up to a day; anything else is ignored).
    pub fn with_overrides(mut self, headers: &HeaderMap) -> Self {
        if let Some(ms) = header_ms(headers, TTFT_HEADER) {
            self.ttft = Duration::try_from_secs_f64(ms / 1e3).ok();
        }
        if let Some(ms) = header_ms(headers, TPOT_HEADER) {
            // Time per output token t = decode time / (tokens - 1) <= ms / 1000 is exactly
            // (tokens - 1) / decode time >= 1000 / ms: the same speed, inverted.
            self.tps = Some(1e3 / ms);
        }
        self
    }
}

fn header_ms(headers: &HeaderMap, name: &str) -> Option<f64> {
    let v = headers
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()?;
    (v.is_finite() && v > 0.0 && v <= MAX_OVERRIDE_MS).then_some(v)
}

/// A named class.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// The `class` label value (validated: see [`spec::check_name`]).
    pub name: Arc<str>,
    pub targets: Targets,
}

/// What a rule of the file matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Match {
    /// The request path starts with this.
    PathPrefix(String),
    /// The request's model is exactly this.
    Model(String),
    /// The request's model starts with this (written `prefix*` in the file).
    ModelPrefix(String),
}

impl Match {
    fn matches(&self, path: &str, model: Option<&str>) -> bool {
        match self {
            Match::PathPrefix(p) => path.starts_with(p.as_str()),
            Match::Model(m) => model == Some(m.as_str()),
            Match::ModelPrefix(m) => model.is_some_and(|x| x.starts_with(m.as_str())),
        }
    }
}

/// A rule of the file: requests it matches are in `class` (an index into the table).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub when: Match,
    pub class: usize,
}

/// A request's class and the targets it is judged against (the class's, with any per-request
/// override from the headers).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub class: Arc<str>,
    pub targets: Targets,
}

/// The class table.
#[derive(Debug, Clone)]
pub struct Classes {
    classes: Vec<Class>,
    rules: Vec<Rule>,
    default: usize,
    header: HeaderName,
}

impl Default for Classes {
    /// `interactive` (TTFT 1 s, 20 tokens/s) and `batch` (no targets), `interactive` the default.
    fn default() -> Self {
        spec::Declaration::default()
            .build()
            .unwrap_or_else(|_| unreachable!("the built-in classes are valid"))
    }
}

impl Classes {
    /// Every class with its targets, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Targets)> {
        self.classes.iter().map(|c| (&*c.name, &c.targets))
    }

    /// The targets of a class, by name.
    pub fn get(&self, name: &str) -> Option<&Targets> {
        self.classes
            .iter()
            .find(|c| &*c.name == name)
            .map(|c| &c.targets)
    }

    /// The class of requests that name none (or an unknown one).
    pub fn default_class(&self) -> &str {
        &self.classes[self.default].name
    }

    /// The default class with its own targets: a request's choice until its head is read.
    pub fn default_choice(&self) -> Choice {
        let c = &self.classes[self.default];
        Choice {
            class: Arc::clone(&c.name),
            targets: c.targets,
        }
    }

    /// The header that names a request's class.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The rules of the file, in the order they are tried.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// A request's class: the class header when it names a declared class (case-insensitive),
    /// the default class when it names another; without the header, the first rule that
    /// matches the path or model; else the default. The targets are the class's, overridden by
    /// llm-d's per-request headers where present.
    pub fn resolve(&self, headers: &HeaderMap, path: &str, model: Option<&str>) -> Choice {
        let index = match headers.get(&self.header) {
            Some(v) => v
                .to_str()
                .ok()
                .map(str::trim)
                .and_then(|name| {
                    self.classes
                        .iter()
                        .position(|c| c.name.eq_ignore_ascii_case(name))
                })
                .unwrap_or(self.default),
            None => self
                .rules
                .iter()
                .find(|r| r.when.matches(path, model))
                .map_or(self.default, |r| r.class),
        };
        let class = &self.classes[index];
        Choice {
            class: Arc::clone(&class.name),
            targets: class.targets.with_overrides(headers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    fn table() -> Classes {
        spec::Declaration {
            flags: vec!["interactive:ttft=1s,tps=20".into(), "batch".into()],
            file: Some(spec::FileText {
                name: "slo.yaml".into(),
                text: "classes:\n  - name: agent\n    ttft: 5s\n    tps: 60\n\
                       rules:\n  - path_prefix: /v1/batches\n    class: batch\n\
                       \x20 - model: llama-70b-agent\n    class: agent\n\
                       \x20 - model: \"qwen*\"\n    class: batch\n"
                    .into(),
            }),
            ..spec::Declaration::default()
        }
        .build()
        .expect("valid")
    }

    #[test]
    fn the_defaults_are_interactive_and_batch() {
        let c = Classes::default();
        let names: Vec<_> = c.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["interactive", "batch"]);
        let i = c.get("interactive").expect("interactive");
        assert_eq!(i.ttft, Some(Duration::from_secs(1)));
        assert_eq!(i.tps, Some(20.0));
        assert_eq!((i.e2e, i.objective), (None, 0.95));
        assert_eq!(c.get("batch"), Some(&Targets::default()));
        assert_eq!(c.default_class(), "interactive");
        assert_eq!(c.header().as_str(), "x-tokenmeter-class");
    }

    #[test]
    fn the_header_wins_then_rules_then_the_default() {
        let c = table();
        let pick = |h: &[(&str, &str)], path: &str, model: Option<&str>| {
            c.resolve(&headers(h), path, model).class.to_string()
        };
        let batch_header = [("x-tokenmeter-class", "batch")];
        assert_eq!(pick(&batch_header, "/v1/chat/completions", None), "batch");
        assert_eq!(
            pick(&[("x-tokenmeter-class", " Agent ")], "/", None),
            "agent"
        );
        // The header beats a rule that would match.
        let agent_header = [("x-tokenmeter-class", "agent")];
        assert_eq!(pick(&agent_header, "/v1/batches", None), "agent");
        // An unknown name is the default class, never a new label value.
        let unknown = [("x-tokenmeter-class", "vip-$(rm -rf)")];
        assert_eq!(pick(&unknown, "/v1/batches", None), "interactive");
        assert_eq!(pick(&[], "/v1/batches/abc", None), "batch");
        assert_eq!(
            pick(&[], "/v1/chat/completions", Some("llama-70b-agent")),
            "agent"
        );
        assert_eq!(
            pick(&[], "/v1/chat/completions", Some("llama-70b")),
            "interactive"
        );
        assert_eq!(pick(&[], "/v1/completions", Some("qwen2.5-7b")), "batch");
        assert_eq!(pick(&[], "/v1/completions", None), "interactive");
    }

    #[test]
    fn llm_d_headers_override_the_class_targets() {
        let c = Classes::default();
        let h = headers(&[(TTFT_HEADER, "250"), (TPOT_HEADER, "40")]);
        let t = c.resolve(&h, "/", None).targets;
        assert_eq!(t.ttft, Some(Duration::from_millis(250)));
        // 40 ms per output token is 25 tokens/s.
        assert_eq!(t.tps, Some(25.0));
        // Overrides apply to a class without targets too.
        let h = headers(&[("x-tokenmeter-class", "batch"), (TTFT_HEADER, "1500.5")]);
        let choice = c.resolve(&h, "/", None);
        assert_eq!(&*choice.class, "batch");
        assert_eq!(choice.targets.ttft, Some(Duration::from_micros(1_500_500)));
        assert_eq!(choice.targets.tps, None);
    }

    #[test]
    fn nonsense_override_headers_are_ignored() {
        let c = Classes::default();
        for bad in ["", "fast", "-5", "0", "NaN", "inf", "1e12"] {
            let h = headers(&[(TTFT_HEADER, bad), (TPOT_HEADER, bad)]);
            let t = c.resolve(&h, "/", None).targets;
            assert_eq!(t, *c.get("interactive").expect("class"), "{bad:?}");
        }
    }
}
