//! Every metric tokenmeter exports, and the rules that keep their labels bounded.
//!
//! This is the only module that names a metric: its own names once each in [`names`], which
//! the page and the load generator read the exposition by. The families are private fields of a
//! [`Metrics`] struct built around its own [`Registry`] (never a global), so every test can build
//! a fresh one. Callers go through one door: [`Metrics::record`] takes the [`Finished`] record of
//! a request when it ends, [`Metrics::model`] resolves the per-model handles a request observes
//! while it streams (once per request), and [`Metrics::in_flight`] and [`Metrics::tokens`] move
//! the live gauges; the live capacity model is the server's, which the meter feeds, and
//! [`Metrics::export_capacity`] makes its answers ([`capacity`]) families refreshed when the
//! exposition is rendered. No caller passes a label value by position.
//!
//! Label values come from closed enums ([`Outcome`], [`Phase`], [`TokenSource`], [`ParseError`],
//! [`Api`]), from [`concurrency_band`](crate::record::concurrency_band), from HTTP status
//! codes, or from [`ModelLabels`], which admits at most `--max-models` distinct model names and
//! folds the rest into `other` (through [`Capped`], which bounds the `tenant` label too). With [`MetricsConfig::tenant`] the families
//! that say who used what carry a `tenant` label after their own ([`TENANT_LABEL`]); without it
//! the label does not exist. This
//! module knows `protocol`'s label enums and nothing else of the request path: the meter builds
//! the [`Finished`] record defined here.

pub mod buckets;
pub mod capacity;
mod capped;
mod engine;
pub mod names;
pub mod otel;
mod rate;
mod vllm;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use self::buckets::Buckets;
pub use self::capped::{Capped, OTHER};
use self::engine::EngineMetrics;
use self::otel::Otel;
pub use self::rate::RateWindow;
pub use self::vllm::FinishedReason;
use self::vllm::{Vllm, VllmInFlight, VllmLive};
use crate::capacity::Capacity;
pub use crate::context::Ident;
use crate::gpus;
pub use crate::protocol::timings::EngineTimings;
use crate::protocol::Api;
pub use crate::protocol::{OutputKind, Stop, TokenSource};
use crate::record::{Finished, Outcome};
use crate::slo::Verdict;

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

