//! Every metric tokenmeter exports, and the rules that keep their labels bounded.
//!
//! This is the only module that names a metric. The families live in a [`Metrics`] struct built
//! around its own [`Registry`] (never a global), so every test can build a fresh one. Label values
//! come from closed enums ([`Outcome`], [`Phase`], [`TokenSource`], [`ParseError`], [`Api`]), from
//! [`concurrency_band`], from HTTP status codes, or from [`ModelLabels`], which admits at most
//! `--max-models` distinct model names and folds the rest into `other`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::protocol::Api;

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
        }
    }
}

/// How a request ended: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream finished the response and the client received all of it.
    Complete,
    /// The client went away before the response ended.
    ClientDisconnect,
    /// The upstream could not be reached, or failed mid-response.
    UpstreamError,
    /// The upstream took longer than `--upstream-timeout` or `--idle-timeout`.
    Timeout,
    /// The proxy refused the request itself (an unreadable request body, a URI it cannot
    /// forward): a 400 that never reached the upstream.
    BadRequest,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ClientDisconnect => "client_disconnect",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
            Outcome::BadRequest => "bad_request",
        }
    }
}

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

/// Where a request's token counts came from: the `source` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// The stream's own usage report.
    Usage,
    /// Per-event token ids or counts the format carries.
    TokenIds,
    /// Counting token-bearing events.
    Counted,
}

impl TokenSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::TokenIds => "token_ids",
            TokenSource::Counted => "counted",
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
    pub fn as_str(self) -> &'static str {
        match self {
            ParseError::LineTooLong => "line_too_long",
            ParseError::InvalidJson => "invalid_json",
            ParseError::ContentEncoding => "content_encoding",
        }
    }
}

/// The concurrency band a (time-weighted mean) number of requests in flight falls in.
pub fn concurrency_band(mean_in_flight: f64) -> &'static str {
    const BANDS: [(f64, &str); 8] = [
        (1.5, "1"),
        (4.5, "2-4"),
        (8.5, "5-8"),
        (16.5, "9-16"),
        (32.5, "17-32"),
        (64.5, "33-64"),
        (128.5, "65-128"),
        (256.5, "129-256"),
    ];
    BANDS
        .iter()
        .find(|(upper, _)| mean_in_flight < *upper)
        .map_or("257+", |(_, band)| band)
}

/// Admits at most `max` distinct model names as label values; the rest become `other`.
#[derive(Debug)]
pub struct ModelLabels {
    max: usize,
    seen: Mutex<HashSet<String>>,
}

/// Longest model name kept as a label value; longer ones are cut (at a character boundary).
const MAX_MODEL_LABEL_LEN: usize = 128;

impl ModelLabels {
    pub fn new(max: usize) -> Self {
        ModelLabels {
            max,
            seen: Mutex::new(HashSet::new()),
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
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&clean) {
            return clean;
        }
        if seen.len() < self.max {
            seen.insert(clean.clone());
            return clean;
        }
        "other".to_string()
    }
}

/// Output tokens counted over a sliding window, for the aggregate tokens/s gauges.
#[derive(Debug)]
pub struct RateWindow {
    origin: Instant,
    window: Duration,
    slot: Duration,
    /// (slot number, tokens) ring; a slot is reused once its number is out of the window.
    slots: Mutex<Vec<(u64, u64)>>,
}

/// The window is kept in this many slots: the gauge moves in steps of window / SLOTS.
const RATE_SLOTS: u32 = 50;

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        let window = window.max(Duration::from_millis(RATE_SLOTS as u64));
        RateWindow {
            origin: Instant::now(),
            window,
            slot: window / RATE_SLOTS,
            slots: Mutex::new(vec![(u64::MAX, 0); RATE_SLOTS as usize]),
        }
    }

    fn slot_of(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.origin).as_nanos() / self.slot.as_nanos()) as u64
    }

    /// Counts `tokens` produced at `at`.
    pub fn add(&self, tokens: u64, at: Instant) {
        let n = self.slot_of(at);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let cell = &mut slots[(n % RATE_SLOTS as u64) as usize];
        if cell.0 != n {
            *cell = (n, 0);
        }
        cell.1 += tokens;
    }

    /// Tokens per second over the window that ends at `now`.
    pub fn rate(&self, now: Instant) -> f64 {
        let n = self.slot_of(now);
        let oldest = n.saturating_sub(RATE_SLOTS as u64 - 1);
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let total: u64 = slots
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s >= oldest && *s <= n)
            .map(|(_, t)| t)
            .sum();
        total as f64 / self.window.as_secs_f64()
    }
}

