//! Every metric tokenmeter exports, and the rules that keep their labels bounded.
//!
//! This is the only module that names a metric: its own names once each in [`names`], which
//! the page and the load generator read the exposition by. The families are private fields of a
//! [`Metrics`] struct built around its own [`Registry`] (never a global), so every test can build
//! a fresh one; this file registers them and holds the whole of `Metrics`' public API, each door
//! a few lines into the file of its concept. No caller passes a label value by position:
//! [`Metrics::record`] takes the [`Finished`] record of a request when it ends,
//! [`Metrics::model`] and [`Metrics::in_flight`] resolve the handles a request moves while it
//! streams (once per request), and [`Metrics::tokens`] feeds the aggregate rate; the live
//! capacity model is the server's, which the meter feeds, and [`Metrics::export_capacity`] makes
//! its answers ([`capacity`]) families refreshed when the exposition is rendered.
//!
//! One idea per file beside this one:
//! - `labels.rs`, the label policy: every label value comes from a closed enum (its own
//!   [`Phase`] and parse-error reason, `protocol`'s, `record`'s and `slo`'s), a fixed band, a
//!   status code, or a bounded set: model names admit at most `--max-models` values and fold the
//!   rest into `other` (through [`Capped`], which bounds the `tenant` label too). With
//!   [`MetricsConfig::tenant`] the families that say who used what carry a `tenant` label after
//!   their own; without it the label does not exist.
//! - `live.rs`: [`ModelMetrics`] and [`InFlight`], the per-event handles (allocation-free).
//! - `recording.rs`: one finished request's record turned into its observations, once;
//!   `goodput.rs`, the rule for which requests count as goodput.
//! - `capped.rs`, `rate.rs` (the aggregate tokens/s window), `engine.rs` (the parts of TTFT the
//!   engines state), and the other naming schemes, `vllm.rs` and [`otel`] (`--compat`).
//!
//! It knows `protocol`'s label enums, `slo`'s verdict and `gpus`' source, and reads the
//! `record` the meter builds; nothing else of the request path.

pub mod buckets;
pub mod capacity;
mod capped;
pub mod cost;
mod engine;
pub mod engine_view;
mod goodput;
mod labels;
mod live;
pub mod names;
pub mod otel;
mod rate;
mod recording;
mod vllm;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use self::buckets::Buckets;
pub use self::capped::{Capped, OTHER};
use self::engine::EngineMetrics;
use self::labels::{tenanted, ModelLabels, ParseError};
pub use self::labels::{Phase, NO_TENANT};
pub use self::live::{InFlight, ModelMetrics};
use self::otel::Otel;
use self::rate::RateWindow;
use self::vllm::Vllm;
use crate::capacity::Capacity;
use crate::cost::{GpuSeconds, Ledger};
use crate::engine::observed::Observed;
use crate::gpus;
use crate::protocol::TokenSource;
use crate::record::{Finished, Sink};
use crate::units::HumanDuration;

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
    bursts: IntCounterVec,
    tokenizer_checks: IntCounterVec,
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
    /// Who pays for the GPU: the charges' families, and the books idle and unassigned are read
    /// from ([`Metrics::export_books`]).
    cost: cost::CostMetrics,
    books: OnceLock<cost::Books>,
    /// What the engine's metrics reader observes, when it runs, and its families.
    engine_view: OnceLock<(Arc<Observed>, engine_view::EngineViewMetrics)>,
    /// Output tokens streamed so far by the requests in flight: the wire's view of the KV
    /// cache they hold (with their prompts, `capacity::wire_tokens`).
    wire_streamed: AtomicI64,
    /// The parts of TTFT the engines state, and their coverage.
    engine: EngineMetrics,
    slo_requests: IntCounterVec,
    goodput_tokens: IntCounterVec,
    /// The families marked `tenant` below carry the `tenant` label (`MetricsConfig::tenant`).
    tenant: bool,
    in_flight_limit: IntGauge,
    connections_limit: IntGauge,
    connections_refused: IntCounter,
    /// By the GOAWAY's reason: HTTP/2's fixed set of error codes, named by the server.
    http2_closed: IntCounterVec,
    metrics_connections_limit: IntGauge,
    metrics_connections_shed: IntCounter,
}

/// `--max-models`' default: a server behind one proxy serves a handful of models (and LoRA
/// adapters); 32 leaves room for those and bounds every family's series by the `model` label.
pub const DEFAULT_MAX_MODELS: usize = 32;