impl ModelMetrics {
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

impl InFlight {
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

/// Other naming schemes exported beside `tokenmeter_*` (`--compat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compat {
    /// vLLM's series (`vllm:*`, label `model_name`).
    pub vllm: bool,
    /// OpenTelemetry's GenAI series (`gen_ai_*`, labels `gen_ai_*` and `error_type`).
    pub otel: bool,
}

/// All metric families, registered in one registry.
pub struct Metrics {
    registry: Registry,
    models: ModelLabels,
    rate: RateWindow,
    gpus: f64,
    ttft: HistogramVec,
    ttfb: HistogramVec,
    itl: HistogramVec,
    tpot: HistogramVec,
    request_tps: HistogramVec,
    duration: HistogramVec,
    output_tokens: HistogramVec,
    input_tokens: HistogramVec,
    output_tokens_total: IntCounterVec,
    input_tokens_total: IntCounterVec,
    tokens_per_event: HistogramVec,
    max_stall: HistogramVec,
    first_output: HistogramVec,
    reasoning_tokens_total: IntCounterVec,
    cached_input_tokens_total: IntCounterVec,
    token_source: IntCounterVec,
    requests: IntCounterVec,
    in_flight: IntGaugeVec,
    parse_errors: IntCounterVec,
    output_tps: Gauge,
    output_tps_per_gpu: Gauge,
    vllm: Option<Vllm>,
    otel: Option<Otel>,
    /// The decode-phase child of `in_flight`, resolved once: read on every token-bearing event.
    decoding: IntGauge,
    /// The live capacity model, when one is exported ([`Metrics::export_capacity`]), and its
    /// families.
    capacity: OnceLock<(Arc<Capacity>, capacity::CapacityMetrics)>,
    /// The parts of TTFT the engines state, and their coverage.
    engine: EngineMetrics,
    slo_requests: IntCounterVec,
    goodput_tokens: IntCounterVec,
    /// The families marked `tenant` below carry the `tenant` label (`MetricsConfig::tenant`).
    tenant: bool,
    in_flight_limit: IntGauge,
    connections_limit: IntGauge,
    connections_refused: IntCounter,
}

/// Settings the metrics need.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    pub buckets: Buckets,
    pub max_models: usize,
    pub rate_window: Duration,
    /// `--gpus`: the one place the count is held (the capacity model's fleet reads it here).
    pub gpus: f64,
    /// `--compat`: the other naming schemes to export.
    pub compat: Compat,
    /// Where `gpus` came from: the `source` label of `tokenmeter_gpus`.
    pub gpu_source: gpus::Source,
    /// `--gpu-hour-cost`: `tokenmeter_gpu_hour_cost` is exported only when set. The one place
    /// the cost is held: the capacity model's cost per million tokens reads it here.
    pub gpu_hour_cost: Option<f64>,
    /// Each SLO class with its objective, for `tokenmeter_slo_objective`.
    pub slo_objectives: Vec<(String, f64)>,
    /// The `tenant` label exists (`--tenant-header`, `--tenant-from-key`): without it the
    /// series are exactly those of a tokenmeter that knows no tenants.
    pub tenant: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            buckets: Buckets::default(),
            max_models: 32,
            rate_window: Duration::from_secs(10),
            gpus: 1.0,
            compat: Compat::default(),
            gpu_source: gpus::Source::Default,
            gpu_hour_cost: None,
            slo_objectives: crate::slo::Classes::default()
                .iter()
                .map(|(name, t)| (name.to_string(), t.objective))
                .collect(),
            tenant: false,
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
    register_histogram(
        r,
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

/// Builds and registers a histogram family from its options (a compat scheme adds constant
/// labels to them).
fn register_histogram(
    r: &Registry,
    opts: HistogramOpts,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    let h = HistogramVec::new(opts, labels)?;
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
        // The families that carry `tenant` when it is on (README, "Tenants").
        let t = |names: &[&'static str]| tenanted(names, cfg.tenant);
        let in_flight = IntGaugeVec::new(
            Opts::new(
                names::REQUESTS_IN_FLIGHT,
                "Requests in flight: prefill (no token yet) or decode (streaming), until the stream's end marker.",
            ),
            &["phase"],
        )?;
        r.register(Box::new(in_flight.clone()))?;
        for p in [Phase::Prefill, Phase::Decode] {
            in_flight.with_label_values(&[p.as_str()]).set(0);
        }
        let gpus = GaugeVec::new(
            Opts::new(
                names::GPUS,
                "GPUs behind this proxy (--gpus); source says where the number came from.",
            ),
            &["source"],
        )?;
        r.register(Box::new(gpus.clone()))?;
        gpus.with_label_values(&[cfg.gpu_source.as_str()])
            .set(cfg.gpus);
        if let Some(cost) = cfg.gpu_hour_cost {
            gauge(
                &r,
                names::GPU_HOUR_COST,
                "What one GPU costs per hour, in USD (--gpu-hour-cost).",
            )?
            .set(cost);
        }
        let objective = GaugeVec::new(
            Opts::new(
                names::SLO_OBJECTIVE,
                "The share of an SLO class's requests that must meet its targets (--slo objective).",
            ),
            &["class"],
        )?;
        r.register(Box::new(objective.clone()))?;
        for (class, o) in &cfg.slo_objectives {
            objective.with_label_values(&[class]).set(*o);
        }
        let build = IntGaugeVec::new(
            Opts::new(
                names::BUILD_INFO,
                "Always 1; the version label says which build.",
            ),
            &["version"],
        )?;
        r.register(Box::new(build.clone()))?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let uptime = IntGauge::new(names::START_TIME_SECONDS, "Unix time the process started.")?;
        uptime.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
        r.register(Box::new(uptime))?;
        let in_flight_limit = IntGauge::new(
            names::IN_FLIGHT_LIMIT,
            "--max-in-flight: requests proxied at once; more are shed (503, outcome shed).",
        )?;
        r.register(Box::new(in_flight_limit.clone()))?;
        let connections_limit = IntGauge::new(
            names::CONNECTIONS_LIMIT,
            "--max-connections: open client connections; more are closed when accepted.",
        )?;
        r.register(Box::new(connections_limit.clone()))?;
        let connections_refused = IntCounter::new(
            names::CONNECTIONS_REFUSED_TOTAL,
            "Client connections closed as soon as they were accepted, at --max-connections.",
        )?;
        r.register(Box::new(connections_refused.clone()))?;
        let parse_errors = counter(
            &r,
            names::PARSE_ERRORS_TOTAL,
            "Parts of response bodies that could not be parsed (they are still forwarded untouched).",
            &["reason"],
        )?;
        for e in ParseError::ALL {
            parse_errors.with_label_values(&[e.as_str()]);
        }
        let token_source = counter(
            &r,
            names::TOKEN_COUNT_SOURCE_TOTAL,
            "Requests by where their token counts came from.",
            &["source"],
        )?;
        for s in TokenSource::ALL {
            token_source.with_label_values(&[s.as_str()]);
        }
        let vllm = match cfg.compat.vllm {
            true => Some(Vllm::new(&r, b)?),
            false => None,
        };
        let otel = match cfg.compat.otel {
            true => Some(Otel::new(&r)?),
            false => None,
        };
        Ok(Metrics {
            vllm,
            otel,
            models: ModelLabels::new(cfg.max_models),
            rate: RateWindow::new(cfg.rate_window),
            gpus: cfg.gpus,
            ttft: histogram(
                &r,
                names::TIME_TO_FIRST_TOKEN_SECONDS,
                "From the request's arrival to the first token-bearing event (of any kind), by band of the prompt's tokens.",
                &t(&["model", "prompt"]),
                &b.ttft,
            )?,
            ttfb: histogram(
                &r,
                names::TIME_TO_FIRST_BYTE_SECONDS,
                "From the request's arrival to the first byte of the response body.",
                &m,
                &b.ttft,
            )?,
            itl: histogram(
                &r,
                names::INTER_TOKEN_LATENCY_SECONDS,
                "Gap between token-bearing events divided by the tokens the later one carries, observed once per token.",
                &m,
                &b.itl,
            )?,
            tpot: histogram(
                &r,
                names::TIME_PER_OUTPUT_TOKEN_SECONDS,
                "Per request: (last token time - first token time) / (output tokens - 1).",
                &m,
                &b.itl,
            )?,
            request_tps: histogram(
                &r,
                names::REQUEST_TOKENS_PER_SECOND,
                "Per request decode speed, (output tokens - 1) / decode time, by band of mean requests in flight during the decode.",
                &t(&["model", "concurrency"]),
                &b.tps,
            )?,
            duration: histogram(
                &r,
                names::REQUEST_DURATION_SECONDS,
                "End to end: the request's arrival to the last byte of the response.",
                &m,
                &b.duration,
            )?,
            output_tokens: histogram(
                &r,
                names::REQUEST_OUTPUT_TOKENS,
                "Output tokens per request.",
                &m,
                &b.tokens,
            )?,
            input_tokens: histogram(
                &r,
                names::REQUEST_INPUT_TOKENS,
                "Prompt tokens per request (where the stream reports them).",
                &m,
                &b.tokens,
            )?,
            output_tokens_total: counter(
                &r,
                names::OUTPUT_TOKENS_TOTAL,
                "Output tokens generated.",
                &t(&m),
            )?,
            input_tokens_total: counter(
                &r,
                names::INPUT_TOKENS_TOTAL,
                "Prompt tokens processed (where the stream reports them).",
                &t(&m),
            )?,
            tokens_per_event: histogram(
                &r,
                names::TOKENS_PER_EVENT,
                "Output tokens per token-bearing event: token ids where sent, the growth of usage repeated in every chunk, else 1.",
                &m,
                &b.per_event,
            )?,
            max_stall: histogram(
                &r,
                names::REQUEST_MAX_STALL_SECONDS,
                "Per request: the longest gap between two token-bearing events (TTFT not counted).",
                &m,
                &b.stall,
            )?,
            first_output: histogram(
                &r,
                names::TIME_TO_FIRST_OUTPUT_SECONDS,
                "From the request's arrival to the first event of each kind of output (reasoning, content, tool_call).",
                &["model", "kind"],
                &b.ttft,
            )?,
            reasoning_tokens_total: counter(
                &r,
                names::REASONING_TOKENS_TOTAL,
                "Reasoning tokens (part of the output tokens): usage's reasoning details where reported, else counted from reasoning events.",
                &t(&m),
            )?,
            cached_input_tokens_total: counter(
                &r,
                names::CACHED_INPUT_TOKENS_TOTAL,
                "Prompt tokens read from (read) or written to (write) the server's prompt cache, where usage reports them.",
                &t(&["model", "kind"]),
            )?,
            token_source,
            requests: counter(
                &r,
                names::REQUESTS_TOTAL,
                "Requests by model, HTTP status code, outcome and the API parser that ran.",
                &t(&["model", "code", "outcome", "api"]),
            )?,
            decoding: in_flight.with_label_values(&[Phase::Decode.as_str()]),
            engine: EngineMetrics::new(&r, b)?,
            capacity: OnceLock::new(),
            in_flight,
            parse_errors,
            output_tps: gauge(
                &r,
                names::OUTPUT_TOKENS_PER_SECOND,
                "Aggregate output tokens/s over the last --rate-window.",
            )?,
            output_tps_per_gpu: gauge(
                &r,
                names::OUTPUT_TOKENS_PER_SECOND_PER_GPU,
                "tokenmeter_output_tokens_per_second / tokenmeter_gpus.",
            )?,
            slo_requests: counter(
                &r,
                names::SLO_REQUESTS_TOTAL,
                "Requests by SLO class, model, concurrency band and result (met, the first target missed, error, or the client gone first), counted once when they end.",
                &t(&["class", "model", "concurrency", "result"]),
            )?,
            goodput_tokens: counter(
                &r,
                names::GOODPUT_OUTPUT_TOKENS_TOTAL,
                "Output tokens of requests that met their SLO class's targets.",
                &t(&["class", "model"]),
            )?,
            tenant: cfg.tenant,
            in_flight_limit,
            connections_limit,
            connections_refused,
            registry: r,
        })
    }

    /// Exports the admission caps (`--max-in-flight`, `--max-connections`).
    pub fn set_limits(&self, in_flight: usize, connections: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.in_flight_limit.set(g(in_flight));
        self.connections_limit.set(g(connections));
    }

    /// `tokenmeter_request_log_dropped_total`, registered when `--request-log` is on (so a
    /// proxy without the log exports no such series): the writer's handle.
    pub fn request_log_dropped(&self) -> prometheus::Result<IntCounter> {
        self.register_counter(
            names::REQUEST_LOG_DROPPED_TOTAL,
            "Request log lines dropped because the writer's queue was full (a slow or full disk, a pipe nobody reads).",
        )
    }

    /// `tokenmeter_trace_spans_dropped_total`, registered when spans are exported
    /// (`--otlp-endpoint`): the exporter's handle.
    pub fn trace_spans_dropped(&self) -> prometheus::Result<IntCounter> {
        self.register_counter(
            names::TRACE_SPANS_DROPPED_TOTAL,
            "Spans dropped: the export queue was full, or the collector refused or did not answer a batch.",
        )
    }

    fn register_counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        let c = IntCounter::new(name, help)?;
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    /// Counts a client connection closed at `--max-connections`.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// The `model` label value for a model name (bounded: see [`ModelLabels`]).
    pub fn model_label(&self, model: Option<&str>) -> String {
        self.models.label(model)
    }

    /// The per-model handles for one request's live observations, for the request's `tenant`
    /// (ignored unless the label exists).
    pub fn model(&self, label: String, tenant: Option<&Arc<str>>) -> ModelMetrics {
        let tenant = self
            .tenant
            .then(|| tenant.map_or_else(|| Arc::from(NO_TENANT), Arc::clone));
        ModelMetrics {
            ttft: self.ttft.clone(),
            itl: self.itl.with_label_values(&[&label]),
            vllm: self.vllm.as_ref().map(|v| v.live(&label)),
            per_event: self.tokens_per_event.with_label_values(&[&label]),
            output_total: child(&self.output_tokens_total, &[&label], tenant.as_deref()),
            label,
            tenant,
        }
    }

    /// The in-flight gauges of a request that names `model` (resolved only when a compat
    /// scheme labels them by model).
    pub fn in_flight(&self, model: Option<&str>) -> InFlight {
        InFlight {
            prefill: self.in_flight.with_label_values(&[Phase::Prefill.as_str()]),
            decode: self.in_flight.with_label_values(&[Phase::Decode.as_str()]),
            vllm: self
                .vllm
                .as_ref()
                .map(|v| v.in_flight(&self.model_label(model))),
        }
    }

    /// Requests decoding right now (one atomic read: it is taken on every token-bearing event).
    pub fn decoding(&self) -> i64 {
        self.decoding.get()
    }

    /// Exports `model`'s answers (its families are registered now, one per class it knows),
    /// refreshed whenever the registry is gathered. The model is the server's, which the meter
    /// feeds; a second call changes nothing.
    pub fn export_capacity(&self, model: Arc<Capacity>) -> prometheus::Result<()> {
        if self.capacity.get().is_some() {
            return Ok(());
        }
        let families =
            capacity::CapacityMetrics::register(&self.registry, &model.config().classes)?;
        let _ = self.capacity.set((model, families));
        Ok(())
    }

    /// Counts `n` output tokens produced at `at` in the aggregate rate.
    pub fn tokens(&self, n: u64, at: Instant) {
        if n > 0 {
            self.rate.add(n, at);
        }
    }

    /// Aggregate output tokens per second over the window ending at `now`.
    pub fn output_rate(&self, now: Instant) -> f64 {
        self.rate.rate(now)
    }

    /// Records one finished request: every end-of-request family, once.
    pub fn record(&self, f: &Finished) {
        let model = f.model.as_str();
        let code = f.code.to_string();
        let tenant = self.tenant_value(f);
        let values = [model, &code, f.outcome.as_str(), f.api.as_str()];
        child(&self.requests, &values, tenant).inc();
        let e = &f.parse_errors;
        self.parse_error(ParseError::InvalidJson, e.invalid_json);
        self.parse_error(ParseError::LineTooLong, e.line_too_long);
        self.parse_error(ParseError::ContentEncoding, e.content_encoding);
        if let Some(slo) = &f.slo {
            let values = [&*slo.class, model, slo.band, slo.verdict.as_str()];
            child(&self.slo_requests, &values, tenant).inc();
            // Every request that met its targets has a goodput series, 0 tokens or more, so
            // goodput is never absent where requests were met.
            if slo.verdict == Verdict::Met {
                let good = if f.api == Api::Unknown {
                    0
                } else {
                    f.output_tokens
                };
                child(&self.goodput_tokens, &[&slo.class, model], tenant).inc_by(good);
            }
        }
        self.duration
            .with_label_values(&[model])
            .observe(f.duration.as_secs_f64());
        if let Some(fb) = f.first_byte {
            self.ttfb
                .with_label_values(&[model])
                .observe(fb.as_secs_f64());
        }
        if let Some(o) = &self.otel {
            // "If available": an empty value, which Prometheus reads as no label.
            let requested = match &f.request_model {
                Some(name) => self.models.label(Some(name)),
                None => String::new(),
            };
            o.record(f, &requested);
        }
        if f.api == Api::Unknown {
            return;
        }
        if let Some(v) = &self.vllm {
            v.record(f);
        }
        self.engine.record(f);
        let output = f.output_tokens;
        self.token_source
            .with_label_values(&[f.token_source.as_str()])
            .inc();
        // Tokens already counted as they streamed stay; the final count settles the rest.
        child(&self.output_tokens_total, &[model], tenant)
            .inc_by(output.saturating_sub(f.streamed_tokens));
        self.output_tokens
            .with_label_values(&[model])
            .observe(output as f64);
        if let Some(input) = f.input_tokens {
            child(&self.input_tokens_total, &[model], tenant).inc_by(input);
            self.input_tokens
                .with_label_values(&[model])
                .observe(input as f64);
        }
        if let Some(r) = f.reasoning_tokens {
            child(&self.reasoning_tokens_total, &[model], tenant).inc_by(r);
        }
        for (kind, n) in [
            ("read", f.cached_input.read),
            ("write", f.cached_input.write),
        ] {
            if let Some(n) = n {
                child(&self.cached_input_tokens_total, &[model, kind], tenant).inc_by(n);
            }
        }
        for (kind, at) in OutputKind::ALL.iter().zip(f.first_output) {
            if let Some(at) = at {
                self.first_output
                    .with_label_values(&[model, kind.as_str()])
                    .observe(at.as_secs_f64());
            }
        }
        if let Some(stall) = f.max_stall {
            self.max_stall
                .with_label_values(&[model])
                .observe(stall.as_secs_f64());
        }
        let decode = f.decode_time().map_or(0.0, |d| d.as_secs_f64());
        if output >= 2 && decode > 0.0 {
            self.tpot
                .with_label_values(&[model])
                .observe(decode / (output - 1) as f64);
            child(&self.request_tps, &[model, f.band()], tenant)
                .observe((output - 1) as f64 / decode);
        }
    }

    /// Request counts summed over every label but `outcome`: (all, complete). For the demo's
    /// closing line.
    pub fn request_totals(&self) -> (u64, u64) {
        let mut all = 0;
        let mut complete = 0;
        for mf in self.requests.collect() {
            for m in mf.get_metric() {
                let n = m.get_counter().get_value() as u64;
                all += n;
                let ok = m
                    .get_label()
                    .iter()
                    .any(|l| l.name() == "outcome" && l.value() == Outcome::Complete.as_str());
                if ok {
                    complete += n;
                }
            }
        }
        (all, complete)
    }

    /// Output tokens summed over every model. For the demo's closing line.
    pub fn output_tokens_total(&self) -> u64 {
        self.output_tokens_total
            .collect()
            .iter()
            .flat_map(|mf| mf.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// The `tenant` label value of a finished request, when the label exists.
    fn tenant_value<'a>(&self, f: &'a Finished) -> Option<&'a str> {
        self.tenant
            .then(|| f.tenant.as_deref().unwrap_or(NO_TENANT))
    }

    fn parse_error(&self, reason: ParseError, n: u64) {
        if n > 0 {
            self.parse_errors
                .with_label_values(&[reason.as_str()])
                .inc_by(n);
        }
    }

    /// Refreshes the windowed gauges and the capacity answers, and gathers every family. `render` encodes exactly this,
    /// and the page (`crate::ui`) reads it, so both show the same values: a gauge refreshed at
    /// read time belongs here, not in `render`.
    pub fn gather(&self) -> Vec<MetricFamily> {
        let now = Instant::now();
        // Refitted at most every capacity::REFIT_INTERVAL, however often it is read.
        if let Some((model, families)) = self.capacity.get() {
            families.update(&model.report(now));
        }
        let tps = self.rate.rate(now);
        self.output_tps.set(tps);
        self.output_tps_per_gpu.set(if self.gpus > 0.0 {
            tps / self.gpus
        } else {
            0.0
        });
        self.registry.gather()
    }

    /// Renders the Prometheus text exposition of [`Metrics::gather`].
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for families we built ourselves.
        let _ = TextEncoder::new().encode(&self.gather(), &mut out);
        out
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
fn tenanted(names: &[&'static str], on: bool) -> Vec<&'static str> {
    let mut v = names.to_vec();
    if on {
        v.push(TENANT_LABEL);
    }
    v
}

/// The child of `vec` for `values`, and `tenant` after them when it is `Some`: what a family
/// registered through [`tenanted`] takes. No allocation: the values are gathered on the stack.
fn child<T: MetricVecBuilder>(vec: &MetricVec<T>, values: &[&str], tenant: Option<&str>) -> T::M {
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
mod tests;
