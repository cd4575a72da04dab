//! The live handles: what one request observes while it streams, per token-bearing event.
//!
//! A request resolves its handles once ([`ModelMetrics`] at its first token, [`InFlight`] when
//! it starts), so the per-event work is atomic updates on children already looked up: no lock,
//! no label lookup, no allocation (`tests/alloc.rs` counts them). What the request was when it
//! ended is recorded apart, once, from its `Finished` record (`recording.rs`).

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntGauge};

use super::labels::{child, prompt_band, Phase, NO_TENANT};
use super::vllm::{VllmInFlight, VllmLive};
use super::Metrics;

/// The per-model families a request observes while it streams, resolved once per request.
#[derive(Clone)]
pub struct ModelMetrics {
    label: String,
    /// The `tenant` label value, when the label exists.
    tenant: Option<Arc<str>>,
    /// By `model` and `prompt` (and `tenant`): resolved once, when the band is known (see
    /// `first_token`).
    ttft: HistogramVec,
    itl: Histogram,
    vllm: Option<VllmLive>,
    per_event: Histogram,
    output_total: IntCounter,
}

// === impl ModelMetrics ===

impl ModelMetrics {
    /// Resolves `m`'s per-model children for the model `label`, and for `tenant` when the
    /// `tenant` label exists (a request that named none is [`NO_TENANT`]).
    pub(super) fn resolve(m: &Metrics, label: String, tenant: Option<&Arc<str>>) -> Self {
        let tenant = m
            .tenant
            .then(|| tenant.map_or_else(|| Arc::from(NO_TENANT), Arc::clone));
        ModelMetrics {
            ttft: m.latency.ttft.clone(),
            itl: m.latency.itl.with_label_values(&[&label]),
            vllm: m.vllm.as_ref().map(|v| v.live(&label)),
            per_event: m.tokens.per_event.with_label_values(&[&label]),
            output_total: child(&m.tokens.output_total, &[&label], tenant.as_deref()),
            label,
            tenant,
        }
    }

    /// The `model` label value these handles carry.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The first token came `since_arrival` after the request arrived, and the prompt had
    /// `input_tokens` (`None`: unknown). The meter calls it once per request, as soon as the
    /// prompt count is known (or at the end, when it never is).
    pub fn first_token(&self, since_arrival: Duration, input_tokens: Option<u64>) {
        let values = [self.label.as_str(), prompt_band(input_tokens)];
        child(&self.ttft, &values, self.tenant.as_deref()).observe(since_arrival.as_secs_f64());
        if let Some(v) = &self.vllm {
            v.ttft.observe(since_arrival.as_secs_f64());
        }
    }

    /// A token-bearing event carried `tokens` tokens: counted in the output total at once (so
    /// `rate()` moves while a long stream runs), and in `vllm:generation_tokens_total` with
    /// `--compat vllm`, and observed in the tokens-per-event histogram. Lock-free: atomic
    /// updates on handles resolved once per request.
    pub fn event(&self, tokens: u32) {
        self.output_total.inc_by(u64::from(tokens));
        self.per_event.observe(f64::from(tokens));
        if let Some(v) = &self.vllm {
            // vLLM counts generation tokens at every engine step, not when a request ends.
            v.generation.inc_by(u64::from(tokens));
        }
    }

    /// [`ModelMetrics::event`] without the size: a tokenizer will say it at the end.
    pub fn event_unsized(&self, tokens: u32) {
        self.output_total.inc_by(u64::from(tokens));
        if let Some(v) = &self.vllm {
            v.generation.inc_by(u64::from(tokens));
        }
    }

    /// The sizes of a request's events, observed at its end (after [`ModelMetrics::event_unsized`]).
    pub fn event_sizes(&self, sizes: &[u32]) {
        for &n in sizes {
            self.per_event.observe(f64::from(n));
        }
    }

    /// An event carried `tokens` tokens, `gap` after the previous token-bearing event: the gap
    /// is spread over its tokens and observed once per token.
    pub fn inter_token(&self, gap: Duration, tokens: u32) {
        let per_token = gap.as_secs_f64() / f64::from(tokens);
        for _ in 0..tokens {
            self.itl.observe(per_token);
        }
        if let Some(v) = &self.vllm {
            // vLLM observes once per engine step that produced tokens: one per event here.
            if tokens > 0 {
                v.itl.observe(gap.as_secs_f64());
            }
        }
    }
}

/// One request's place in the in-flight gauges, resolved when it starts: it leaves exactly the
/// gauges it entered. The vLLM ones carry a model: waiting under the one the request named,
/// running under the one the stream named ([`InFlight::decoding`]).
#[derive(Clone)]
pub struct InFlight {
    prefill: IntGauge,
    decode: IntGauge,
    vllm: Option<VllmInFlight>,
}

// === impl InFlight ===

impl InFlight {
    /// Resolves `m`'s in-flight gauges for a request that names `model` (the model is looked up
    /// only when a compat scheme labels its gauges by model).
    pub(super) fn resolve(m: &Metrics, model: Option<&str>) -> Self {
        InFlight {
            prefill: m
                .requests
                .in_flight
                .with_label_values(&[Phase::Prefill.as_str()]),
            decode: m
                .requests
                .in_flight
                .with_label_values(&[Phase::Decode.as_str()]),
            vllm: m.vllm.as_ref().map(|v| v.in_flight(&m.model_label(model))),
        }
    }

    /// The request's first token came: it will decode under `model`'s gauges. Call before
    /// moving it into [`Phase::Decode`].
    pub fn decoding(&mut self, model: &ModelMetrics) {
        if let (Some(v), Some(live)) = (&mut self.vllm, &model.vllm) {
            v.running = live.running.clone();
        }
    }

    /// Moves the request into (`delta` 1) or out of (-1) a phase.
    pub fn add(&self, phase: Phase, delta: i64) {
        match phase {
            Phase::Prefill => {
                self.prefill.add(delta);
                if let Some(v) = &self.vllm {
                    v.waiting.add(delta);
                }
            }
            Phase::Decode => {
                self.decode.add(delta);
                if let Some(v) = &self.vllm {
                    v.running.add(delta);
                }
            }
        }
    }
}
