//! The composition root: builds every part of the process from its settings, in one place, and
//! hands them to the server, which only accepts, serves and drains ([`crate::server`]).
//!
//! The order is the order of dependence: the TLS files first (a missing certificate is
//! reported before a port is taken), then the metrics, the capacity model they export, the
//! sinks of finished requests, the meter that feeds all three, the engine's reader, the
//! admission limiter, the stack of layers ([`crate::proxy::stack`]), the page, and the tasks
//! that live beside the listeners. Nothing here runs per request.

use std::sync::Arc;
use std::time::Instant;

use crate::admin::Readiness;
use crate::capacity::Capacity;
use crate::config::Config;
use crate::context::Identify;
use crate::drain::Connections;
use crate::engine;
use crate::inject;
use crate::meter::Recorder;
use crate::metrics::Metrics;
use crate::otlp::Exporter;
use crate::overload::Limiter;
use crate::proxy;
use crate::record::Sink;
use crate::replicas;
use crate::reqlog::{self, RequestLog};
use crate::server::{Background, BindError, Parts, Server};
use crate::tenant::Tenants;
use crate::tls::listener::ServerTls;
use crate::tls::TlsError;
use crate::tokenize::{self, Tokenizers};
use crate::ui::Ui;
use crate::workload::WorkloadLog;

/// Why the process could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Bind(#[from] BindError),
    #[error("invalid metric configuration: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("--request-log {path}: cannot open it: {source}")]
    RequestLog {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Tokenizer(#[from] tokenize::LoadError),
    #[error("--workload-log {path}: cannot open it: {source}")]
    WorkloadLog {
        path: String,
        source: std::io::Error,
    },
}

impl StartError {
    /// A configuration the user must fix (exit 64), not a failure of the machine.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            StartError::Tls(_)
                | StartError::RequestLog { .. }
                | StartError::WorkloadLog { .. }
                | StartError::Tokenizer(_)
        )
    }
}

/// The process, built and bound: the server, and handles on what its callers read.
pub struct App {
    pub server: Server,
    /// The metrics every part records into.
    pub metrics: Arc<Metrics>,
    /// The live capacity model the meter feeds.
    pub capacity: Arc<Capacity>,
}

/// The sinks of finished records, in the order they are called.
type Sinks = Vec<Arc<dyn Sink>>;

/// What runs once the drain is over ([`Parts::on_exit`]).
type OnExit = Vec<Box<dyn FnOnce() + Send>>;

/// How long the workload trace may take to write what it holds once the drain is over.
const WORKLOAD_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// What takes each finished request besides the metrics (the request log, the spans, the
/// workload trace), the reader of request heads they need, and what must run at exit; none of
/// it exists, and no request pays for it, when it is off.
fn sinks(cfg: &Config, metrics: &Metrics) -> Result<(Option<Identify>, Sinks, OnExit), StartError> {
    let mut sinks: Sinks = Vec::new();
    let mut on_exit: OnExit = Vec::new();
    // The request log and the spans read each request's head; the trace only for a conversation.
    let mut identified = cfg.request_log.is_some();
    if let Some(path) = &cfg.request_log {
        let log = RequestLog::open(
            &reqlog::Destination::of(path),
            metrics.request_log_dropped()?,
        )
        .map_err(|source| StartError::RequestLog {
            path: path.display().to_string(),
            source,
        })?;
        sinks.push(Arc::new(log));
    }
    let sampler = match &cfg.tracing {
        Some(t) => {
            identified = true;
            sinks.push(Arc::new(Exporter::start(t, metrics.trace_spans_dropped()?)));
            Some(t.sampler)
        }
        None => None,
    };
    if let Some(w) = &cfg.workload {
        let log = WorkloadLog::open(w, metrics.workload_log_counters()?).map_err(|source| {
            StartError::WorkloadLog {
                path: match &w.destination {
                    reqlog::Destination::File(p) => p.display().to_string(),
                    reqlog::Destination::Stdout => "-".into(),
                },
                source,
            }
        })?;
        let log = Arc::new(log);
        sinks.push(Arc::clone(&log) as Arc<dyn Sink>);
        on_exit.push(Box::new(move || log.close(WORKLOAD_CLOSE)));
    }
    let conversation = cfg
        .workload
        .as_ref()
        .and_then(|w| w.conversation_header.clone());
    identified |= conversation.is_some();
    let identify = identified.then(|| Identify::new(sampler).with_conversation(conversation));
    Ok((identify, sinks, on_exit))
}

