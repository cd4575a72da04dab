//! Span export (`--otlp-endpoint`): one span per proxied request, sent as OTLP over HTTP with
//! protobuf bodies (`POST .../v1/traces`), made from the one [`Finished`] record.
//!
//! The protobuf is written by hand ([`pb`]): the OpenTelemetry Rust crates' HTTP exporter
//! (opentelemetry-otlp 0.31 with only `http-proto`) brings tonic, a gRPC stack, and 22 other
//! crates into the tree through opentelemetry-proto's generated types, for a message of a few
//! fields tokenmeter writes once per request (docs/tracing.md has the figures).
//!
//! Off the hot path: the request's thread encodes its span and offers it to a bounded queue
//! ([`QUEUE_SPANS`]); one task batches the queue into requests to the collector, one at a time.
//! A span that finds the queue full, or whose batch the collector refused or did not answer
//! within [`EXPORT_TIMEOUT`], is dropped and counted in `tokenmeter_trace_spans_dropped_total`;
//! failures are logged at most once a minute. A dead collector never delays a byte of a stream.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prometheus::IntCounter;
use tokio::sync::mpsc;

pub mod settings;

use crate::context::Sampler;
use crate::protocol::{Api, OutputKind};
use crate::ratelog::{RateLimited, LOG_PERIOD};
use crate::record::{Finished, Outcome, Sink};

/// Spans the queue holds before new ones are dropped. An encoded span is about 1 KiB, so the
/// queue holds at most some 2 MiB: a collector that stalls for a few seconds at a thousand
/// sampled requests a second loses nothing; one that stalls longer is not catching up anyway.
pub const QUEUE_SPANS: usize = 2048;

/// Spans per request to the collector (the SDKs' default batch size is 512).
const BATCH_SPANS: usize = 512;

/// Longest wait for a batch to fill before it is sent (the SDKs' default delay is 5 s; a
/// shorter one shows a request in the trace backend within a second).
const BATCH_DELAY: Duration = Duration::from_secs(1);

/// Longest a request to the collector may take (the OTLP exporters' default is 10 s).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The full URL spans are POSTed to (`.../v1/traces`).
    pub endpoint: Uri,
    /// `service.name` (`OTEL_SERVICE_NAME`, default `tokenmeter`).
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
}

/// The exporter's sending half: a [`Sink`] the meter hands every finished record.
pub struct Exporter {
    tx: mpsc::Sender<Vec<u8>>,
    dropped: IntCounter,
}

impl Exporter {
    /// Starts the export task on the current runtime.
    pub fn start(cfg: &TracingConfig, dropped: IntCounter) -> Exporter {
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        let head = resource_head(cfg);
        tokio::spawn(export(rx, cfg.endpoint.clone(), head, dropped.clone()));
        Exporter { tx, dropped }
    }
}

impl Sink for Exporter {
    fn finished(&self, f: &Finished, _at: Instant) {
        let Some(span) = span(f) else { return };
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }
}

/// Why a batch did not reach the collector: the key of its rate-limited warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Failure {
    Send,
    Status,
    Timeout,
}

async fn export(
    mut rx: mpsc::Receiver<Vec<u8>>,
    endpoint: Uri,
    head: Vec<u8>,
    dropped: IntCounter,
) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let failures: RateLimited<Failure> = RateLimited::new(LOG_PERIOD);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < BATCH_SPANS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                _ => break,
            }
        }
        let n = batch.len() as u64;
        let body = request_body(&head, &batch);
        let req = http::Request::post(endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)));
        let Ok(req) = req else {
            dropped.inc_by(n);
            continue;
        };
        let outcome = tokio::time::timeout(EXPORT_TIMEOUT, async {
            let resp = client.request(req).await.map_err(|_| Failure::Send)?;
            let ok = resp.status().is_success();
            // Read the (small) answer so the connection goes back to the pool.
            let _ = resp.into_body().collect().await;
            if ok {
                Ok(())
            } else {
                Err(Failure::Status)
            }
        })
        .await
        .unwrap_or(Err(Failure::Timeout));
        if let Err(why) = outcome {
            dropped.inc_by(n);
            if let Some(held) = failures.check(why, Instant::now()) {
                tracing::warn!(cause = ?why, spans = n, held_back = held, "trace export failed; spans dropped");
            }
        }
    }
}

/// The bytes every batch starts its `ResourceSpans` with: the resource and the scope's head.
fn resource_head(cfg: &TracingConfig) -> Vec<u8> {
    let mut resource = Vec::new();
    let mut attrs = vec![("service.name".to_string(), cfg.service_name.clone())];
    for (k, v) in &cfg.resource {
        if k != "service.name" {
            attrs.push((k.clone(), v.clone()));
        }
    }
    for (k, v) in &attrs {
        pb::message(&mut resource, 1, &kv_str(k, v));
    }
    let mut head = Vec::new();
    pb::message(&mut head, 1, &resource);
    head
}

