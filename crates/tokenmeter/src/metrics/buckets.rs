//! Histogram bucket boundaries: the two presets every histogram starts from (`default`, vLLM's
//! where vLLM has the measure, and `coarse`, about half the series, for fleets) and the
//! per-measure replacements the `--buckets-*` flags give. The metrics own their boundaries;
//! `config` only hands over the flags' values.

/// `--buckets`' default: the preset with vLLM's boundaries where vLLM has the measure.
pub const DEFAULT_PRESET: &str = "default";

/// Histogram bucket boundaries, one set per kind of measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    /// Time to first token: vLLM's `vllm:time_to_first_token_seconds` boundaries.
    pub ttft: Vec<f64>,
    /// Inter-token latency and time per output token: vLLM's `vllm:inter_token_latency_seconds`.
    pub itl: Vec<f64>,
    /// Per-request decode speed in tokens/s, 1 to 10,000.
    pub tps: Vec<f64>,
    /// End-to-end request duration: vLLM's `vllm:e2e_request_latency_seconds`.
    pub duration: Vec<f64>,
    /// Prompt and output lengths in tokens: 1-2-5 steps, as vLLM's length histograms.
    pub tokens: Vec<f64>,
    /// Tokens one event carried: 1 is a plain stream, 2-8 speculative decoding or a stream
    /// interval, beyond that coalescing (a gateway or a `--stream-interval` of tens).
    pub per_event: Vec<f64>,
    /// A request's longest gap between two token-bearing events: from a smooth 10 ms to a
    /// two-minute freeze.
    pub stall: Vec<f64>,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            ttft: vec![
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
            ],
            itl: vec![
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0,
            ],
            tps: vec![
                1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 150.0, 200.0,
                300.0, 500.0, 750.0, 1000.0, 2000.0, 5000.0, 10000.0,
            ],
            duration: vec![
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
            ],
            tokens: vec![
                1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
                10000.0, 20000.0, 50000.0, 100000.0, 200000.0, 500000.0, 1000000.0,
            ],
            per_event: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0],
            stall: vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ],
        }
    }
}

impl Buckets {
    /// `--buckets coarse`: for fleets that count series (docs/fleet.md). Every set is a subset
    /// of the default one, so each coarse bucket is a sum of default buckets and its edges are
    /// still vLLM's where the defaults are; each histogram keeps about half its series. Kept on
    /// purpose: TTFT's 2.5 s (the TTFT SLO rules read `le="2.5"`) and 1 s (the default
    /// interactive class), and 10 and 20 tokens/s (the speed-floor alert and the interactive
    /// class's floor), so the rules' thresholds stay exact.
    pub fn coarse() -> Self {
        Buckets {
            ttft: vec![
                0.01, 0.04, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0, 640.0,
            ],
            itl: vec![0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 10.0],
            tps: vec![
                5.0, 10.0, 20.0, 30.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
            ],
            duration: vec![
                0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 480.0, 1920.0,
            ],
            tokens: vec![1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0],
            per_event: vec![1.0, 2.0, 4.0, 8.0, 16.0, 64.0],
            stall: vec![0.05, 0.25, 1.0, 5.0, 30.0, 120.0],
        }
    }

    /// The measures, in declaration order, for checks that go over every set.
    pub fn sets(&self) -> [(&'static str, &[f64]); 7] {
        [
            ("ttft", &self.ttft),
            ("itl", &self.itl),
            ("tps", &self.tps),
            ("duration", &self.duration),
            ("tokens", &self.tokens),
            ("per_event", &self.per_event),
            ("stall", &self.stall),
        ]
    }
}

/// Per-measure replacements of a preset's boundaries (`--buckets-ttft` ...); `None` keeps the
/// preset's. The per-event and stall sets have no flag.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub ttft: Option<Vec<f64>>,
    pub itl: Option<Vec<f64>>,
    pub tps: Option<Vec<f64>>,
    pub duration: Option<Vec<f64>>,
    pub tokens: Option<Vec<f64>>,
}

/// A preset name that is neither `default` nor `coarse` (the name, trimmed).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0:?} is not a bucket set (expected default or coarse)")]
pub struct UnknownPreset(pub String);

impl Buckets {
    /// The preset called `name` (`default` or `coarse`), with `overrides` replacing whole sets.
    pub fn preset(name: &str, overrides: Overrides) -> Result<Self, UnknownPreset> {
        let d = match name.trim() {
            DEFAULT_PRESET => Buckets::default(),
            "coarse" => Buckets::coarse(),
            other => return Err(UnknownPreset(other.to_string())),
        };
        Ok(Buckets {
            ttft: overrides.ttft.unwrap_or(d.ttft),
            itl: overrides.itl.unwrap_or(d.itl),
            tps: overrides.tps.unwrap_or(d.tps),
            duration: overrides.duration.unwrap_or(d.duration),
            tokens: overrides.tokens.unwrap_or(d.tokens),
            per_event: d.per_event,
            stall: d.stall,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preset_by_name_with_whole_sets_replaced() {
        assert_eq!(
            Buckets::preset("default", Overrides::default()),
            Ok(Buckets::default())
        );
        let tps = Some(vec![5.0, 50.0]);
        let b = Buckets::preset(
            " coarse ",
            Overrides {
                tps,
                ..Overrides::default()
            },
        );
        let b = b.expect("known");
        assert_eq!((b.tps, b.ttft), (vec![5.0, 50.0], Buckets::coarse().ttft));
        assert_eq!(
            Buckets::preset("fine", Overrides::default()),
            Err(UnknownPreset("fine".into()))
        );
    }
}
