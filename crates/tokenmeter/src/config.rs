//! The validated configuration of a proxy: each subsystem's own settings type, and the few
//! values the composition root ([`crate::app`]) reads beside them. The command line (flags,
//! environment variables, `--help`) is a crate of its own, `tokenmeter-flags`, which validates
//! what it parses into a [`Config`]; tests and the tools build one directly
//! ([`Config::for_upstream`]).
//!
//! Each value is held once and mapped onto its subsystem's settings type: `server::Settings`,
//! `proxy::Settings` (with `proxy::Admission`, both of admission's limits), `meter::Settings`
//! (`--max-line-bytes`, `--api`), `capacity::Settings` (window and stated memory; joined with the
//! classes and the fleet in `Config::capacity_model`), `MetricsConfig` (with `metrics::Buckets`),
//! `TenantConfig`, `TracingConfig`. Each builder lives with the type it builds (`Buckets::preset`,
//! `capacity::ClassTargets::of`, `slo::spec`, `tenant::Flags::build`, `TracingConfig::from_flags`
//! with the `OTEL_*` rules in `otlp/settings.rs`). Every default is written once, as a `DEFAULT_*`
//! constant beside the settings it belongs to (durations as a `units::HumanDuration`, which shows
//! in `--help` as written, `300s`, `15m`); the settings' `Default` and clap's `default_value` both
//! read it, so `Config::for_upstream` is the flags' defaults by construction (the flags crate's
//! `for_upstream_is_what_the_flags_default_to` still checks the mapping). Tests build settings
//! directly unless they test a flag; the demo sets its upstream, listeners and GPUs as fields,
//! never by writing arguments.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::capacity::{self, Inputs};
use crate::gpus::Note;
use crate::meter;
use crate::metrics::MetricsConfig;
use crate::otlp::TracingConfig;
use crate::proxy::{self, Target};
use crate::server::settings as server;
use crate::slo::Classes;
use crate::tenant::TenantConfig;
use crate::tls::client::UpstreamTls;
use crate::workload::WorkloadConfig;
use crate::{engine, replicas, ui};

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
    /// How the meter reads responses: `--max-line-bytes`, `--api`.
    pub meter: meter::Settings,
    /// The live capacity model's own settings: its window and the engine's memory as the flags
    /// state it (the rest of what it needs, the SLO classes and the fleet, is held once
    /// elsewhere in this struct: [`Config::capacity_model`]).
    pub capacity: capacity::Settings,
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
    pub replicas: replicas::Setting,
    /// `--engine-metrics` and `--engine-metrics-interval`.
    pub engine_metrics: engine::Setting,
    pub engine_metrics_interval: Duration,
    /// The `tenant` label's settings; `None`: the label does not exist.
    pub tenants: Option<TenantConfig>,
    /// `--request-log`: a file, or `-` for standard output.
    pub request_log: Option<PathBuf>,
    /// `--workload-log` and its block size and conversation header; `None`: no trace.
    pub workload: Option<WorkloadConfig>,
    /// `--tokenizer`, each `PATH` or `MODEL=PATH`, loaded at start (`crate::tokenize`).
    pub tokenizers: Vec<String>,
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
            meter: meter::Settings::default(),
            capacity: capacity::Settings::default(),
            upstream_tls: UpstreamTls::default(),
            gpu_notes: Vec::new(),
            slo: Arc::new(Classes::default()),
            ui: Some(ui::DEFAULT_SAMPLE_PERIOD.get()),
            replicas: replicas::Setting::default(),
            engine_metrics: engine::Setting::default(),
            engine_metrics_interval: engine::DEFAULT_INTERVAL.get(),
            tenants: None,
            request_log: None,
            workload: None,
            tokenizers: Vec::new(),
            tracing: None,
        }
    }

    /// All the live capacity model needs: its own settings, each SLO class's targets and the
    /// fleet, taken from where this struct holds them once (the classes, `--replicas`, and the
    /// GPU count and cost of the metrics' settings).
    pub fn capacity_model(&self) -> Inputs {
        Inputs {
            window: self.capacity.window,
            classes: capacity::ClassTargets::of(&self.slo),
            fleet: capacity::Fleet {
                replicas: self.replicas.initial(),
                gpus: self.metrics.gpus,
                gpu_hour_cost: self.metrics.gpu_hour_cost,
            },
            memory: self.capacity.memory,
        }
    }
}
