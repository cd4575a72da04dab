//! Recording a finished request: one `Finished` record turned into every end-of-request
//! observation, once.
//!
//! The meter builds the record when a request ends, however it ends, and hands it to
//! `Metrics::record` exactly once; this is everything that follows from it: the request count,
//! parse errors, the SLO result and goodput ([`goodput`](super::goodput)), durations, the token
//! counts and histograms, the compat schemes' end-of-request series and the engines' stated
//! timings. It runs once per request, not per event, so looking children up by label here is
//! fine; what moves while a request streams is in `live.rs`. A request no parser read
//! (`Api::Unknown`) is counted and timed, but has no token series.

use super::goodput::goodput_tokens;
use super::labels::{child, ParseError, NO_TENANT};
use super::Metrics;
use crate::protocol::{Api, OutputKind};
use crate::record::{Decode, Finished};

/// Records `f` in `m`: every end-of-request family, once.
pub(super) fn observe(m: &Metrics, f: &Finished) {
    let model = f.model.as_str();
    let code = f.code.to_string();
    let tenant = tenant_value(m, f);
    let values = [model, &code, f.outcome.as_str(), f.api.as_str()];
    child(&m.requests.total, &values, tenant).inc();
    if let Some(g) = &f.gpu_seconds {
        m.cost.charged(model, tenant, g);
    }
    let e = &f.parse_errors;
    parse_error(m, ParseError::InvalidJson, e.invalid_json);
    parse_error(m, ParseError::LineTooLong, e.line_too_long);
    parse_error(m, ParseError::ContentEncoding, e.content_encoding);
    if let Some(slo) = &f.slo {
        let values = [&*slo.class, model, slo.band, slo.verdict.as_str()];
        child(&m.slo.requests, &values, tenant).inc();
        if let Some(good) = goodput_tokens(slo.verdict, f.api, f.output_tokens) {
            child(&m.slo.goodput_tokens, &[&slo.class, model], tenant).inc_by(good);
        }
    }
    m.latency
        .duration
        .with_label_values(&[model])
        .observe(f.duration.as_secs_f64());
    if let Some(fb) = f.first_byte {
        m.latency
            .ttfb
            .with_label_values(&[model])
            .observe(fb.as_secs_f64());
    }
    if let Some(o) = &m.otel {
        // "If available": an empty value, which Prometheus reads as no label.
        let requested = match &f.request_model {
            Some(name) => m.models.label(Some(name)),
            None => String::new(),
        };
        o.record(f, &requested);
    }
    if f.api == Api::Unknown {
        return;
    }
    if let Some(v) = &m.vllm {
        v.record(f);
    }
    m.engine.record(f);
    let output = f.output_tokens;
    m.tokens
        .source
        .with_label_values(&[f.token_source.as_str()])
        .inc();
    // Tokens already counted as they streamed stay; the final count settles the rest.
    child(&m.tokens.output_total, &[model], tenant)
        .inc_by(output.saturating_sub(f.streamed_tokens));
    m.tokens
        .output
        .with_label_values(&[model])
        .observe(output as f64);
    if let Some(input) = f.input_tokens {
        child(&m.tokens.input_total, &[model], tenant).inc_by(input);
        m.tokens
            .input
            .with_label_values(&[model])
            .observe(input as f64);
    }
    if let Some(r) = f.reasoning_tokens {
        child(&m.tokens.reasoning_total, &[model], tenant).inc_by(r);
    }
    for (kind, n) in [
        ("read", f.cached_input.read),
        ("write", f.cached_input.write),
    ] {
        if let Some(n) = n {
            child(&m.tokens.cached_input_total, &[model, kind], tenant).inc_by(n);
        }
    }
    for (kind, at) in OutputKind::ALL.iter().zip(f.first_output) {
        if let Some(at) = at {
            m.latency
                .first_output
                .with_label_values(&[model, kind.as_str()])
                .observe(at.as_secs_f64());
        }
    }
    if let Some(stall) = f.max_stall {
        m.latency
            .max_stall
            .with_label_values(&[model])
            .observe(stall.as_secs_f64());
    }
    match f.decode() {
        Some(Decode::Wire(d) | Decode::Engine(d)) => {
            let decode = d.as_secs_f64();
            m.latency
                .tpot
                .with_label_values(&[model])
                .observe(decode / (output - 1) as f64);
            child(&m.latency.request_tps, &[model, f.band()], tenant)
                .observe((output - 1) as f64 / decode);
        }
        Some(Decode::Burst) => m.latency.bursts.with_label_values(&[model]).inc(),
        None => {}
    }
}

/// The `tenant` label value of a finished request, when the label exists.
fn tenant_value<'a>(m: &Metrics, f: &'a Finished) -> Option<&'a str> {
    m.tenant.then(|| f.tenant.as_deref().unwrap_or(NO_TENANT))
}

fn parse_error(m: &Metrics, reason: ParseError, n: u64) {
    if n > 0 {
        m.requests
            .parse_errors
            .with_label_values(&[reason.as_str()])
            .inc_by(n);
    }
}