/// `ExportTraceServiceRequest { resource_spans: [ { resource, scope_spans: [ { scope, spans } ] } ] }`.
fn request_body(head: &[u8], spans: &[Vec<u8>]) -> Vec<u8> {
    let mut scope = Vec::new();
    pb::string(&mut scope, 1, "tokenmeter");
    pb::string(&mut scope, 2, env!("CARGO_PKG_VERSION"));
    let mut scope_spans = Vec::new();
    pb::message(&mut scope_spans, 1, &scope);
    for s in spans {
        pb::message(&mut scope_spans, 2, s);
    }
    let mut resource_spans = head.to_vec();
    pb::message(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::with_capacity(resource_spans.len() + 8);
    pb::message(&mut out, 1, &resource_spans);
    out
}

/// The span of a request whose span is recorded (its ident has a span id), encoded as an OTLP
/// `Span` message; `None` for every other request.
pub fn span(f: &Finished) -> Option<Vec<u8>> {
    let ident = f.ident.as_deref()?;
    let trace = ident.trace.as_ref()?;
    let span_id = trace.span_id?;
    let start = ident.arrived;
    let nanos = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    };
    let operation = f.route.operation.map(|o| o.as_str());
    let request_model = f.request_model.as_deref().map(|m| bounded(m, 128));
    let name = match (operation, &request_model) {
        (Some(op), Some(m)) => format!("{op} {m}"),
        (Some(op), None) => op.to_string(),
        (None, _) => format!("{} {}", ident.method, ident.path),
    };
    let mut s = Vec::with_capacity(1024);
    pb::bytes(&mut s, 1, &trace.trace_id);
    pb::bytes(&mut s, 2, &span_id);
    if let Some(ts) = &trace.tracestate {
        pb::string(&mut s, 3, ts);
    }
    if let Some(parent) = &trace.parent_id {
        pb::bytes(&mut s, 4, parent);
    }
    pb::string(&mut s, 5, &name);
    // SPAN_KIND_SERVER: tokenmeter serves the client's request.
    pb::varint_field(&mut s, 6, 2);
    pb::fixed64(&mut s, 7, nanos(start));
    pb::fixed64(&mut s, 8, nanos(start + f.duration));
    let mut a = Attrs(&mut s);
    a.str("http.request.method", Some(ident.method.as_str()));
    a.str("url.path", Some(&ident.path));
    a.int("http.response.status_code", Some(u64::from(f.code)));
    a.str("server.address", ident.server_address.as_deref());
    a.str("gen_ai.operation.name", operation);
    a.str("gen_ai.request.model", request_model.as_deref());
    a.str(
        "gen_ai.response.model",
        f.model_from_response.then_some(f.model.as_str()),
    );
    let read = f.api != Api::Unknown;
    a.int("gen_ai.usage.input_tokens", f.input_tokens);
    a.int(
        "gen_ai.usage.output_tokens",
        read.then_some(f.output_tokens),
    );
    if let Some(stop) = f.stop {
        a.str_array("gen_ai.response.finish_reasons", &[stop.as_str()]);
    }
    a.str("tokenmeter.request_id", ident.request_id.as_deref());
    a.str("tokenmeter.outcome", Some(f.outcome.as_str()));
    a.str("tokenmeter.api", Some(f.api.as_str()));
    a.str(
        "tokenmeter.token_source",
        read.then(|| f.token_source.as_str()),
    );
    a.f64("tokenmeter.ttft_seconds", secs(f.first_token));
    a.f64("tokenmeter.tokens_per_second", f.tokens_per_second());
    a.f64("tokenmeter.concurrency", f.mean_in_flight);
    let gpu = f.gpu_seconds.as_ref();
    a.f64("tokenmeter.gpu_seconds", gpu.map(|g| g.total()));
    a.f64("tokenmeter.gpu_prefill_seconds", gpu.map(|g| g.prefill));
    a.f64("tokenmeter.gpu_decode_seconds", gpu.map(|g| g.decode));
    let band = f.slo.as_ref().map_or_else(|| f.band(), |s| s.band);
    a.str("tokenmeter.concurrency_band", Some(band));
    a.str("tokenmeter.slo.class", f.slo.as_ref().map(|s| &*s.class));
    a.str(
        "tokenmeter.slo.result",
        f.slo.as_ref().map(|s| s.verdict.as_str()),
    );
    a.str("tokenmeter.tenant", f.tenant.as_deref());
    a.f64("tokenmeter.max_stall_seconds", secs(f.max_stall));
    a.int("tokenmeter.usage.cached_input_tokens", f.cached_input.read);
    a.int("tokenmeter.usage.reasoning_tokens", f.reasoning_tokens);
    if let Some(e) = &f.engine {
        a.str("tokenmeter.engine.source", Some(e.source.as_str()));
        a.f64("tokenmeter.engine.queue_seconds", secs(e.queue));
        a.f64("tokenmeter.engine.model_load_seconds", secs(e.model_load));
        a.f64("tokenmeter.engine.prefill_seconds", secs(e.prefill));
        a.f64("tokenmeter.engine.generation_seconds", secs(e.generation));
        if let Some(ttft) = f.first_token {
            a.f64(
                "tokenmeter.engine.other_seconds",
                Some(e.split(ttft).0.other.as_secs_f64()),
            );
        }
    }
    let content = OutputKind::ALL
        .iter()
        .position(|k| *k == OutputKind::Content)
        .and_then(|i| f.first_output[i]);
    for (event, at) in [
        ("gen_ai.first_token", f.first_token),
        ("gen_ai.first_content_token", content),
    ] {
        if let Some(at) = at {
            let mut e = Vec::new();
            pb::fixed64(&mut e, 1, nanos(start + at));
            pb::string(&mut e, 2, event);
            pb::message(&mut s, 11, &e);
        }
    }
    if failed(f) {
        let mut status = Vec::new();
        let message = match f.outcome {
            Outcome::Complete | Outcome::Upgraded => format!("status {}", f.code),
            other => other.as_str().to_string(),
        };
        pb::string(&mut status, 2, &message);
        // STATUS_CODE_ERROR.
        pb::varint_field(&mut status, 3, 2);
        pb::message(&mut s, 15, &status);
    }
    Some(s)
}