/// All metric families, registered in one registry.
pub struct Metrics {
    registry: Registry,
    pub models: ModelLabels,
    pub rate: RateWindow,
    gpus: f64,
    pub ttft: HistogramVec,
    pub ttfb: HistogramVec,
    pub itl: HistogramVec,
    pub tpot: HistogramVec,
    pub request_tps: HistogramVec,
    pub duration: HistogramVec,
    pub output_tokens: HistogramVec,
    pub input_tokens: HistogramVec,
    pub output_tokens_total: IntCounterVec,
    pub input_tokens_total: IntCounterVec,
    pub token_source: IntCounterVec,
    pub requests: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub parse_errors: IntCounterVec,
    output_tps: Gauge,
    output_tps_per_gpu: Gauge,
}

/// Settings the metrics need.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    pub buckets: Buckets,
    pub max_models: usize,
    pub rate_window: Duration,
    pub gpus: f64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            buckets: Buckets::default(),
            max_models: 32,
            rate_window: Duration::from_secs(10),
            gpus: 1.0,
        }
    }
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> prometheus::Result<HistogramVec> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )?;
    r.register(Box::new(h.clone()))?;
    Ok(h)
}

fn counter(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<Gauge> {
    let g = Gauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    /// Builds and registers every family. Fails only on invalid bucket boundaries.
    pub fn new(cfg: &MetricsConfig) -> prometheus::Result<Self> {
        let r = Registry::new();
        let b = &cfg.buckets;
        let m = ["model"];
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "tokenmeter_requests_in_flight",
                "Requests in flight: prefill (no token yet) or decode (streaming), until the stream's end marker.",
            ),
            &["phase"],
        )?;
        r.register(Box::new(in_flight.clone()))?;
        for p in [Phase::Prefill, Phase::Decode] {
            in_flight.with_label_values(&[p.as_str()]).set(0);
        }
        let gpus = gauge(&r, "tokenmeter_gpus", "GPUs behind this proxy (--gpus).")?;
        gpus.set(cfg.gpus);
        let build = IntGaugeVec::new(
            Opts::new(
                "tokenmeter_build_info",
                "Always 1; the version label says which build.",
            ),
            &["version"],
        )?;
        r.register(Box::new(build.clone()))?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let uptime = IntGauge::new(
            "tokenmeter_start_time_seconds",
            "Unix time the process started.",
        )?;
        uptime.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
        r.register(Box::new(uptime))?;
        let parse_errors = counter(
            &r,
            "tokenmeter_parse_errors_total",
            "Parts of response bodies that could not be parsed (they are still forwarded untouched).",
            &["reason"],
        )?;
        for e in [
            ParseError::LineTooLong,
            ParseError::InvalidJson,
            ParseError::ContentEncoding,
        ] {
            parse_errors.with_label_values(&[e.as_str()]);
        }
        let token_source = counter(
            &r,
            "tokenmeter_token_count_source_total",
            "Requests by where their token counts came from.",
            &["source"],
        )?;
        for s in [
            TokenSource::Usage,
            TokenSource::TokenIds,
            TokenSource::Counted,
        ] {
            token_source.with_label_values(&[s.as_str()]);
        }
        Ok(Metrics {
            models: ModelLabels::new(cfg.max_models),
            rate: RateWindow::new(cfg.rate_window),
            gpus: cfg.gpus,
            ttft: histogram(
                &r,
                "tokenmeter_time_to_first_token_seconds",
                "From the request's arrival to the first token-bearing event.",
                &m,
                &b.ttft,
            )?,
            ttfb: histogram(
                &r,
                "tokenmeter_time_to_first_byte_seconds",
                "From the request's arrival to the first byte of the response body.",
                &m,
                &b.ttft,
            )?,
            itl: histogram(
                &r,
                "tokenmeter_inter_token_latency_seconds",
                "Gap between token-bearing events divided by the tokens the later one carries, observed once per token.",
                &m,
                &b.itl,
            )?,
            tpot: histogram(
                &r,
                "tokenmeter_time_per_output_token_seconds",
                "Per request: (last token time - first token time) / (output tokens - 1).",
                &m,
                &b.itl,
            )?,
            request_tps: histogram(
                &r,
                "tokenmeter_request_tokens_per_second",
                "Per request decode speed, (output tokens - 1) / decode time, by band of mean requests in flight during the decode.",
                &["model", "concurrency"],
                &b.tps,
            )?,
            duration: histogram(
                &r,
                "tokenmeter_request_duration_seconds",
                "End to end: the request's arrival to the last byte of the response.",
                &m,
                &b.duration,
            )?,
            output_tokens: histogram(
                &r,
                "tokenmeter_request_output_tokens",
                "Output tokens per request.",
                &m,
                &b.tokens,
            )?,
            input_tokens: histogram(
                &r,
                "tokenmeter_request_input_tokens",
                "Prompt tokens per request (where the stream reports them).",
                &m,
                &b.tokens,
            )?,
            output_tokens_total: counter(
                &r,
                "tokenmeter_output_tokens_total",
                "Output tokens generated.",
                &m,
            )?,
            input_tokens_total: counter(
                &r,
                "tokenmeter_input_tokens_total",
                "Prompt tokens processed (where the stream reports them).",
                &m,
            )?,
            token_source,
            requests: counter(
                &r,
                "tokenmeter_requests_total",
                "Requests by model, HTTP status code, outcome and the API parser that ran.",
                &["model", "code", "outcome", "api"],
            )?,
            in_flight,
            parse_errors,
            output_tps: gauge(
                &r,
                "tokenmeter_output_tokens_per_second",
                "Aggregate output tokens/s over the last --rate-window.",
            )?,
            output_tps_per_gpu: gauge(
                &r,
                "tokenmeter_output_tokens_per_second_per_gpu",
                "tokenmeter_output_tokens_per_second / tokenmeter_gpus.",
            )?,
            registry: r,
        })
    }

    /// Counts one request's outcome.
    pub fn count_request(&self, model: &str, code: u16, outcome: Outcome, api: Api) {
        let code = code.to_string();
        self.requests
            .with_label_values(&[model, &code, outcome.as_str(), api.as_str()])
            .inc();
    }

    /// Counts a parse problem.
    pub fn parse_error(&self, reason: ParseError, n: u64) {
        if n > 0 {
            self.parse_errors
                .with_label_values(&[reason.as_str()])
                .inc_by(n);
        }
    }

    /// Moves one request into or out of a phase.
    pub fn phase(&self, phase: Phase, delta: i64) {
        self.in_flight
            .with_label_values(&[phase.as_str()])
            .add(delta);
    }

    /// Refreshes the windowed gauges and renders the Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let tps = self.rate.rate(Instant::now());
        self.output_tps.set(tps);
        self.output_tps_per_gpu.set(if self.gpus > 0.0 {
            tps / self.gpus
        } else {
            0.0
        });
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for families we built ourselves.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_match_the_documented_edges() {
        let cases = [
            (1.0, "1"),
            (1.4, "1"),
            (2.0, "2-4"),
            (4.0, "2-4"),
            (5.0, "5-8"),
            (8.0, "5-8"),
            (16.0, "9-16"),
            (17.0, "17-32"),
            (64.0, "33-64"),
            (128.0, "65-128"),
            (256.0, "129-256"),
            (257.0, "257+"),
            (5000.0, "257+"),
        ];
        for (x, band) in cases {
            assert_eq!(concurrency_band(x), band, "{x}");
        }
    }

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
    fn rate_window_forgets_old_tokens() {
        let w = RateWindow::new(Duration::from_secs(10));
        let t0 = w.origin;
        w.add(100, t0);
        w.add(100, t0 + Duration::from_secs(5));
        assert_eq!(w.rate(t0 + Duration::from_secs(5)), 20.0);
        assert_eq!(w.rate(t0 + Duration::from_millis(10_100)), 10.0);
        assert_eq!(w.rate(t0 + Duration::from_secs(30)), 0.0);
    }

    #[test]
    fn exposition_has_every_family() {
        let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
        m.count_request("m", 200, Outcome::Complete, Api::OpenAi);
        let text = String::from_utf8(m.render()).expect("utf8");
        for name in [
            "tokenmeter_requests_in_flight{phase=\"prefill\"} 0",
            "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"complete\"} 1",
            "tokenmeter_gpus 1",
            "tokenmeter_output_tokens_per_second 0",
            "tokenmeter_token_count_source_total{source=\"usage\"} 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
