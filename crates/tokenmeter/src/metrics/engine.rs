//! Where the first token's time went, as the engine states it: the parts of TTFT.
//!
//! A stream that states its engine's timings ([`crate::protocol::timings`]) has its TTFT split
//! into the stated parts (`queue`, `model_load`, `prefill`) and `other`, tokenmeter's own TTFT
//! less all of them, so the parts of one request add up to its TTFT. Each part is observed only
//! for a request that states it; `other` for every request that states any. A request whose
//! stated parts exceed tokenmeter's TTFT (a server that counts from an earlier instant) has its
//! `other` recorded as 0 and is counted as a mismatch, so the split never shows a negative
//! part and the reader knows how often that happened.
//!
//! The parts are observed when a request ends (the timings ride on the final chunk) and only
//! for a request with a TTFT (a token-bearing event passed): a non-streamed answer has no first
//! token to split, though its timings are counted in the coverage.

use super::names;
use prometheus::{HistogramVec, IntCounterVec};

use super::registrar::{counter, histogram, Registrar};
use super::Buckets;
use crate::record::Finished;

/// Draft acceptance rates: tenths, from none accepted to all.
const ACCEPTANCE_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// The engine-timing families.
pub(super) struct EngineMetrics {
    parts: HistogramVec,
    mismatch: IntCounterVec,
    requests: IntCounterVec,
    acceptance: HistogramVec,
}

impl EngineMetrics {
    pub(super) fn new(r: &Registrar, b: &Buckets) -> prometheus::Result<Self> {
        Ok(EngineMetrics {
            parts: histogram(
                r,
                names::TIME_TO_FIRST_TOKEN_PART_SECONDS,
                "Time to first token split by where the engine says it went: queue, model_load and prefill as the stream states them, other = tokenmeter's TTFT less the stated parts.",
                &["model", "part"],
                &b.ttft,
            )?,
            mismatch: counter(
                r,
                names::ENGINE_TIMING_MISMATCH_TOTAL,
                "Requests whose stated parts exceeded tokenmeter's own TTFT (their other part is recorded as 0).",
                &["model"],
            )?,
            requests: counter(
                r,
                names::ENGINE_TIMINGS_REQUESTS_TOTAL,
                "Requests whose stream stated the engine's own timings, by the engine that stated them.",
                &["model", "source"],
            )?,
            acceptance: histogram(
                r,
                names::SPEC_DECODE_ACCEPTANCE_RATE,
                "Per-request share of draft tokens accepted under speculative decoding, where the engine states it (vLLM).",
                &["model"],
                &ACCEPTANCE_BUCKETS,
            )?,
        })
    }

    /// Records the timings of one finished request, if its stream stated any.
    pub(super) fn record(&self, f: &Finished) {
        let Some(t) = &f.engine else { return };
        let model = f.model.as_str();
        self.requests
            .with_label_values(&[model, t.source.as_str()])
            .inc();
        if let Some(rate) = t.spec_acceptance {
            self.acceptance.with_label_values(&[model]).observe(rate);
        }
        let Some(ttft) = f.first_token else { return };
        let (split, over) = t.split(ttft);
        if over {
            self.mismatch.with_label_values(&[model]).inc();
        }
        for (part, value) in split.parts() {
            if let Some(d) = value {
                self.parts
                    .with_label_values(&[model, part.as_str()])
                    .observe(d.as_secs_f64());
            }
        }
    }
}