/// `--rate-window`'s default: the aggregate tokens/s gauges over the last 10 s, short enough
/// to follow a burst, long enough to hold a few steps of every stream.
pub const DEFAULT_RATE_WINDOW: HumanDuration = HumanDuration::secs(10);

/// Settings the metrics need.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// `--buckets` and the `--buckets-*` flags.
    pub buckets: Buckets,
    /// `--max-models`: distinct `model` label values kept (at least 1).
    pub max_models: usize,
    /// `--rate-window`.
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
            max_models: DEFAULT_MAX_MODELS,
            rate_window: DEFAULT_RATE_WINDOW.get(),
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
        // The families that carry `tenant` when it is on (docs/tenants.md).
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
        let http2_closed = counter(
            &r,
            names::HTTP2_CONNECTIONS_CLOSED_TOTAL,
            "Client HTTP/2 connections tokenmeter closed with a GOAWAY for what the client did, by the GOAWAY's reason: enhance_your_calm for a flood limit (rapid reset, too many stream errors, a CONTINUATION or empty-frame flood), protocol_error and the others for a broken peer.",
            &["reason"],
        )?;
        let metrics_connections_limit = IntGauge::new(
            names::METRICS_CONNECTIONS_LIMIT,
            "--metrics-max-connections: open connections on the metrics listener; past it the idlest gives way.",
        )?;
        r.register(Box::new(metrics_connections_limit.clone()))?;
        let metrics_connections_shed = IntCounter::new(
            names::METRICS_CONNECTIONS_SHED_TOTAL,
            "Metrics-listener connections closed at --metrics-max-connections: the idlest one, to make room for a new one, or the new one when every open one was in a request.",
        )?;
        r.register(Box::new(metrics_connections_shed.clone()))?;
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
            bursts: counter(
                &r,
                names::REQUEST_BURSTS_TOTAL,
                "Requests whose tokens all arrived faster than 50 us each with no engine-stated decode time: a burst, not a speed, left out of the tokens/s and TPOT histograms.",
                &m,
            )?,
            tokenizer_checks: counter(
                &r,
                names::TOKENIZER_CHECKS_TOTAL,
                "Requests whose --tokenizer count was checked against the server's usage, by direction (input, output) and result (equal, differs).",
                &["direction", "result"],
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
            cost: cost::CostMetrics::register(&r, cfg.tenant, cfg.gpu_hour_cost)?,
            books: OnceLock::new(),
            engine_view: OnceLock::new(),
            wire_streamed: AtomicI64::new(0),
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
            http2_closed,
            metrics_connections_limit,
            metrics_connections_shed,
            registry: r,
        })
    }

    /// Exports the admission caps (`--max-in-flight`, `--max-connections`,
    /// `--metrics-max-connections`).
    pub fn set_limits(&self, in_flight: usize, connections: usize, metrics_connections: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.in_flight_limit.set(g(in_flight));
        self.connections_limit.set(g(connections));
        self.metrics_connections_limit.set(g(metrics_connections));
    }

    /// `tokenmeter_request_log_dropped_total`, registered when `--request-log` is on (so a
    /// proxy without the log exports no such series): the writer's handle.
    pub fn request_log_dropped(&self) -> prometheus::Result<IntCounter> {
        self.register_counter(
            names::REQUEST_LOG_DROPPED_TOTAL,
            "Request log lines dropped because the writer's queue was full (a slow or full disk, a pipe nobody reads).",
        )
    }

    /// The workload trace's counters (`tokenmeter_workload_log_{lines,dropped,skipped}_total`),
    /// registered when `--workload-log` is on: the trace's handles.
    pub fn workload_log_counters(&self) -> prometheus::Result<crate::workload::Counters> {
        Ok(crate::workload::Counters {
            written: self.register_counter(
                names::WORKLOAD_LOG_LINES_TOTAL,
                "Workload trace lines written (--workload-log): one per request for generation sent upstream.",
            )?,
            dropped: self.register_counter(
                names::WORKLOAD_LOG_DROPPED_TOTAL,
                "Workload trace lines dropped: the writer's queue was full, or a write failed (a slow or full disk).",
            )?,
            skipped: self.register_counter(
                names::WORKLOAD_LOG_SKIPPED_TOTAL,
                "Requests for generation not in the workload trace: shed, refused or upgraded, never sent upstream with a prompt.",
            )?,
        })
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

    /// Counts a client HTTP/2 connection closed with a GOAWAY whose reason is `reason`, one of
    /// a fixed set of names.
    pub fn http2_closed(&self, reason: &'static str) {
        self.http2_closed.with_label_values(&[reason]).inc();
    }

    /// Counts a metrics-listener connection shed at `--metrics-max-connections`.
    pub fn metrics_connection_shed(&self) {
        self.metrics_connections_shed.inc();
    }

    /// The `model` label value for a model name: at most `--max-models` distinct names, the
    /// rest `other`, none `unknown` (the label policy's `ModelLabels`).
    pub fn model_label(&self, model: Option<&str>) -> String {
        self.models.label(model)
    }

    /// The per-model handles for one request's live observations, for the request's `tenant`
    /// (ignored unless the label exists).
    pub fn model(&self, label: String, tenant: Option<&Arc<str>>) -> ModelMetrics {
        ModelMetrics::resolve(self, label, tenant)
    }

    /// The in-flight gauges of a request that names `model` (resolved only when a compat
    /// scheme labels them by model).
    pub fn in_flight(&self, model: Option<&str>) -> InFlight {
        InFlight::resolve(self, model)
    }

    /// `delta` output tokens joined (or, negative, left) the KV cache the requests in flight
    /// hold by the wire's count. One atomic add: called on every token-bearing event.
    pub fn wire_streamed(&self, delta: i64) {
        self.wire_streamed.fetch_add(delta, Ordering::Relaxed);
    }

    /// A request's `direction` count by `--tokenizer` was checked against the server's usage.
    pub fn tokenizer_check(&self, direction: &str, equal: bool) {
        let result = if equal { "equal" } else { "differs" };
        self.tokenizer_checks
            .with_label_values(&[direction, result])
            .inc();
    }

    /// Requests decoding right now (one atomic read: it is taken on every token-bearing event).
    pub fn decoding(&self) -> i64 {
        self.decoding.get()
    }

    /// Exports what the engine's metrics reader observes (`--engine-metrics` not off),
    /// refreshed whenever the registry is gathered; a second call changes nothing.
    pub fn export_engine_view(&self, observed: Arc<Observed>) -> prometheus::Result<()> {
        if self.engine_view.get().is_some() {
            return Ok(());
        }
        let families = engine_view::EngineViewMetrics::register(&self.registry)?;
        let _ = self.engine_view.set((observed, families));
        Ok(())
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

    /// `--gpus`.
    pub fn gpus(&self) -> f64 {
        self.gpus
    }

    /// Reads idle and unassigned GPU time from `ledger` at each scrape (the first call wins:
    /// one ledger per process).
    pub fn export_books(&self, ledger: Arc<Ledger>) {
        let _ = self.books.set(ledger);
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

    /// Counts the settlement of a charge booked before the GPU-time split had its rates
    /// (`crate::cost::Ledger::settle_into`), in the series the request was counted in.
    pub fn charge_settled(&self, model: &str, tenant: Option<&str>, g: &GpuSeconds) {
        let tenant = self.tenant.then(|| tenant.unwrap_or(labels::NO_TENANT));
        self.cost.charged(model, tenant, g);
    }

    /// Records one finished request: every end-of-request family, once.
    pub fn record(&self, f: &Finished) {
        recording::observe(self, f);
    }

    /// Refreshes the windowed gauges, sets the capacity answers the model last published, and
    /// gathers every family. `render` encodes exactly this,
    /// and the page (`crate::ui`) reads it, so both show the same values: a gauge refreshed at
    /// read time belongs here, not in `render`.
    pub fn gather(&self) -> Vec<MetricFamily> {
        let now = Instant::now();
        // The last report the model published: a scrape never refits.
        if let Some((model, families)) = self.capacity.get() {
            let report = model.report();
            families.update(&report);
            let in_flight: i64 = [Phase::Prefill, Phase::Decode]
                .iter()
                .map(|p| self.in_flight.with_label_values(&[p.as_str()]).get())
                .sum();
            let wire = capacity::wire_tokens(
                &report,
                self.wire_streamed.load(Ordering::Relaxed) as f64,
                in_flight as f64,
            );
            families.update_wire(wire);
            if let Some(v) = &self.vllm {
                let cache = report.memory.kv_cache_tokens.map(|t| t as f64);
                v.kv_usage(wire.zip(cache).map(|(w, c)| w / c));
            }
        }
        if let Some(ledger) = self.books.get() {
            self.cost.update(ledger, now);
        }
        if let Some((observed, families)) = self.engine_view.get() {
            families.update(observed);
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

/// The metrics take each finished record first ([`Metrics::record`]).
impl Sink for Metrics {
    fn finished(&self, f: &Finished, _at: Instant) {
        self.record(f);
    }
}

#[cfg(test)]
mod tests;
