//! Every metric tokenmeter exports, and the rules that keep their labels bounded.
//!
//! This is the only module that names a metric: every `tokenmeter_*` name once in [`names`],
//! which the page, the tools and the tests read the exposition by. The families are private
//! fields of a [`Metrics`] struct built around its own registry (never a global), so every test
//! can build a fresh one; `families.rs` registers the request path's families one group at a
//! time, and this file calls the groups and holds the whole of `Metrics`' public API, each door
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
//! - `families.rs`: the groups of families (admission, requests, latency, tokens, throughput,
//!   SLO), each registered by its own function, and the registrar every family goes through;
//!   `tests/golden/exposition.txt` lists every family it can hold.
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
mod families;
mod goodput;
mod labels;
mod live;
pub mod names;
pub mod otel;
mod rate;
mod recording;
mod registrar;
mod vllm;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;
use prometheus::{Encoder, IntCounter, TextEncoder};

pub use self::buckets::Buckets;
pub use self::capped::{Capped, OTHER};
use self::engine::EngineMetrics;
use self::families::{Admission, Latency, Requests, Slo, Throughput, Tokens};
use self::labels::ModelLabels;
pub use self::labels::{Phase, NO_TENANT};
pub use self::live::{InFlight, ModelMetrics};
use self::otel::Otel;
use self::rate::RateWindow;
use self::registrar::Registrar;
use self::vllm::Vllm;
use crate::capacity::Capacity;
use crate::cost::{GpuSeconds, Ledger};
use crate::engine::observed::Observed;
use crate::gpus;
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
    registry: Registrar,
    models: ModelLabels,
    rate: RateWindow,
    gpus: f64,
    /// Whether the families that say who used what carry the `tenant` label
    /// (`MetricsConfig::tenant`).
    tenant: bool,
    admission: Admission,
    requests: Requests,
    latency: Latency,
    tokens: Tokens,
    throughput: Throughput,
    slo: Slo,
    /// The parts of TTFT the engines state, and their coverage.
    engine: EngineMetrics,
    /// Who pays for the GPU: the charges' families, and the books idle and unassigned are read
    /// from ([`Metrics::export_books`]).
    cost: cost::CostMetrics,
    books: OnceLock<cost::Books>,
    vllm: Option<Vllm>,
    otel: Option<Otel>,
    /// The live capacity model, when one is exported ([`Metrics::export_capacity`]), and its
    /// families.
    capacity: OnceLock<(Arc<Capacity>, capacity::CapacityMetrics)>,
    /// What the engine's metrics reader observes, when it runs, and its families.
    engine_view: OnceLock<(Arc<Observed>, engine_view::EngineViewMetrics)>,
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

impl Metrics {
    /// Builds and registers every family of the request path, one group at a time (the groups
    /// are in `families.rs`; those of the parts that may not run register when they start).
    /// Fails only on invalid bucket boundaries.
    pub fn new(cfg: &MetricsConfig) -> prometheus::Result<Self> {
        let r = Registrar::new();
        let b = &cfg.buckets;
        families::register_process(&r, cfg)?;
        Ok(Metrics {
            admission: Admission::register(&r)?,
            requests: Requests::register(&r, cfg.tenant)?,
            latency: Latency::register(&r, b, cfg.tenant)?,
            tokens: Tokens::register(&r, b, cfg.tenant)?,
            throughput: Throughput::register(&r)?,
            slo: Slo::register(&r, cfg)?,
            engine: EngineMetrics::new(&r, b)?,
            cost: cost::CostMetrics::register(&r, cfg.tenant, cfg.gpu_hour_cost)?,
            vllm: cfg.compat.vllm.then(|| Vllm::new(&r, b)).transpose()?,
            otel: cfg.compat.otel.then(|| Otel::new(&r)).transpose()?,
            models: ModelLabels::new(cfg.max_models),
            rate: RateWindow::new(cfg.rate_window),
            gpus: cfg.gpus,
            tenant: cfg.tenant,
            books: OnceLock::new(),
            capacity: OnceLock::new(),
            engine_view: OnceLock::new(),
            registry: r,
        })
    }

    /// Exports the admission caps (`--max-in-flight`, `--max-connections`,
    /// `--metrics-max-connections`).
    pub fn set_limits(&self, in_flight: usize, connections: usize, metrics_connections: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.admission.in_flight_limit.set(g(in_flight));
        self.admission.connections_limit.set(g(connections));
        self.admission
            .metrics_connections_limit
            .set(g(metrics_connections));
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
        registrar::int_counter(&self.registry, name, help)
    }

    /// Counts a client connection closed at `--max-connections`.
    pub fn connection_refused(&self) {
        self.admission.connections_refused.inc();
    }

    /// Counts a client HTTP/2 connection closed with a GOAWAY whose reason is `reason`, one of
    /// a fixed set of names.
    pub fn http2_closed(&self, reason: &'static str) {
        self.admission
            .http2_closed
            .with_label_values(&[reason])
            .inc();
    }

    /// Counts a metrics-listener connection shed at `--metrics-max-connections`.
    pub fn metrics_connection_shed(&self) {
        self.admission.metrics_connections_shed.inc();
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

    /// A request's `direction` count by `--tokenizer` was checked against the server's usage.
    pub fn tokenizer_check(&self, direction: &str, equal: bool) {
        let result = if equal { "equal" } else { "differs" };
        self.tokens
            .tokenizer_checks
            .with_label_values(&[direction, result])
            .inc();
    }

    /// Requests decoding right now (one atomic read: it is taken on every token-bearing event).
    pub fn decoding(&self) -> i64 {
        self.requests.decoding.get()
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
                .map(|p| {
                    self.requests
                        .in_flight
                        .with_label_values(&[p.as_str()])
                        .get()
                })
                .sum();
            let wire = model.wire_tokens(&report, in_flight as f64);
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
        self.throughput.output_tps.set(tps);
        self.throughput.output_tps_per_gpu.set(if self.gpus > 0.0 {
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
