//! tokenmeter's command line: flags and environment variables, in two layers (as ripgrep does):
//! the raw [`ProxyArgs`] clap parses, validated into the product's [`Config`], each value mapped
//! onto the settings type of the subsystem it belongs to. Validation never binds a socket and
//! never reads the process environment itself, so it is testable with plain values.
//!
//! A crate of its own: the product library (`tokenmeter`) knows no clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use http::Uri;

use tokenmeter::config::Config;
use tokenmeter::gpus::GpuError;
use tokenmeter::host::{Host, System};
use tokenmeter::inject;
use tokenmeter::logfile::Destination;
use tokenmeter::metrics::buckets::{Overrides, UnknownPreset};
use tokenmeter::metrics::{self, Buckets, Compat, MetricsConfig};
use tokenmeter::otlp::{self, TracingConfig};
use tokenmeter::protocol::Api;
use tokenmeter::proxy::{self, Target};
use tokenmeter::server::settings as server;
use tokenmeter::slo::{self, Classes, SloError};
use tokenmeter::tenant::{self, TenantError};
use tokenmeter::tls::client::UpstreamTls;
use tokenmeter::tls::KeyPair;
use tokenmeter::units::parse_duration;
use tokenmeter::workload::WorkloadConfig;
use tokenmeter::{capacity, engine, meter, replicas, ui};

pub mod suggest;

/// Where the proxy and its metrics listen: flags `tokenmeter demo` shares with the proxy (it
/// changes their defaults and help to loopback addresses, `DemoArgs`).
#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// Where clients connect.
    #[arg(long, env = "TOKENMETER_LISTEN", default_value = server::DEFAULT_LISTEN.to_string())]
    pub listen: String,

    /// Where /metrics, /healthz and /readyz are served (never on the proxy listener).
    #[arg(
        long,
        env = "TOKENMETER_METRICS_LISTEN",
        default_value = server::DEFAULT_METRICS_LISTEN.to_string()
    )]
    pub metrics_listen: String,
}

/// Whether the page is served on the metrics listener: a flag `tokenmeter demo` shares with
/// the proxy.
#[derive(Debug, Clone, Args)]
pub struct PageArgs {
    /// Do not serve the page (/ and /api/summary) on the metrics listener, and take no readings
    /// for it: only /metrics, /healthz and /readyz.
    #[arg(long, env = "TOKENMETER_NO_UI")]
    pub no_ui: bool,
}

