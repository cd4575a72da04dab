//! The label policy: every label value the metrics write comes from a bounded set, and the sets
//! that are the metrics' own are here.
//!
//! A label value minted from what a client sends is a new series; one client looping over
//! random names could otherwise exhaust Prometheus. So each label of tokenmeter's own families
//! is one of: a closed enum ([`Phase`], [`ParseError`], and the enums of `protocol`, `record`
//! and `slo`), a fixed band ([`prompt_band`], `record::concurrency_band`), a status code, an SLO
//! class as declared (at most `slo::MAX_CLASSES`), a model name through [`ModelLabels`] (at most
//! `--max-models`, then `other`), or a tenant already bounded by `crate::tenant`. The `tenant`
//! label itself is placed here too: with it on, the families that say who used what carry it
//! after their own labels ([`tenanted`] at registration, [`child`] at use); without it the label
//! does not exist.

use prometheus::core::{MetricVec, MetricVecBuilder};

use super::capped::{Capped, OTHER};

/// Where a request is: the `phase` label of `tokenmeter_requests_in_flight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sent upstream, no token yet.
    Prefill,
    /// Tokens are streaming.
    Decode,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// Why part of a body could not be parsed: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// A line longer than `--max-line-bytes`: forwarded untouched, not parsed.
    LineTooLong,
    /// An event whose payload was not the JSON its format promises.
    InvalidJson,
    /// A compressed body (`Content-Encoding`), forwarded untouched, not parsed.
    ContentEncoding,
}

impl ParseError {
    /// Every variant, in exposition order.
    pub const ALL: [ParseError; 3] = [
        ParseError::LineTooLong,
        ParseError::InvalidJson,
        ParseError::ContentEncoding,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ParseError::LineTooLong => "line_too_long",
            ParseError::InvalidJson => "invalid_json",
            ParseError::ContentEncoding => "content_encoding",
        }
    }
}

/// The band of a request's prompt length: the `prompt` label of
/// `tokenmeter_time_to_first_token_seconds` (TTFT is prefill, and prefill grows with the prompt).
/// `None` (the stream reported no prompt count) is `unknown`. The bands are fixed: at most seven
/// values per model.
pub fn prompt_band(input_tokens: Option<u64>) -> &'static str {
    const BANDS: [(u64, &str); 5] = [
        (256, "1-256"),
        (1024, "257-1k"),
        (4096, "1k-4k"),
        (16384, "4k-16k"),
        (65536, "16k-64k"),
    ];
    let Some(n) = input_tokens else {
        return "unknown";
    };
    BANDS
        .iter()
        .find(|(upper, _)| n <= *upper)
        .map_or("64k+", |(_, band)| band)
}

/// Admits at most `max` distinct model names as label values ([`Capped`]); the rest become
/// `other`.
#[derive(Debug)]
pub struct ModelLabels {
    capped: Capped,
}

/// Longest model name kept as a label value; longer ones are cut (at a character boundary).
const MAX_MODEL_LABEL_LEN: usize = 128;

impl ModelLabels {
    pub fn new(max: usize) -> Self {
        ModelLabels {
            capped: Capped::new("model", max, []),
        }
    }

    /// The label value for a model name (`unknown` when there is none).
    pub fn label(&self, model: Option<&str>) -> String {
        let Some(raw) = model else {
            return "unknown".to_string();
        };
        let clean: String = raw
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_MODEL_LABEL_LEN)
            .collect();
        if clean.is_empty() {
            return "unknown".to_string();
        }
        match self.capped.admit(&clean) {
            Some(_) => clean,
            None => OTHER.to_string(),
        }
    }
}

// --- the tenant label (--tenant-header, --tenant-from-key) ---

/// The label the tenant is exported under, after a family's own labels.
pub const TENANT_LABEL: &str = "tenant";

/// The tenant of a request that named none (no header, no key).
pub const NO_TENANT: &str = "none";

/// Most labels a family carries before `tenant` (`tokenmeter_requests_total` has four).
const MAX_OWN_LABELS: usize = 5;

/// A family's label names, with `tenant` last when the label is on.
pub(super) fn tenanted(names: &[&'static str], on: bool) -> Vec<&'static str> {
    let mut v = names.to_vec();
    if on {
        v.push(TENANT_LABEL);
    }
    v
}

/// The child of `vec` for `values`, and `tenant` after them when it is `Some`: what a family
/// registered through [`tenanted`] takes. No allocation: the values are gathered on the stack.
pub(super) fn child<T: MetricVecBuilder>(
    vec: &MetricVec<T>,
    values: &[&str],
    tenant: Option<&str>,
) -> T::M {
    let Some(tenant) = tenant else {
        return vec.with_label_values(values);
    };
    let mut all = [""; MAX_OWN_LABELS + 1];
    let n = values.len().min(MAX_OWN_LABELS);
    all[..n].copy_from_slice(&values[..n]);
    all[n] = tenant;
    vec.with_label_values(&all[..=n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_bounded_and_sanitised() {
        let m = ModelLabels::new(2);
        assert_eq!(m.label(Some("a")), "a");
        assert_eq!(m.label(Some("b\n")), "b");
        assert_eq!(m.label(Some("c")), "other");
        assert_eq!(m.label(Some("a")), "a");
        assert_eq!(m.label(None), "unknown");
        assert_eq!(m.label(Some(" ")), "unknown");
        let long = "x".repeat(1000);
        let m = ModelLabels::new(5);
        assert_eq!(m.label(Some(&long)).len(), MAX_MODEL_LABEL_LEN);
    }

    #[test]
    fn prompt_bands_match_the_documented_edges() {
        let cases = [
            (None, "unknown"),
            (Some(0), "1-256"),
            (Some(1), "1-256"),
            (Some(256), "1-256"),
            (Some(257), "257-1k"),
            (Some(1024), "257-1k"),
            (Some(1025), "1k-4k"),
            (Some(4096), "1k-4k"),
            (Some(4097), "4k-16k"),
            (Some(16384), "4k-16k"),
            (Some(16385), "16k-64k"),
            (Some(65536), "16k-64k"),
            (Some(65537), "64k+"),
            (Some(u64::MAX), "64k+"),
        ];
        for (n, band) in cases {
            assert_eq!(prompt_band(n), band, "{n:?}");
        }
    }
}