/// The engine's reader, unless `--engine-metrics off`: off the request path, one bounded read
/// of the engine's page at a time.
fn engine_reader(
    cfg: &Config,
    client_tls: &crate::tls::client::ClientTls,
    metrics: &Metrics,
    capacity: &Arc<Capacity>,
    inject: &Arc<inject::Policy>,
) -> Result<Option<Background>, StartError> {
    let Some(url) = cfg.engine_metrics.url(&cfg.proxy.upstream.origin) else {
        return Ok(None);
    };
    let observed = Arc::new(engine::observed::Observed::default());
    metrics.export_engine_view(Arc::clone(&observed))?;
    let reader = engine::reader::EngineReader::new(
        url,
        cfg.engine_metrics == engine::Setting::Auto,
        client_tls,
        observed,
        Arc::clone(capacity),
        cfg.engine_metrics_interval,
    );
    let inject = Arc::clone(inject);
    let reader = reader.on_recognised(move |d| inject.engine_recognised(d.as_str()));
    Ok(Some(Box::pin(reader.run())))
}

/// `--tokenizer`'s files, read and checked now: a bad one fails the start, naming its path.
fn tokenizers(cfg: &Config) -> Result<Option<Arc<Tokenizers>>, StartError> {
    if cfg.tokenizers.is_empty() {
        return Ok(None);
    }
    let blocks = cfg.workload.as_ref().map(|w| w.block_tokens);
    let loaded = Tokenizers::load(&cfg.tokenizers)?.with_blocks(blocks);
    tracing::info!(
        tokenizers = cfg.tokenizers.len(),
        "counting prompts and answers with the model's tokenizer (--tokenizer)"
    );
    Ok(Some(Arc::new(loaded)))
}

/// With `--replicas auto`: the upstream's addresses, counted for the capacity model.
fn replica_watch(cfg: &Config, capacity: &Arc<Capacity>) -> Option<Background> {
    if cfg.replicas != replicas::Setting::Auto {
        return None;
    }
    let (host, port) = cfg.proxy.upstream.host_and_port();
    let capacity = Arc::clone(capacity);
    Some(Box::pin(replicas::watch(
        Arc::new(replicas::System),
        host,
        port,
        replicas::REFRESH,
        move |n| capacity.set_replicas(n),
    )))
}

/// Builds the process from `cfg` and binds its listeners.
pub async fn build(cfg: &Config) -> Result<App, StartError> {
    let tls = cfg.server.tls.clone().map(ServerTls::load).transpose()?;
    let metrics_tls = cfg
        .server
        .metrics_tls
        .clone()
        .map(ServerTls::load)
        .transpose()?;
    let client_tls = cfg.upstream_tls.load(cfg.proxy.upstream.is_https())?;
    let metrics = Arc::new(Metrics::new(&cfg.metrics)?);
    let capacity = Arc::new(Capacity::new(cfg.capacity_model(), Instant::now()));
    metrics.export_capacity(Arc::clone(&capacity))?;
    let (identify, sinks, on_exit) = sinks(cfg, &metrics)?;
    let recorder = Arc::new(
        Recorder::new(Arc::clone(&metrics), cfg.meter)
            .with_capacity(Arc::clone(&capacity))
            .with_classes(Arc::clone(&cfg.slo))
            .with_tenants(cfg.tenants.as_ref().map(|t| Arc::new(Tenants::new(t))))
            .with_sinks(identify, sinks),
    );
    let limiter = Arc::new(Limiter::new(cfg.proxy.admission.max_in_flight));
    let inject = Arc::new(inject::Policy::new(cfg.proxy.inject_usage));
    let tokenizers = tokenizers(cfg)?;
    let conns = Arc::new(Connections::with_cap(cfg.server.max_connections));
    metrics.set_limits(
        cfg.proxy.admission.max_in_flight,
        cfg.server.max_connections,
        cfg.server.metrics_max_connections,
    );
    let ui = cfg.ui.map(|period| {
        Arc::new(Ui::new(
            Arc::clone(&metrics),
            period,
            cfg.metrics.rate_window,
        ))
    });
    let background: Vec<Background> = [
        ui.as_ref().map(|ui| Box::pin(ui.sampler()) as Background),
        engine_reader(cfg, &client_tls, &metrics, &capacity, &inject)?,
        replica_watch(cfg, &capacity),
        Some(Box::pin(crate::capacity::refits::run(Arc::clone(&capacity))) as Background),
        // SIGHUP reopens the log files; without one it keeps its default action.
        (cfg.request_log.is_some() || cfg.workload.is_some())
            .then(|| Box::pin(crate::logfile::hangups()) as Background),
    ]
    .into_iter()
    .flatten()
    .collect();
    let parts = Parts {
        proxy: proxy::stack(
            &cfg.proxy,
            recorder,
            &client_tls,
            Arc::clone(&limiter),
            inject,
            tokenizers,
        ),
        tls,
        metrics_tls,
        metrics: Arc::clone(&metrics),
        ready: Arc::new(Readiness::with_limiter(limiter).with_connections(Arc::clone(&conns))),
        conns,
        ui,
        background,
        on_exit,
    };
    Ok(App {
        server: Server::bind(&cfg.server, parts)?,
        metrics,
        capacity,
    })
}