/// The proxy's flags. Every one also reads a `TOKENMETER_*` environment variable.
#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    /// The inference server to forward to, e.g. http://127.0.0.1:8000 (http:// or https://; a
    /// path prefix is kept).
    #[arg(long, env = "TOKENMETER_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,

    #[command(flatten)]
    pub listeners: ListenArgs,

    /// GPUs behind the upstream, for tokens/s per GPU and cost: a number, or "auto" (the
    /// entries of NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, else --gpus-file, else 1).
    #[arg(
        long,
        env = "TOKENMETER_GPUS",
        default_value = "auto",
        value_name = "N|auto"
    )]
    pub gpus: String,

    /// With --gpus auto and no *_VISIBLE_DEVICES: a file holding the GPU count (e.g. a pod
    /// annotation mounted with the Downward API).
    #[arg(long, env = "TOKENMETER_GPUS_FILE", value_name = "FILE")]
    pub gpus_file: Option<PathBuf>,

    /// What one GPU costs per hour, in USD: exported as tokenmeter_gpu_hour_cost for the cost
    /// per million output (and goodput) tokens.
    #[arg(long, env = "TOKENMETER_GPU_HOUR_COST", value_name = "USD")]
    pub gpu_hour_cost: Option<String>,

    /// An SLO class, NAME:ttft=DUR,tps=RATE,e2e=DUR,objective=RATIO with each target optional
    /// (repeatable; ';'-separated in the variable). Default: interactive:ttft=1s,tps=20 and batch.
    #[arg(
        long,
        env = "TOKENMETER_SLO",
        value_name = "SPEC",
        value_delimiter = ';'
    )]
    pub slo: Vec<String>,

    /// SLO classes and path-prefix / model rules from a YAML or TOML file (added to --slo).
    #[arg(long, env = "TOKENMETER_SLO_FILE", value_name = "FILE")]
    pub slo_file: Option<PathBuf>,

    /// The request header that names a request's SLO class.
    #[arg(long, env = "TOKENMETER_SLO_CLASS_HEADER", default_value = slo::DEFAULT_CLASS_HEADER, value_name = "NAME")]
    pub slo_class_header: String,

    /// The class of requests that name none, or an unknown one (default: interactive when
    /// declared, else the first class).
    #[arg(long, env = "TOKENMETER_SLO_DEFAULT_CLASS", value_name = "NAME")]
    pub slo_default_class: Option<String>,

    /// Distinct model label values kept; further models are counted as "other".
    #[arg(long, env = "TOKENMETER_MAX_MODELS", default_value_t = metrics::DEFAULT_MAX_MODELS)]
    pub max_models: usize,

    /// Window of the aggregate tokens/s gauges (e.g. 10s, 500ms, 1m).
    #[arg(long, env = "TOKENMETER_RATE_WINDOW", default_value = metrics::DEFAULT_RATE_WINDOW.to_string(), value_parser = parse_duration)]
    pub rate_window: Duration,

    /// On SIGTERM, how long open streams may take to finish before the process exits.
    #[arg(long, env = "TOKENMETER_DRAIN_TIMEOUT", default_value = server::DEFAULT_DRAIN_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Longest SSE/NDJSON line (or non-streaming JSON body) parsed; longer ones are forwarded
    /// untouched, not parsed, and counted in tokenmeter_parse_errors_total{reason="line_too_long"}.
    #[arg(long, env = "TOKENMETER_MAX_LINE_BYTES", default_value_t = meter::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,

    /// Request bodies up to this size are read before forwarding (for the model name); larger
    /// ones are streamed through as they come.
    #[arg(long, env = "TOKENMETER_MAX_REQUEST_BODY", default_value_t = proxy::DEFAULT_MAX_REQUEST_BODY)]
    pub max_request_body: usize,

    /// Longest wait for the upstream's response headers (0 = no limit); then 504, outcome "timeout".
    #[arg(long, env = "TOKENMETER_UPSTREAM_TIMEOUT", default_value = proxy::DEFAULT_UPSTREAM_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub upstream_timeout: Duration,

    /// Longest silence between two body frames from the upstream (0 = no limit); then the
    /// stream is ended, outcome "timeout".
    #[arg(long, env = "TOKENMETER_IDLE_TIMEOUT", default_value = proxy::DEFAULT_IDLE_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Requests proxied at once; beyond it a request is answered 503 at once (shed), with
    /// Retry-After, and never sent upstream. The default fits a 512 MiB memory limit (README,
    /// "Overload").
    #[arg(long, env = "TOKENMETER_MAX_IN_FLIGHT", default_value_t = proxy::DEFAULT_MAX_IN_FLIGHT, value_name = "N")]
    pub max_in_flight: usize,

    /// Open client connections; beyond it a new connection is closed as soon as it is accepted.
    #[arg(long, env = "TOKENMETER_MAX_CONNECTIONS", default_value_t = server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,

    /// Connections the kernel completes and queues for each listener before they are accepted
    /// (listen(2)'s backlog; the kernel caps it at net.core.somaxconn). A burst of new
    /// connections past it waits for the client's 1 s SYN retry.
    #[arg(long, env = "TOKENMETER_LISTEN_BACKLOG", default_value_t = server::DEFAULT_LISTEN_BACKLOG, value_name = "N")]
    pub listen_backlog: u32,

    /// Open connections on the metrics listener; past it the connection idle longest is closed
    /// to make room for a new one (a crowd of idle clients cannot lock Prometheus out).
    #[arg(long, env = "TOKENMETER_METRICS_MAX_CONNECTIONS", default_value_t = server::DEFAULT_METRICS_MAX_CONNECTIONS, value_name = "N")]
    pub metrics_max_connections: usize,

    /// The Retry-After header of a shed request's 503, in whole seconds.
    #[arg(
        long,
        env = "TOKENMETER_RETRY_AFTER",
        default_value_t = proxy::DEFAULT_RETRY_AFTER,
        value_name = "SECONDS"
    )]
    pub retry_after: u32,

    /// Longest time a client may take to send its request headers.
    #[arg(long, env = "TOKENMETER_HEADER_READ_TIMEOUT", default_value = server::DEFAULT_HEADER_READ_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Idle pooled upstream connections are closed after this (nginx's upstream keep-alive
    /// default). A server that closes sooner (vLLM: 5 s) costs nothing: a connection it closed
    /// is dropped, and a request its close crossed is sent again on a new one.
    #[arg(long, env = "TOKENMETER_POOL_IDLE_TIMEOUT", default_value = proxy::DEFAULT_POOL_IDLE_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub pool_idle_timeout: Duration,

    /// For streaming OpenAI-compatible requests that did not ask for usage, add
    /// stream_options.include_usage and remove the extra usage chunk from the response: exact
    /// token counts, same bytes for the client. `auto` does so once the upstream is known to be
    /// an engine that adds nothing else (vLLM, SGLang, TGI, llama.cpp, from its metrics), never
    /// for OpenAI's own API; `on` always, `off` never (a bare `--inject-usage` is `on`). Only
    /// bodies up to --max-request-body are rewritten.
    #[arg(
        long,
        env = "TOKENMETER_INJECT_USAGE",
        default_value = inject::Setting::default().to_string(),
        num_args = 0..=1,
        require_equals = false,
        default_missing_value = "on",
        value_name = "auto|on|off",
        value_parser = parse_inject
    )]
    pub inject_usage: inject::Setting,

    /// The model's tokenizer, for what no usage report gives: a tokenizer.json, or the model's
    /// directory holding it with its chat template. Prompts are counted as they are sent (so the
    /// TTFT has its prompt band at once), requests that end without usage (a client that left)
    /// are counted from their text, and the server's usage is checked against it. Repeat as
    /// MODEL=PATH for several models; a bare PATH serves every other model. Read at start: a bad
    /// file fails the start.
    #[arg(
        long,
        env = "TOKENMETER_TOKENIZER",
        value_name = "PATH|MODEL=PATH",
        value_delimiter = ','
    )]
    pub tokenizer: Vec<String>,

    /// The upstream's wire format; "auto" recognises it per response from the first event (the
    /// request path breaks ties). Pin it when auto-detection guesses wrong.
    #[arg(long, env = "TOKENMETER_API", default_value = "auto", value_parser = api_names())]
    pub api: String,

    /// Speak HTTP/2 without TLS (h2c, prior knowledge) to the upstream.
    #[arg(long, env = "TOKENMETER_UPSTREAM_HTTP2")]
    pub upstream_http2: bool,

    /// The boundaries every histogram starts from: `default` (vLLM's where vLLM has the measure)
    /// or `coarse` (a subset of each, about half the series, for fleets: docs/fleet.md). The
    /// --buckets-* flags below replace one measure's either way.
    #[arg(
        long,
        env = "TOKENMETER_BUCKETS",
        default_value = metrics::buckets::DEFAULT_PRESET,
        value_name = "default|coarse"
    )]
    pub buckets: String,

    /// TTFT histogram buckets in seconds, comma-separated (default: vLLM's).
    #[arg(long, env = "TOKENMETER_BUCKETS_TTFT", value_parser = parse_buckets)]
    pub buckets_ttft: Option<BucketList>,

    /// Inter-token latency / time-per-output-token buckets in seconds (default: vLLM's).
    #[arg(long, env = "TOKENMETER_BUCKETS_ITL", value_parser = parse_buckets)]
    pub buckets_itl: Option<BucketList>,

    /// Per-request tokens/s buckets (default: 1 to 10,000).
    #[arg(long, env = "TOKENMETER_BUCKETS_TPS", value_parser = parse_buckets)]
    pub buckets_tps: Option<BucketList>,

    /// Request duration buckets in seconds (default: vLLM's e2e latency).
    #[arg(long, env = "TOKENMETER_BUCKETS_DURATION", value_parser = parse_buckets)]
    pub buckets_duration: Option<BucketList>,

    /// Prompt/output length buckets in tokens (default: 1, 2, 5, 10, ... 1,000,000).
    #[arg(long, env = "TOKENMETER_BUCKETS_TOKENS", value_parser = parse_buckets)]
    pub buckets_tokens: Option<BucketList>,

    // --- the live capacity model ---
    /// Sliding window of the live capacity fit (e.g. 15m, 1h; at least 10s).
    #[arg(long, env = "TOKENMETER_CAPACITY_WINDOW", default_value = capacity::DEFAULT_WINDOW.to_string(), value_parser = parse_duration)]
    pub capacity_window: Duration,

    /// Inference replicas behind this proxy (a gateway in front of N engines): the decoding
    /// concurrency it sees is divided by N, since the capacity model is per engine. `auto`
    /// counts the addresses the upstream's host resolves to (a Kubernetes headless Service has
    /// one per pod), again every 30 s, at least 1.
    #[arg(
        long,
        env = "TOKENMETER_REPLICAS",
        default_value = replicas::Setting::default().to_string(),
        value_name = "N|auto"
    )]
    pub replicas: String,

    /// The engine's KV cache in tokens (vLLM: `kv_cache_size_tokens` on `cache_config_info`,
    /// or num_gpu_blocks x block_size). With it the capacity model bounds every class by memory
    /// (`bound="kv_cache"`). Wins over what the engine's metrics say.
    #[arg(long, env = "TOKENMETER_KV_CACHE_TOKENS", value_name = "N")]
    pub kv_cache_tokens: Option<u64>,

    /// Tokens per KV-cache block (vLLM's --block-size; default 16, or what the engine's
    /// metrics say).
    #[arg(long, env = "TOKENMETER_BLOCK_SIZE", value_name = "N")]
    pub block_size: Option<u32>,

    /// The engine's cap on running sequences (vLLM's --max-num-seqs): a bound of its own on
    /// every class (`bound="max_num_seqs"`). Wins over what the engine's metrics say.
    #[arg(long, env = "TOKENMETER_MAX_NUM_SEQS", value_name = "N")]
    pub max_num_seqs: Option<u32>,

    /// Where to read the engine's own metrics (its KV cache, queue and preemptions): `auto`
    /// reads the upstream's `/metrics` where it answers in a dialect tokenmeter knows (vLLM,
    /// SGLang, TGI with its `/info`, llama.cpp with its `/props`), a URL reads that page, `off`
    /// reads nothing.
    #[arg(
        long,
        env = "TOKENMETER_ENGINE_METRICS",
        default_value = engine::Setting::default().to_string(),
        value_name = "URL|auto|off"
    )]
    pub engine_metrics: String,

    /// How often the engine's metrics are read (`--engine-metrics`).
    #[arg(long, env = "TOKENMETER_ENGINE_METRICS_INTERVAL", default_value = engine::DEFAULT_INTERVAL.to_string(), value_parser = parse_duration)]
    pub engine_metrics_interval: Duration,
    // --- TLS ---
    /// Longest wait for a connection to the upstream, TCP and TLS handshake included (0 = no
    /// limit); then 502, outcome "upstream_error".
    #[arg(long, env = "TOKENMETER_CONNECT_TIMEOUT", default_value = proxy::DEFAULT_CONNECT_TIMEOUT.to_string(), value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// PEM file of the CAs that sign an https upstream's certificate, instead of the system's
    /// CA bundle.
    #[arg(long, env = "TOKENMETER_UPSTREAM_CA", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,

    /// PEM certificate (chain) presented to an https upstream that asks for one (mutual TLS).
    #[arg(long, env = "TOKENMETER_UPSTREAM_CLIENT_CERT", value_name = "FILE")]
    pub upstream_client_cert: Option<PathBuf>,

    /// PEM private key of --upstream-client-cert.
    #[arg(long, env = "TOKENMETER_UPSTREAM_CLIENT_KEY", value_name = "FILE")]
    pub upstream_client_key: Option<PathBuf>,

    /// Serve TLS on the proxy listener with this PEM certificate (chain); HTTP/2 and HTTP/1.1
    /// by ALPN. Reloaded when the file changes.
    #[arg(long, env = "TOKENMETER_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "TOKENMETER_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Serve TLS on the metrics listener with this PEM certificate (chain).
    #[arg(long, env = "TOKENMETER_METRICS_TLS_CERT", value_name = "FILE")]
    pub metrics_tls_cert: Option<PathBuf>,

    /// PEM private key of --metrics-tls-cert.
    #[arg(long, env = "TOKENMETER_METRICS_TLS_KEY", value_name = "FILE")]
    pub metrics_tls_key: Option<PathBuf>,

    // --- the page on the metrics listener (src/ui/) ---
    #[command(flatten)]
    pub page: PageArgs,

    /// How often the page's sampler reads the registry for its time series (1s to 60s).
    #[arg(long, env = "TOKENMETER_UI_SAMPLE_PERIOD", default_value = ui::DEFAULT_SAMPLE_PERIOD.to_string(), value_parser = parse_duration)]
    pub ui_sample_period: Duration,

    // --- other naming schemes ---
    /// Also export the series under another naming scheme: "vllm" (vLLM's vllm:* names,
    /// label model_name), "otel" (OpenTelemetry's GenAI names, gen_ai_*). Repeatable or
    /// comma-separated.
    #[arg(
        long,
        env = "TOKENMETER_COMPAT",
        value_name = "SCHEME",
        value_delimiter = ','
    )]
    pub compat: Vec<String>,

    // --- tenants: who is using the GPUs ---
    /// Label requests by tenant: the value of this request header (e.g. x-tenant, set by the
    /// gateway from the API key or JWT). 1-64 of A-Z a-z 0-9 . _ -, else "invalid"; requests
    /// without it are "none" (or their key's id with --tenant-from-key). Never logged.
    #[arg(long, env = "TOKENMETER_TENANT_HEADER", value_name = "NAME")]
    pub tenant_header: Option<String>,

    /// Label requests by a hash of their API key (Authorization: Bearer, or x-api-key) when
    /// --tenant-header is absent from the request: "key-" and 12 hex digits of its SHA-256,
    /// never the key itself.
    #[arg(long, env = "TOKENMETER_TENANT_FROM_KEY")]
    pub tenant_from_key: bool,

    /// Distinct tenant label values kept (default 32); further tenants are counted as
    /// "other". Needs --tenant-header or --tenant-from-key.
    #[arg(long, env = "TOKENMETER_MAX_TENANTS", value_name = "N")]
    pub max_tenants: Option<usize>,

    /// A file of tenant names (one a line, # comments) that always get their own series, on
    /// top of --max-tenants.
    #[arg(long, env = "TOKENMETER_TENANT_ALLOW_FILE", value_name = "FILE")]
    pub tenant_allow_file: Option<PathBuf>,

    // --- following one request ---
    /// Write one JSON line per finished request to FILE (appended), or to standard output with
    /// "-": trace and request ids, model, tenant, tokens, TTFT, speed, outcome (README,
    /// "Request log"). Never a prompt, a completion or a credential.
    #[arg(long, env = "TOKENMETER_REQUEST_LOG", value_name = "FILE|-")]
    pub request_log: Option<PathBuf>,

    // --- recording the workload ---
    /// Write one line per request for generation to FILE (appended), or standard output with
    /// "-", in the Mooncake trace format replay tools read (vLLM's bench timed_trace,
    /// GuideLLM's mooncake, tokenmeter bench --trace): arrival in ms, prompt and output tokens,
    /// the prompt's blocks by shared prefix (with --tokenizer), duration, model, class, outcome.
    /// No prompt text, no header value (README, "Record and replay the workload").
    #[arg(long, env = "TOKENMETER_WORKLOAD_LOG", value_name = "FILE|-")]
    pub workload_log: Option<PathBuf>,

    /// Tokens a `hash_ids` entry of --workload-log stands for (the replay tools' block size).
    #[arg(
        long,
        env = "TOKENMETER_WORKLOAD_BLOCK_TOKENS",
        value_name = "N",
        default_value_t = 512
    )]
    pub workload_block_tokens: usize,

    /// A request header naming the conversation a request belongs to (e.g. x-session-id):
    /// --workload-log numbers its values in order of first sight as `conversation_id`; the
    /// value itself is never written.
    #[arg(
        long,
        env = "TOKENMETER_WORKLOAD_CONVERSATION_HEADER",
        value_name = "NAME"
    )]
    pub workload_conversation_header: Option<String>,

    /// Export one span per proxied request to this OpenTelemetry collector, OTLP over HTTP with
    /// protobuf (POSTed to URL/v1/traces; http:// only). Else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    /// (as is) or OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces); none: no spans.
    #[arg(long, env = "TOKENMETER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// The share of requests without a sampled traceparent that start a trace (0 to 1; default
    /// 0, or what OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG say). A caller's sampled
    /// traceparent is always followed (parent-based).
    #[arg(long, env = "TOKENMETER_TRACE_SAMPLE", value_name = "RATIO")]
    pub trace_sample: Option<String>,
}

