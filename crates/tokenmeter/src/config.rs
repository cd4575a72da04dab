//! The validated configuration of a proxy: each subsystem's own settings type, and the few
//! values the composition root ([`crate::app`]) reads beside them. The command line (flags,
//! environment variables, `--help`) is a crate of its own, `tokenmeter-flags`, which validates
//! what it parses into a [`Config`]; tests and the tools build one directly
//! ([`Config::for_upstream`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::capacity::{self, CapacityConfig};
use crate::gpus::Note;
use crate::metrics::MetricsConfig;
use crate::otlp::TracingConfig;
use crate::protocol::Api;
use crate::proxy::{self, Target};
use crate::server::settings as server;
use crate::slo::Classes;
use crate::tenant::TenantConfig;
use crate::tls::client::UpstreamTls;

/// `--ui-sample-period`'s default.
pub const DEFAULT_UI_SAMPLE_PERIOD: Duration = Duration::from_secs(5);

/// The validated configuration of a proxy.
#[derive(Debug, Clone)]
pub struct Config {
    /// The request path's settings: the upstream and each layer's limits.
    pub proxy: proxy::Settings,
    /// Both listeners and how their connections are held.
    pub server: server::Settings,
    /// The metrics' settings; they hold the GPU count, its source and `--gpu-hour-cost`,
    /// which the capacity model reads from here ([`Config::capacity`]).
    pub metrics: MetricsConfig,
    /// `--capacity-window`: the live capacity model's own setting (the rest of its settings
    /// are the SLO classes and the fleet, held once elsewhere in this struct).
    pub capacity_window: Duration,
    pub max_line_bytes: usize,
    /// `--api`: `None` detects the format per response.
    pub api: Option<Api>,
    // --- TLS ---
    /// How an https upstream is trusted, and the client certificate.
    pub upstream_tls: UpstreamTls,
    /// What `--gpus` looked at to find the count, for the log (the count itself and its
    /// source are in [`MetricsConfig`]).
    pub gpu_notes: Vec<Note>,
    /// The SLO class table (`--slo`, `--slo-file`, `--slo-class-header`, `--slo-default-class`).
    pub slo: Arc<Classes>,
    /// The page's sample period; `None` with `--no-ui`.
    pub ui: Option<Duration>,
    /// `--replicas`: a number, or `auto` (the server watches the upstream's DNS records).
    pub replicas: crate::replicas::Setting,
    /// `--kv-cache-tokens`, `--block-size`, `--max-num-seqs`: the engine's memory as the flags
    /// state it (each `None` when not given).
    pub memory: capacity::memory::Stated,
    /// `--engine-metrics` and `--engine-metrics-interval`.
    pub engine_metrics: crate::engine::Setting,
    pub engine_metrics_interval: Duration,
    /// The `tenant` label's settings; `None`: the label does not exist.
    pub tenants: Option<TenantConfig>,
    /// `--request-log`: a file, or `-` for standard output.
    pub request_log: Option<PathBuf>,
    /// Span export (`--otlp-endpoint` or the `OTEL_*` variables); `None`: no spans.
    pub tracing: Option<TracingConfig>,
}

impl Config {
    /// What the flags give when only `--upstream` is set (and `--gpus auto` finds nothing):
    /// every subsystem's defaults. Tests and the demo build their configuration from it,
    /// `Config { server, ..Config::for_upstream(target) }`, instead of parsing made-up flags.
    pub fn for_upstream(upstream: Target) -> Self {
        Config {
            proxy: proxy::Settings::new(upstream),
            server: server::Settings::default(),
            metrics: MetricsConfig::default(),
            capacity_window: capacity::DEFAULT_WINDOW,
            max_line_bytes: 1 << 20,
            api: None,
            upstream_tls: UpstreamTls::default(),
            gpu_notes: Vec::new(),
            slo: Arc::new(Classes::default()),
            ui: Some(DEFAULT_UI_SAMPLE_PERIOD),
            replicas: crate::replicas::Setting::Fixed(1),
            memory: capacity::memory::Stated::default(),
            engine_metrics: crate::engine::Setting::Auto,
            engine_metrics_interval: crate::engine::reader::INTERVAL,
            tenants: None,
            request_log: None,
            tracing: None,
        }
    }

    /// The live capacity model's settings: its window, each SLO class's targets and the fleet,
    /// taken from where this struct holds them once (the classes, `--replicas`, and the GPU
    /// count and cost of the metrics' settings).
    pub fn capacity(&self) -> CapacityConfig {
        CapacityConfig {
            window: self.capacity_window,
            classes: capacity::ClassTargets::of(&self.slo),
            fleet: capacity::Fleet {
                replicas: self.replicas.initial(),
                gpus: self.metrics.gpus,
                gpu_hour_cost: self.metrics.gpu_hour_cost,
            },
            memory: self.memory,
        }
    }
}
