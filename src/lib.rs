//! tokenmeter: a streaming reverse proxy that measures LLM inference.
//!
//! This file is the table of contents. A request's path through the code, top to bottom:
//!
//! - [`config`]: command-line flags and environment variables, validated into a [`config::Config`].
//! - [`server`]: binds the proxy and metrics listeners, accepts connections, drains on shutdown.
//! - [`proxy`]: the request path as a tower stack, [`proxy::stack`]: [`proxy::inspect`] (the
//!   request body, the model), [`proxy::metering`] (one meter per request, the tap),
//!   [`proxy::timeout`] (the response head's deadline), [`proxy::upstream`] (the pooled client).
//! - [`inject`]: `--inject-usage`, which asks for usage and removes the extra chunk again.
//! - [`tap`]: the body wrapper. It yields exactly the upstream's frames and shows each to a meter.
//! - [`meter`]: per-request timing (TTFT, inter-token latency, decode speed, concurrency band),
//!   ending in one [`metrics::Finished`] record.
//! - [`read`]: the body reader: sans-IO framing (SSE, NDJSON, a JSON document) and the choice of
//!   extractor; takes bytes, returns the token-bearing events they completed.
//! - [`protocol`]: one extractor per wire format; turns messages into token counts and usage.
//! - [`metrics`]: the only module that names a metric; every label value is bounded.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz` on the metrics listener.
//! - [`ui`]: the page on the metrics listener (`/`, `/api/summary`), drawn from the registry.
//! - [`signal`]: SIGTERM / Ctrl-C as a future.
//! - [`slo`]: SLO classes (`--slo`), which class a request is in, and whether it met its targets.
//! - [`gpus`]: how many GPUs are behind the proxy (`--gpus auto`), and where that came from.
//! - [`host`]: what configuration reads from the machine (environment, files), behind a trait.
//! - [`tenant`]: who sent a request (`--tenant-header`, `--tenant-from-key`), as a bounded label.
//!
//! - [`capacity`]: the live capacity model fitted from the stream's own timing (its answers are
//!   exported by [`metrics::capacity`]); [`replicas`]: how many engines it is spread over
//!   (`--replicas auto` counts the upstream's addresses).
//!
//! Beside the proxy: [`sim`], a simulated inference server (a test instrument); [`demo`], which
//! runs the simulator, the proxy and a ramping load in one process; and
//! [`bench`](mod@bench), a load generator that measures any OpenAI-compatible server. The tools
//! and the tests read a `/metrics` scrape back with [`exposition`] (fetched by [`scrape`]); the
//! proxy never does.

pub mod admin;
pub mod bench;
pub mod config;
pub mod demo;
pub mod exposition;
pub mod gpus;
pub mod host;
pub mod inject;
pub mod meter;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod read;
pub mod server;
pub mod signal;
pub mod sim;
pub mod slo;
pub mod tap;
pub mod ui;

// The live capacity model (issue 15); its metric families are `metrics::capacity`, and
// `replicas` is `--replicas` (auto: counted from the upstream's DNS records).
pub mod capacity;
pub mod replicas;
pub mod scrape;

// Issue 14: who is using the GPUs, the bounded `tenant` label.
pub mod tenant;

// Issue 13: TLS on both sides, protocol upgrades, and log lines rate-limited per cause.
pub mod drain;
pub mod ratelog;
pub mod tls;
pub mod upgrade;