/// Why a configuration was refused: each names the flag.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("--upstream is required (or TOKENMETER_UPSTREAM)")]
    MissingUpstream,
    #[error("--upstream {0:?} is not a valid http:// or https:// URL: {1}")]
    BadUpstream(String, String),
    #[error("--{0} {1:?} is not a valid address (expected HOST:PORT, e.g. 0.0.0.0:8080)")]
    BadAddress(&'static str, String),
    #[error(transparent)]
    Gpus(#[from] GpuError),
    #[error("--gpu-hour-cost must be a number of USD (0 or more), got {0:?}")]
    BadCost(String),
    #[error(transparent)]
    Slo(#[from] SloError),
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    #[error("--capacity-window must be at least 10s, got {0:?}")]
    ShortCapacityWindow(Duration),
    #[error("--{0} needs --{1} as well")]
    Unpaired(&'static str, &'static str),
    #[error("--{0} applies to an https:// upstream only")]
    NotHttps(&'static str),
    #[error("--ui-sample-period must be between 1s and 60s, got {0:?}")]
    BadUiSamplePeriod(Duration),
    #[error("--buckets {0}")]
    BadBuckets(#[from] UnknownPreset),
    #[error("--compat {0:?} is not a naming scheme (expected vllm or otel)")]
    BadCompat(String),
    #[error(transparent)]
    Replicas(#[from] replicas::BadReplicas),
    #[error(transparent)]
    EngineMetrics(#[from] tokenmeter::engine::BadSetting),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error(transparent)]
    Tracing(#[from] otlp::settings::BadSetting),
    #[error("--workload-conversation-header {0:?} is not a valid header name")]
    BadConversationHeader(String),
    #[error("--{0} needs --workload-log")]
    NeedsWorkloadLog(&'static str),
}

/// `--compat`'s values into the set of schemes.
fn parse_compat(values: &[String]) -> Result<Compat, ConfigError> {
    let mut c = Compat::default();
    for v in values {
        match v.trim() {
            "vllm" => c.vllm = true,
            "otel" => c.otel = true,
            "" => {}
            other => return Err(ConfigError::BadCompat(other.to_string())),
        }
    }
    Ok(c)
}

/// `--inject-usage`'s value, as clap wants a parser.
fn parse_inject(s: &str) -> Result<inject::Setting, String> {
    s.parse()
        .map_err(|e: inject::policy::BadSetting| e.to_string())
}

/// The values `--api` accepts: `auto` and every format's label value.
fn api_names() -> clap::builder::PossibleValuesParser {
    let names = std::iter::once("auto").chain(Api::KNOWN.iter().map(|a| a.as_str()));
    clap::builder::PossibleValuesParser::new(names)
}

/// Histogram boundaries from one flag (a newtype, so clap sees one value, not many).
#[derive(Debug, Clone, PartialEq)]
pub struct BucketList(pub Vec<f64>);

/// Parses a comma-separated list of increasing, finite bucket boundaries.
pub fn parse_buckets(s: &str) -> Result<BucketList, String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .map_err(|_| format!("{x:?} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) || v.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "{s:?}: buckets must be finite and strictly increasing"
        ));
    }
    Ok(BucketList(v))
}

/// An `--upstream` URL: `http://` or `https://`, a host, an optional path prefix, no query.
pub fn parse_upstream(s: &str) -> Result<Target, ConfigError> {
    let bad = |why: &str| ConfigError::BadUpstream(s.to_string(), why.to_string());
    let uri: Uri = s
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        _ => return Err(bad("it needs the http:// or https:// scheme")),
    };
    let Some(authority) = uri.authority() else {
        return Err(bad("it has no host"));
    };
    if uri.query().is_some() {
        return Err(bad("it may not have a query"));
    }
    let origin = Uri::builder()
        .scheme(scheme)
        .authority(authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| bad(&e.to_string()))?;
    Ok(Target {
        origin,
        base_path: uri.path().trim_end_matches('/').to_string(),
    })
}

fn parse_addr(flag: &'static str, s: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ConfigError::BadAddress(flag, s.to_string()))
}

/// Two flags that only make sense together.
fn pair(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    (cert_flag, key_flag): (&'static str, &'static str),
) -> Result<Option<KeyPair>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConfigError::Unpaired(cert_flag, key_flag)),
        (None, Some(_)) => Err(ConfigError::Unpaired(key_flag, cert_flag)),
        (Some(c), Some(k)) => Ok(Some(KeyPair {
            cert: c.clone(),
            key: k.clone(),
            cert_flag,
            key_flag,
        })),
    }
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl ProxyArgs {
    /// Validates the flags, reading what `--gpus auto` and `--slo-file` need from this process's
    /// environment and filesystem.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        self.validate_on(&System)
    }

    /// Validates the flags, reading the environment and files only through `host`.
    pub fn validate_on(&self, host: &dyn Host) -> Result<Config, ConfigError> {
        let upstream = parse_upstream(
            self.upstream
                .as_deref()
                .ok_or(ConfigError::MissingUpstream)?,
        )?;
        let gpus = tokenmeter::gpus::detect(&self.gpus, self.gpus_file.as_deref(), host)?;
        let gpu_hour_cost = match &self.gpu_hour_cost {
            None => None,
            Some(s) => Some(
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|c| c.is_finite() && *c >= 0.0)
                    .ok_or_else(|| ConfigError::BadCost(s.clone()))?,
            ),
        };
        let slo = self.slo_classes(host)?;
        if self.max_models == 0 {
            return Err(ConfigError::Zero("max-models"));
        }
        if self.max_line_bytes == 0 {
            return Err(ConfigError::Zero("max-line-bytes"));
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::Zero("max-in-flight"));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::Zero("max-connections"));
        }
        if self.retry_after == 0 {
            return Err(ConfigError::Zero("retry-after"));
        }
        if self.listen_backlog == 0 {
            return Err(ConfigError::Zero("listen-backlog"));
        }
        if self.metrics_max_connections == 0 {
            return Err(ConfigError::Zero("metrics-max-connections"));
        }
        if self.capacity_window < capacity::steps::MIN_WINDOW {
            return Err(ConfigError::ShortCapacityWindow(self.capacity_window));
        }
        let replicas = replicas::parse(&self.replicas)?;
        let upstream_tls = UpstreamTls {
            ca: self.upstream_ca.clone(),
            client: pair(
                &self.upstream_client_cert,
                &self.upstream_client_key,
                ("upstream-client-cert", "upstream-client-key"),
            )?,
        };
        if !upstream.is_https() {
            if upstream_tls.ca.is_some() {
                return Err(ConfigError::NotHttps("upstream-ca"));
            }
            if upstream_tls.client.is_some() {
                return Err(ConfigError::NotHttps("upstream-client-cert"));
            }
        }
        let tls = pair(&self.tls_cert, &self.tls_key, ("tls-cert", "tls-key"))?;
        let metrics_tls = pair(
            &self.metrics_tls_cert,
            &self.metrics_tls_key,
            ("metrics-tls-cert", "metrics-tls-key"),
        )?;
        let ui_period = Duration::from_secs(1)..=Duration::from_secs(60);
        if !ui_period.contains(&self.ui_sample_period) {
            return Err(ConfigError::BadUiSamplePeriod(self.ui_sample_period));
        }
        let tenants = tenant::Flags {
            header: self.tenant_header.as_deref(),
            from_key: self.tenant_from_key,
            max: self.max_tenants,
            allow_file: self.tenant_allow_file.as_deref(),
        }
        .build(host)?;
        let buckets = Buckets::preset(
            &self.buckets,
            Overrides {
                ttft: self.buckets_ttft.clone().map(|b| b.0),
                itl: self.buckets_itl.clone().map(|b| b.0),
                tps: self.buckets_tps.clone().map(|b| b.0),
                duration: self.buckets_duration.clone().map(|b| b.0),
                tokens: self.buckets_tokens.clone().map(|b| b.0),
            },
        )?;
        Ok(Config {
            proxy: proxy::Settings {
                admission: proxy::Admission {
                    max_in_flight: self.max_in_flight,
                    retry_after: self.retry_after,
                },
                max_request_body: self.max_request_body,
                inject_usage: self.inject_usage,
                idle_timeout: nonzero(self.idle_timeout),
                upstream_timeout: nonzero(self.upstream_timeout),
                upstream,
                upstream_http2: self.upstream_http2,
                pool_idle_timeout: self.pool_idle_timeout,
                connect_timeout: nonzero(self.connect_timeout),
            },
            server: server::Settings {
                listen: parse_addr("listen", &self.listeners.listen)?,
                metrics_listen: parse_addr("metrics-listen", &self.listeners.metrics_listen)?,
                listen_backlog: self.listen_backlog,
                drain_timeout: self.drain_timeout,
                header_read_timeout: self.header_read_timeout,
                max_connections: self.max_connections,
                metrics_max_connections: self.metrics_max_connections,
                tls,
                metrics_tls,
            },
            capacity: capacity::Settings {
                window: self.capacity_window,
                memory: capacity::memory::Stated {
                    kv_cache_tokens: self.kv_cache_tokens,
                    block_size: self.block_size,
                    max_num_seqs: self.max_num_seqs,
                },
            },
            metrics: MetricsConfig {
                buckets,
                max_models: self.max_models,
                rate_window: self.rate_window,
                gpus: gpus.count,
                compat: parse_compat(&self.compat)?,
                gpu_source: gpus.source,
                gpu_hour_cost,
                slo_objectives: slo
                    .iter()
                    .map(|(name, t)| (name.to_string(), t.objective))
                    .collect(),
                tenant: tenants.is_some(),
            },
            meter: meter::Settings {
                max_line_bytes: self.max_line_bytes,
                // clap admits only `auto` and the known names.
                api: Api::from_name(&self.api),
            },
            upstream_tls,
            gpu_notes: gpus.notes,
            slo: Arc::new(slo),
            ui: (!self.page.no_ui).then_some(self.ui_sample_period),
            replicas,
            engine_metrics: engine::parse(&self.engine_metrics)?,
            engine_metrics_interval: self.engine_metrics_interval,
            tenants,
            request_log: self.request_log.clone(),
            workload: self.workload()?,
            tokenizers: self.tokenizer.clone(),
            tracing: TracingConfig::from_flags(
                otlp::settings::Flags {
                    endpoint: self.otlp_endpoint.as_deref(),
                    sample: self.trace_sample.as_deref(),
                },
                host,
            )?,
        })
    }

    /// `--workload-log` and its settings; `None` without it (its settings alone are an error:
    /// they would do nothing).
    fn workload(&self) -> Result<Option<WorkloadConfig>, ConfigError> {
        if self.workload_block_tokens == 0 {
            return Err(ConfigError::Zero("workload-block-tokens"));
        }
        let header = self
            .workload_conversation_header
            .as_deref()
            .map(|h| {
                http::HeaderName::from_bytes(h.trim().as_bytes())
                    .map_err(|_| ConfigError::BadConversationHeader(h.to_string()))
            })
            .transpose()?;
        let Some(path) = &self.workload_log else {
            if header.is_some() {
                return Err(ConfigError::NeedsWorkloadLog(
                    "workload-conversation-header",
                ));
            }
            return Ok(None);
        };
        Ok(Some(WorkloadConfig {
            destination: Destination::of(path),
            block_tokens: self.workload_block_tokens,
            conversation_header: header,
            hold: tokenmeter::workload::HOLD,
        }))
    }

    /// The SLO class table from `--slo`, `--slo-file` and the class flags.
    fn slo_classes(&self, host: &dyn Host) -> Result<Classes, SloError> {
        let file = self.slo_file.as_deref();
        slo::spec::Declaration {
            flags: self.slo.clone(),
            file: file
                .map(|f| slo::spec::FileText::read(f, host))
                .transpose()?,
            header: self.slo_class_header.clone(),
            default_class: self.slo_default_class.clone(),
        }
        .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: ProxyArgs,
    }

    fn args(extra: &[&str]) -> ProxyArgs {
        let mut v = vec!["t"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).expect("parse").a
    }

    #[test]
    fn for_upstream_is_what_the_flags_default_to() {
        use tokenmeter::host::MapHost;
        let url = "http://127.0.0.1:8000/v1";
        let parsed = args(&["--upstream", url]).validate_on(&MapHost::default());
        let parsed = Config {
            gpu_notes: Vec::new(),
            ..parsed.expect("valid")
        };
        let direct = Config::for_upstream(parse_upstream(url).expect("valid"));
        assert_eq!(format!("{parsed:?}"), format!("{direct:?}"));
    }

    #[test]
    fn upstream_keeps_prefix_and_rejects_nonsense() {
        let c = args(&["--upstream", "http://127.0.0.1:8000/v1/"]).validate();
        let u = c.expect("valid").proxy.upstream;
        assert_eq!(u.origin.to_string(), "http://127.0.0.1:8000/");
        assert_eq!(u.base_path, "/v1");
        let c = args(&["--upstream", "https://api.openai.com/v1"]).validate();
        let u = c.expect("valid").proxy.upstream;
        assert_eq!(u.origin.to_string(), "https://api.openai.com/");
        assert!(u.is_https());
        assert_eq!(u.base_path, "/v1");
        for bad in ["127.0.0.1:8000", "ftp://x", "http://", "https://", "::"] {
            let e = args(&["--upstream", bad]).validate();
            assert!(
                matches!(e, Err(ConfigError::BadUpstream(..))),
                "{bad}: {e:?}"
            );
        }
        assert_eq!(
            args(&[]).validate().err(),
            Some(ConfigError::MissingUpstream)
        );
    }

    #[test]
    fn addresses_gpus_and_buckets_are_checked() {
        let up = ["--upstream", "http://u:1"];
        let e = args(&[&up[..], &["--listen", "nope"]].concat()).validate();
        assert_eq!(
            e.err(),
            Some(ConfigError::BadAddress("listen", "nope".into()))
        );
        let e = args(&[&up[..], &["--gpus", "0"]].concat()).validate();
        assert_eq!(
            e.err(),
            Some(ConfigError::Gpus(GpuError::BadFlag("0".into())))
        );
        assert_eq!(parse_buckets("1,2,3"), Ok(BucketList(vec![1.0, 2.0, 3.0])));
        // --buckets picks the set every measure starts from; a --buckets-* flag still wins.
        let c = args(&up).validate().expect("valid");
        assert_eq!(c.metrics.buckets, Buckets::default());
        let c = args(&[&up[..], &["--buckets", "coarse"]].concat()).validate();
        assert_eq!(c.expect("valid").metrics.buckets, Buckets::coarse());
        let c = args(&[&up[..], &["--buckets", "coarse", "--buckets-tps", "5,50"]].concat());
        let b = c.validate().expect("valid").metrics.buckets;
        assert_eq!(b.tps, [5.0, 50.0]);
        assert_eq!(b.ttft, Buckets::coarse().ttft);
        let e = args(&[&up[..], &["--buckets", "fine"]].concat()).validate();
        let line = e.as_ref().err().map(ToString::to_string);
        let want = r#"--buckets "fine" is not a bucket set (expected default or coarse)"#;
        assert_eq!(line.as_deref(), Some(want));
        assert_eq!(
            e.err(),
            Some(ConfigError::BadBuckets(UnknownPreset("fine".into())))
        );
        let c = args(&[&up[..], &["--buckets-tps", "5,50"]].concat()).validate();
        assert_eq!(c.expect("valid").metrics.buckets.tps, [5.0, 50.0]);
        assert!(parse_buckets("1,1").is_err());
        assert!(parse_buckets("a").is_err());
        let c = args(&[&up[..], &["--idle-timeout", "0"]].concat()).validate();
        assert_eq!(c.expect("valid").proxy.idle_timeout, None);
    }

    #[test]
    fn gpus_auto_reads_only_the_host_it_is_given() {
        use tokenmeter::gpus::Source;
        use tokenmeter::host::MapHost;
        let up = ["--upstream", "http://u:1"];
        let host = MapHost::default().var("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b");
        let c = args(&up).validate_on(&host).expect("valid");
        assert_eq!(
            (c.metrics.gpus, c.metrics.gpu_source),
            (2.0, Source::NvidiaVisibleDevices)
        );
        assert_eq!(c.capacity_model().fleet.gpus, 2.0);
        let c = args(&[&up[..], &["--gpus", "8"]].concat())
            .validate_on(&host)
            .expect("valid");
        assert_eq!((c.metrics.gpus, c.metrics.gpu_source), (8.0, Source::Flag));
        let host = MapHost::default().file("/podinfo/gpus", "4");
        let c = args(&[&up[..], &["--gpus-file", "/podinfo/gpus"]].concat())
            .validate_on(&host)
            .expect("valid");
        assert_eq!((c.metrics.gpus, c.metrics.gpu_source), (4.0, Source::File));
        let c = args(&up).validate_on(&MapHost::default()).expect("valid");
        assert_eq!(
            (c.metrics.gpus, c.metrics.gpu_source),
            (1.0, Source::Default)
        );
    }

    #[test]
    fn gpu_hour_cost_is_a_number() {
        let up = ["--upstream", "http://u:1"];
        let c = args(&[&up[..], &["--gpu-hour-cost", "2.49"]].concat()).validate();
        let c = c.expect("valid");
        assert_eq!(c.metrics.gpu_hour_cost, Some(2.49));
        assert_eq!(c.capacity_model().fleet.gpu_hour_cost, Some(2.49));
        let c = args(&up).validate().expect("valid");
        assert_eq!(c.metrics.gpu_hour_cost, None);
        for bad in ["cheap", "-1", "inf"] {
            let flag = format!("--gpu-hour-cost={bad}");
            let e = args(&[&up[..], &[flag.as_str()]].concat()).validate();
            assert_eq!(e.err(), Some(ConfigError::BadCost(bad.into())), "{bad}");
        }
    }

    #[test]
    fn slo_classes_come_from_flags_and_the_file() {
        use tokenmeter::host::MapHost;
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid");
        let names: Vec<_> = c.slo.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["interactive", "batch"]);
        // One --slo value may hold several classes separated by ';' (as TOKENMETER_SLO does).
        let c = args(
            &[
                &up[..],
                &["--slo", "chat:ttft=300ms;bulk", "--slo", "agent:tps=50"],
            ]
            .concat(),
        )
        .validate()
        .expect("valid");
        let names: Vec<_> = c.slo.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["chat", "bulk", "agent"]);
        let host = MapHost::default().file("/etc/slo.yaml", "classes: [{name: gold, ttft: 250ms}]");
        let flags = ["--slo-file", "/etc/slo.yaml", "--slo-default-class", "gold"];
        let c = args(&[&up[..], &flags].concat())
            .validate_on(&host)
            .expect("valid");
        assert_eq!(c.slo.default_class(), "gold");
        let e = args(&[&up[..], &["--slo-file", "/nope.yaml"]].concat()).validate_on(&host);
        assert!(
            matches!(e, Err(ConfigError::Slo(SloError::Unreadable { ref file, .. })) if file == "/nope.yaml"),
            "{e:?}"
        );
        let e = args(&[&up[..], &["--slo", "chat:tps=-1"]].concat()).validate();
        assert!(matches!(e, Err(ConfigError::Slo(_))), "{e:?}");
    }

    #[test]
    fn compat_names_schemes() {
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid");
        assert_eq!(c.metrics.compat, Compat::default());
        let c = args(&[&up[..], &["--compat", "vllm"]].concat()).validate();
        assert!(c.expect("valid").metrics.compat.vllm);
        let c = args(&[&up[..], &["--compat", "vllm,otel"]].concat()).validate();
        let both = Compat {
            vllm: true,
            otel: true,
        };
        assert_eq!(c.expect("valid").metrics.compat, both);
        let c = args(&[&up[..], &["--compat", "otel"]].concat()).validate();
        let compat = c.expect("valid").metrics.compat;
        assert!(compat.otel && !compat.vllm);
        let e = args(&[&up[..], &["--compat", "vllm,tgi"]].concat()).validate();
        assert_eq!(e.err(), Some(ConfigError::BadCompat("tgi".into())));
    }

    #[test]
    fn the_page_is_on_unless_no_ui_and_its_period_is_bounded() {
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid");
        assert_eq!(c.ui, Some(Duration::from_secs(5)));
        let c = args(&[&up[..], &["--no-ui"]].concat()).validate();
        assert_eq!(c.expect("valid").ui, None);
        let c = args(&[&up[..], &["--ui-sample-period", "1s"]].concat()).validate();
        assert_eq!(c.expect("valid").ui, Some(Duration::from_secs(1)));
        for bad in ["500ms", "61s"] {
            let e = args(&[&up[..], &["--ui-sample-period", bad]].concat()).validate();
            assert!(matches!(e, Err(ConfigError::BadUiSamplePeriod(_))), "{bad}");
        }
    }

    #[test]
    fn api_pins_a_format_or_detects() {
        let up = ["--upstream", "http://u:1"];
        assert_eq!(args(&up).validate().expect("valid").meter.api, None);
        let c = args(&[&up[..], &["--api", "anthropic"]].concat()).validate();
        assert_eq!(c.expect("valid").meter.api, Some(Api::Anthropic));
        let c = args(&[&up[..], &["--api", "auto"]].concat()).validate();
        assert_eq!(c.expect("valid").meter.api, None);
        let mut v = vec!["t"];
        v.extend_from_slice(&[&up[..], &["--api", "grpc"]].concat());
        assert!(T::try_parse_from(v).is_err());
    }

    #[test]
    fn admission_caps_have_their_defaults_and_refuse_zero() {
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid");
        assert_eq!(
            (
                c.proxy.admission.max_in_flight,
                c.server.max_connections,
                c.proxy.admission.retry_after
            ),
            (
                proxy::DEFAULT_MAX_IN_FLIGHT,
                server::DEFAULT_MAX_CONNECTIONS,
                proxy::DEFAULT_RETRY_AFTER
            )
        );
        let set = [
            "--max-in-flight",
            "10",
            "--max-connections",
            "20",
            "--retry-after",
            "5",
        ];
        let c = args(&[&up[..], &set].concat()).validate().expect("valid");
        assert_eq!(
            (
                c.proxy.admission.max_in_flight,
                c.server.max_connections,
                c.proxy.admission.retry_after
            ),
            (10, 20, 5)
        );
        for flag in ["max-in-flight", "max-connections", "retry-after"] {
            let zero = format!("--{flag}=0");
            let e = args(&[&up[..], &[zero.as_str()]].concat()).validate();
            assert_eq!(e.err(), Some(ConfigError::Zero(flag)));
        }
    }

    #[test]
    fn capacity_window_and_replicas_are_checked() {
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid").capacity_model();
        assert_eq!((c.window, c.fleet.replicas), (Duration::from_secs(900), 1));
        // The default classes: interactive has a 20 tok/s floor, batch none.
        let floors: Vec<_> = c
            .classes
            .iter()
            .map(|c| (c.name.as_str(), c.tps_floor))
            .collect();
        assert_eq!(floors, [("interactive", Some(20.0)), ("batch", None)]);
        let c = args(&[&up[..], &["--capacity-window", "1h", "--replicas", "4"]].concat());
        let c = c.validate().expect("valid").capacity_model();
        assert_eq!((c.window, c.fleet.replicas), (Duration::from_secs(3600), 4));
        let e = args(&[&up[..], &["--capacity-window", "5s"]].concat()).validate();
        assert_eq!(
            e.err(),
            Some(ConfigError::ShortCapacityWindow(Duration::from_secs(5)))
        );
        for bad in ["0", "-2", "many", "1.5"] {
            let flag = format!("--replicas={bad}");
            let e = args(&[&up[..], &[flag.as_str()]].concat()).validate();
            assert_eq!(
                e.err(),
                Some(ConfigError::Replicas(replicas::BadReplicas(bad.into())))
            );
        }
        // auto starts at 1 until the first lookup answers.
        let c = args(&[&up[..], &["--replicas", "auto"]].concat());
        let c = c.validate().expect("valid");
        assert_eq!(c.replicas, replicas::Setting::Auto);
        assert_eq!(c.proxy.upstream.host_and_port(), ("u".to_string(), 1));
        let c = args(&["--upstream", "https://[fd00::1]/v1"]).validate();
        let c = c.expect("valid");
        assert_eq!(
            c.proxy.upstream.host_and_port(),
            ("fd00::1".to_string(), 443)
        );
        assert_eq!(c.capacity_model().fleet.replicas, 1);
    }

    #[test]
    fn tenant_flags_turn_the_label_on_or_are_refused() {
        use tokenmeter::host::MapHost;
        let up = ["--upstream", "http://u:1"];
        let c = args(&up).validate().expect("valid");
        assert_eq!((c.tenants, c.metrics.tenant), (None, false));
        let host = MapHost::default().file("/etc/tenants", "vip # pinned\n");
        let flags = [
            "--tenant-header",
            "x-tenant",
            "--tenant-allow-file",
            "/etc/tenants",
        ];
        let c = args(&[&up[..], &flags].concat())
            .validate_on(&host)
            .expect("valid");
        assert!(c.metrics.tenant);
        let t = c.tenants.expect("on");
        assert_eq!(
            (t.max, t.pinned, t.from_key),
            (32, vec!["vip".to_string()], false)
        );
        let c = args(&[&up[..], &["--tenant-from-key", "--max-tenants", "4"]].concat());
        let t = c.validate().expect("valid").tenants.expect("on");
        assert_eq!((t.header, t.max, t.from_key), (None, 4, true));
        let e = args(&[&up[..], &["--tenant-from-key", "--max-tenants", "0"]].concat()).validate();
        assert_eq!(e.err(), Some(ConfigError::Tenant(TenantError::Zero)));
        let e = args(&[&up[..], &["--max-tenants", "4"]].concat()).validate();
        let want = TenantError::NoSource("max-tenants");
        assert_eq!(e.err(), Some(ConfigError::Tenant(want)));
    }

    #[test]
    fn tls_flags_come_in_pairs_and_upstream_ones_need_https() {
        let https = ["--upstream", "https://u:1"];
        let c = args(&https).validate().expect("valid");
        assert_eq!(c.proxy.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!((c.server.tls, c.server.metrics_tls), (None, None));
        assert_eq!(c.upstream_tls, UpstreamTls::default());
        let c = args(&[&https[..], &["--connect-timeout", "0"]].concat()).validate();
        assert_eq!(c.expect("valid").proxy.connect_timeout, None);
        let both = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let c = args(&[&https[..], &both].concat()).validate();
        let tls = c.expect("valid").server.tls.expect("tls");
        assert_eq!(
            (tls.cert_flag, tls.key.to_str()),
            ("tls-cert", Some("k.pem"))
        );
        let cases: [(&[&str], ConfigError); 5] = [
            (
                &["--upstream", "https://u:1", "--tls-cert", "c.pem"],
                ConfigError::Unpaired("tls-cert", "tls-key"),
            ),
            (
                &["--upstream", "https://u:1", "--metrics-tls-key", "k.pem"],
                ConfigError::Unpaired("metrics-tls-key", "metrics-tls-cert"),
            ),
            (
                &[
                    "--upstream",
                    "https://u:1",
                    "--upstream-client-key",
                    "k.pem",
                ],
                ConfigError::Unpaired("upstream-client-key", "upstream-client-cert"),
            ),
            (
                &["--upstream", "http://u:1", "--upstream-ca", "ca.pem"],
                ConfigError::NotHttps("upstream-ca"),
            ),
            (
                &[
                    "--upstream",
                    "http://u:1",
                    "--upstream-client-cert",
                    "c.pem",
                    "--upstream-client-key",
                    "k.pem",
                ],
                ConfigError::NotHttps("upstream-client-cert"),
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(args(extra).validate().err(), Some(want));
        }
    }
}
