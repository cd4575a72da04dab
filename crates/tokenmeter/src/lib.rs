//! tokenmeter: a streaming reverse proxy that measures LLM inference.
//!
//! This file is the table of contents, grouped by what each part is for. `ARCHITECTURE.md` has
//! the map of who may import whom; `tests/layering.rs` holds the code to it.
//!
//! **Where it starts**: [`app`], the composition root, builds every part below from its
//! settings in one place and hands them to the [`server`].
//!
//! **The request path**, in the order a request meets it:
//!
//! - [`server`]: binds the proxy and metrics listeners, accepts connections (up to
//!   `--max-connections`), drains on shutdown; [`drain`] is what a request sees of the drain,
//!   [`tls`] both sides' TLS.
//! - [`proxy`]: the request path as a tower stack, [`proxy::stack`]: [`proxy::metering`] (one
//!   meter per request from its head, recorded once; the tap), [`proxy::upgrades`] (the
//!   client's half of a WebSocket upgrade, joined to the upstream's), [`proxy::admission`] (a place
//!   under `--max-in-flight`, [`overload`], or a 503 at once), [`proxy::inspect`] (the request
//!   body, the model; the meter is sent), [`proxy::timeout`] (the response head's deadline),
//!   [`proxy::upstream`] (the pooled client).
//! - [`inject`]: `--inject-usage`, which asks for usage and removes the extra chunk again.
//! - [`upgrade`]: a `101 Switching Protocols` joined both ways.
//! - [`tap`]: the body wrapper. It yields exactly the upstream's frames and shows each to a meter;
//!   [`idle`], beneath it, ends a body silent for `--idle-timeout`.
//! - [`meter`]: per-request timing (TTFT, inter-token latency, decode speed, concurrency band),
//!   ending in one [`record::Finished`] record.
//! - [`read`]: the body reader: sans-IO framing (SSE, NDJSON, a JSON document) and the choice of
//!   extractor; takes bytes, returns the token-bearing events they completed.
//! - [`protocol`]: one extractor per wire format; turns messages into token counts and usage.
//! - [`tokenize`]: `--tokenizer`, the model's own tokenizer and chat template: prompt and output
//!   tokens counted as the engine counts them.
//!
//! **What is made of it**:
//!
//! - [`record`]: the one record of a finished request, which the metrics, the capacity model and
//!   the sinks take.
//! - [`metrics`]: the metric families, each name once ([`metrics::names`]); every label value is
//!   bounded.
//! - [`slo`]: SLO classes (`--slo`), which class a request is in, and whether it met its targets.
//! - [`tenant`]: who sent a request (`--tenant-header`, `--tenant-from-key`), as a bounded label.
//! - [`capacity`]: the live capacity model fitted from the stream's own timing; [`replicas`]:
//!   how many engines it is spread over (`--replicas auto` counts the upstream's addresses).
//! - [`gpus`]: how many GPUs are behind the proxy (`--gpus auto`), and where that came from.
//! - [`cost`]: who pays for the GPU: each moment's GPU time split among the requests in flight
//!   as it is spent, and idle, in books that add up to `--gpus` x uptime.
//! - [`engine`]: the engine's own view of itself (`--engine-metrics`): its KV cache, queue and
//!   preemptions, read from its metrics off the request path, with [`exposition`].
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz` on the metrics listener; [`ui`]: the page there.
//! - [`context`]: who a request is (W3C trace context, `x-request-id`, path) and whether its span
//!   is sampled; [`reqlog`]: one JSON line per finished request (`--request-log`); [`otlp`]:
//!   one span per request, exported over OTLP/HTTP (`--otlp-endpoint`); [`workload`]: the
//!   workload trace, one Mooncake line per request for generation (`--workload-log`), to
//!   replay; [`logfile`]: where both logs write, reopened on SIGHUP.
//!
//! **Settings and small shared pieces**:
//!
//! - [`config`]: the validated configuration, each subsystem's settings ([`config::Config`]).
//! - [`host`]: what configuration reads from the machine (environment, files), behind a trait.
//! - [`signal`]: SIGTERM / Ctrl-C as a future. [`ratelog`]: log lines rate-limited per cause.
//! - [`units`] (durations), [`quantile`] (PromQL's `histogram_quantile`, and nearest rank),
//!   [`rng`] (the seeded SplitMix64 the replay and the tools draw from) and [`error`] (the
//!   boxed error): leaves that import nothing of the crate.
//!
//! **Beside the product**, in crates of their own: the command line (`tokenmeter-flags`: the
//! flags and environment variables, validated into a [`config::Config`]), the tools
//! (`tokenmeter-tools`: the simulator, the load generator, the demo, the capacity and cost
//! commands, and what they read `/metrics` back with) and the binary (the workspace's root
//! package). They use this library; Cargo keeps it from using them.

// Where it starts.
pub mod app;

// The request path.
pub mod drain;
pub mod idle;
pub mod inject;
pub mod meter;
pub mod overload;
pub mod protocol;
pub mod proxy;
pub mod read;
pub mod server;
pub mod tap;
pub mod tls;
pub mod tokenize;
pub mod upgrade;

// What is made of it.
pub mod admin;
pub mod capacity;
pub mod cost;
pub mod engine;
pub mod exposition;
pub mod gpus;
pub mod metrics;
pub mod otlp;
pub mod record;
pub mod replicas;
pub mod slo;
pub mod tenant;
pub mod ui;
pub mod workload;

// Settings and small shared pieces.
pub mod config;
pub mod context;
pub mod error;
pub mod host;
pub mod logfile;
pub mod quantile;
pub mod ratelog;
pub mod reqlog;
pub mod rng;
pub mod signal;
pub mod units;