/// A failure, for the span's status: the request did not end complete (nor joined as an
/// upgrade), or it ended with a server error.
fn failed(f: &Finished) -> bool {
    !matches!(f.outcome, Outcome::Complete | Outcome::Upgraded) || f.code >= 500
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// `s` cut to at most `max` bytes at a character boundary.
fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn kv_str(k: &str, v: &str) -> Vec<u8> {
    let mut value = Vec::new();
    pb::string(&mut value, 1, v);
    let mut kv = Vec::new();
    pb::string(&mut kv, 1, k);
    pb::message(&mut kv, 2, &value);
    kv
}

/// A span's attributes (field 9), each written only when it has a value.
struct Attrs<'a>(&'a mut Vec<u8>);

impl Attrs<'_> {
    fn any(&mut self, k: &str, value: &[u8]) {
        let mut kv = Vec::new();
        pb::string(&mut kv, 1, k);
        pb::message(&mut kv, 2, value);
        pb::message(self.0, 9, &kv);
    }

    fn str(&mut self, k: &str, v: Option<&str>) {
        if let Some(v) = v {
            let mut value = Vec::new();
            pb::string(&mut value, 1, v);
            self.any(k, &value);
        }
    }

    fn int(&mut self, k: &str, v: Option<u64>) {
        if let Some(v) = v {
            let mut value = Vec::new();
            pb::varint_field(&mut value, 3, v);
            self.any(k, &value);
        }
    }

    fn f64(&mut self, k: &str, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            let mut value = Vec::new();
            pb::fixed64(&mut value, 4, v.to_bits());
            self.any(k, &value);
        }
    }

    fn str_array(&mut self, k: &str, items: &[&str]) {
        let mut array = Vec::new();
        for item in items {
            let mut v = Vec::new();
            pb::string(&mut v, 1, item);
            pb::message(&mut array, 1, &v);
        }
        let mut value = Vec::new();
        pb::message(&mut value, 5, &array);
        self.any(k, &value);
    }
}

/// Protobuf's wire format, the little of it OTLP's messages need.
pub mod pb {
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
        varint(out, u64::from(field) << 3 | u64::from(wire));
    }

    pub fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
        tag(out, field, 0);
        varint(out, v);
    }

    pub fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
        tag(out, field, 1);
        out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
        tag(out, field, 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    pub fn string(out: &mut Vec<u8>, field: u32, s: &str) {
        bytes(out, field, s.as_bytes());
    }

    pub fn message(out: &mut Vec<u8>, field: u32, m: &[u8]) {
        bytes(out, field, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut v = Vec::new();
        pb::varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let mut v = Vec::new();
        pb::varint_field(&mut v, 6, 2);
        assert_eq!(v, [0x30, 0x02]);
    }

    #[test]
    fn a_request_without_a_recorded_span_exports_nothing() {
        let f = crate::record::tests::finished();
        assert_eq!(span(&f), None);
    }
}
