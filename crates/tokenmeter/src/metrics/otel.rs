//! OpenTelemetry's GenAI names for what tokenmeter measures on the wire: `--compat otel`.
//!
//! Teams whose dashboards and alerts follow the OpenTelemetry GenAI semantic conventions read
//! `gen_ai.server.time_to_first_token` and its siblings. With `--compat otel` tokenmeter exports
//! four of them, beside its own `tokenmeter_*` series, from the same [`Finished`] record:
//! `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`,
//! `gen_ai.server.request.duration` and `gen_ai.client.token.usage`.
//!
//! **Version.** Semantic conventions v1.41.0 (schema `https://opentelemetry.io/schemas/1.41.0`),
//! `model/gen-ai/metrics.yaml` and `docs/gen-ai/gen-ai-metrics.md` in
//! open-telemetry/semantic-conventions: the last release that carries the GenAI conventions
//! (v1.42.0 moved them to open-telemetry/semantic-conventions-genai, which has made no release
//! since; its unreleased main replaces `gen_ai.client.token.usage` by token counters). Since
//! v1.37.0 the provider is `gen_ai.provider.name` (it replaced `gen_ai.system`).
//!
//! **Attributes** (v1.41.0's requirement levels), as labels on every series unless said:
//! - `gen_ai.operation.name` (required): from the request's path ([`Operation::of_path`]), else
//!   the usual operation of the wire format that was read ([`Operation::of_api`]): `chat`,
//!   `text_completion`, `embeddings`, `generate_content`. A request that is neither (a
//!   `GET /v1/models`, a health check) is no GenAI operation and is not recorded here.
//! - `gen_ai.provider.name` (required): the flavour of API the wire spoke ([`provider`]), from
//!   the format the reader detected, else the one the path implies. The conventions make it
//!   "the instrumentation's best knowledge", a discriminator of the telemetry's flavour, which
//!   "may differ from the actual upstream provider": vLLM's OpenAI-compatible server is
//!   `openai`. Well-known values where one applies (`openai`, `anthropic`, `cohere`,
//!   `gcp.gen_ai`, `ibm.watsonx.ai`), else tokenmeter's `api` label value (`tgi`, `ollama`, ...),
//!   as the conventions allow a custom value. At most 13 values.
//! - `gen_ai.request.model` (conditionally required, "if available"): the model the request body
//!   named; `gen_ai.response.model` (recommended): the model the response named. Both go through
//!   the same `--max-models` admission as tokenmeter's `model` label (the rest are `other`); an
//!   empty value where there is none, which Prometheus treats as an absent label.
//! - `error.type` (conditionally required "if the operation ended in an error"), on
//!   `gen_ai.server.request.duration` only, as the conventions list it: empty (absent) for a
//!   success, else [`error_type`]: the status code of a complete non-success answer (`429`,
//!   `500`, ...), or `upstream_error`, `timeout`, `client_disconnect` from tokenmeter's outcomes.
//! - `gen_ai.token.type` (required on `gen_ai.client.token.usage`): `input` or `output`.
//! - `server.address` / `server.port` (recommended) are not exported: one tokenmeter has one
//!   upstream, and the scrape's own `instance` label already tells the pods apart.
//!
//! **Prometheus spelling**, as OpenTelemetry's "Prometheus and OpenMetrics Compatibility"
//! specification (`specification/compatibility/prometheus_and_openmetrics.md`, "OTLP Metric
//! points to Prometheus") translates an OTLP metric: characters outside `[a-zA-Z0-9_:]` become
//! `_` (so dots become underscores; runs of `_` are one `_`); the UCUM unit becomes a word and a
//! suffix unless the name already ends with it (`s` gives `_seconds`), and "portions of the Unit
//! within brackets (e.g. {packet}) MUST be dropped" (`{token}` adds nothing); `_total` is added
//! only to monotonic sums (counters), and every family here is a histogram, so none has it;
//! attributes become labels with the same character rule; and exporters "MUST by default add"
//! the instrumentation scope as `otel_scope_name`, `otel_scope_version`, `otel_scope_schema_url`
//! labels, which every series here carries (`tokenmeter`, its version, the schema above). The
//! resource's `target_info` series is not exported (the scrape's target labels play its part).
//!
//! **Definitions**, where the wire allows the conventions' own (docs/definitions.md has them
//! side by side with tokenmeter's, vLLM's, GuideLLM's and vLLM bench's):
//! - time to first token: arrival at the proxy to the first token-bearing event, the same
//!   observation as `tokenmeter_time_to_first_token_seconds`, for successful responses only (the
//!   conventions' "for successful responses": a complete response with a 2xx status);
//! - time per output token: decode time / (output tokens - 1), first to last token, so TTFT is
//!   not in it and the first token is not counted, for successful responses with two tokens or
//!   more (the conventions subtract TTFT from the request duration and divide by the tokens
//!   after the first; a request duration may be "time-to-last byte or last output token", and
//!   to the last output token the two are the same);
//! - request duration: arrival to the last byte of the response, as
//!   `tokenmeter_request_duration_seconds`, for every GenAI operation, failed ones with
//!   `error.type`;
//! - token usage: per request a parser read, the prompt tokens where the stream reports them and
//!   the output tokens by tokenmeter's order of truth (usage, token ids, counted events): the
//!   same numbers as `tokenmeter_input_tokens_total` and `tokenmeter_output_tokens_total`.
//!   None of these families is a counter, so none moves while a stream runs.

use std::collections::HashMap;

use prometheus::{HistogramOpts, HistogramVec};

use super::registrar::{register_histogram, Registrar};
use crate::protocol::operation::Operation;
use crate::protocol::Api;
use crate::record::{Finished, Outcome};

/// The semantic conventions' release these names and attributes follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

/// The instrumentation scope's name, the `otel_scope_name` label.
pub const SCOPE_NAME: &str = "tokenmeter";

/// `gen_ai.server.time_to_first_token`'s boundaries, v1.41.0 `docs/gen-ai/gen-ai-metrics.md`,
/// "Metric: `gen_ai.server.time_to_first_token`": "This metric SHOULD be specified with
/// ExplicitBucketBoundaries of [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
/// 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]".
pub const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// `gen_ai.server.time_per_output_token`'s, the same page, "Metric:
/// `gen_ai.server.time_per_output_token`": "[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
/// 0.5, 0.75, 1.0, 2.5]".
pub const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// `gen_ai.server.request.duration`'s, the same page, "Metric:
/// `gen_ai.server.request.duration`": "[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
/// 5.12, 10.24, 20.48, 40.96, 81.92]".
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// `gen_ai.client.token.usage`'s, the same page, "Metric: `gen_ai.client.token.usage`": "[1, 4,
/// 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]".
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The labels of the latency families: the attributes every GenAI server metric carries.
const LABELS: [&str; 4] = [
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_response_model",
];

/// `gen_ai.provider.name` for a wire format: the conventions' well-known value where one applies
/// (an OpenAI-compatible stream is `openai`, whoever serves it; Gemini's API is served by both
/// AI Studio and Vertex AI, so it is `gcp.gen_ai`, "any Google generative AI endpoint"), else
/// tokenmeter's own name for the format.
pub fn provider(api: Api) -> &'static str {
    match api {
        Api::OpenAi | Api::Responses => "openai",
        Api::Anthropic => "anthropic",
        Api::Cohere => "cohere",
        Api::Gemini => "gcp.gen_ai",
        Api::Watsonx => "ibm.watsonx.ai",
        Api::Tgi
        | Api::LlamaCpp
        | Api::Ollama
        | Api::Sglang
        | Api::Triton
        | Api::Replicate
        | Api::Unknown => api.as_str(),
    }
}

/// Whether a request succeeded in the conventions' sense: the whole response came, with a 2xx.
pub fn succeeded(f: &Finished) -> bool {
    f.outcome == Outcome::Complete && (200..300).contains(&f.code)
}

/// `error.type` of a failed request (`None`: it succeeded). A complete answer with another
/// status is its code, as the conventions ask ("SHOULD match the error code returned by the
/// Generative AI service"): a status code, bounded as `tokenmeter_requests_total`'s `code`.
/// A request that did not complete is its outcome: `upstream_error` (unreachable, refused, or
/// failed mid-stream), `timeout` (`--upstream-timeout` or `--idle-timeout`),
/// `client_disconnect` (the client went away first).
pub fn error_type(f: &Finished) -> Option<String> {
    match f.outcome {
        Outcome::Complete if succeeded(f) => None,
        Outcome::Complete => Some(f.code.to_string()),
        other => Some(other.as_str().to_string()),
    }
}

/// The OTel-named families, registered in the same registry as tokenmeter's own.
pub(super) struct Otel {
    ttft: HistogramVec,
    tpot: HistogramVec,
    duration: HistogramVec,
    token_usage: HistogramVec,
}

/// A histogram carrying the instrumentation scope's labels, as an OTel exporter writes it.
fn histogram(
    r: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> prometheus::Result<HistogramVec> {
    let scope = HashMap::from([
        ("otel_scope_name".to_string(), SCOPE_NAME.to_string()),
        (
            "otel_scope_version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("otel_scope_schema_url".to_string(), SCHEMA_URL.to_string()),
    ]);
    let opts = HistogramOpts::new(name, help)
        .const_labels(scope)
        .buckets(buckets.to_vec());
    register_histogram(r, opts, labels)
}

impl Otel {
    pub(super) fn new(r: &Registrar) -> prometheus::Result<Self> {
        let with = |extra: &'static str| {
            let mut l = LABELS.to_vec();
            l.push(extra);
            l
        };
        Ok(Otel {
            ttft: histogram(
                r,
                "gen_ai_server_time_to_first_token_seconds",
                "Time to generate first token for successful responses (tokenmeter: arrival at the proxy to the first token-bearing event).",
                &LABELS,
                &TTFT_BUCKETS,
            )?,
            tpot: histogram(
                r,
                "gen_ai_server_time_per_output_token_seconds",
                "Time per output token generated after the first token for successful responses: (last token - first token) / (output tokens - 1).",
                &LABELS,
                &TPOT_BUCKETS,
            )?,
            duration: histogram(
                r,
                "gen_ai_server_request_duration_seconds",
                "Generative AI server request duration (tokenmeter: arrival at the proxy to the last byte of the response).",
                &with("error_type"),
                &DURATION_BUCKETS,
            )?,
            token_usage: histogram(
                r,
                "gen_ai_client_token_usage",
                "Number of input and output tokens used (input where the stream reports it).",
                &with("gen_ai_token_type"),
                &TOKEN_BUCKETS,
            )?,
        })
    }

    /// Records one finished request; `request_model` is the bounded label of the model the
    /// request named ("" when it named none).
    pub(super) fn record(&self, f: &Finished, request_model: &str) {
        let Some(operation) = f.route.operation.or(Operation::of_api(f.api)) else {
            return;
        };
        let api = match f.api {
            Api::Unknown => f.route.api.unwrap_or(Api::Unknown),
            read => read,
        };
        let response_model = if f.model_from_response {
            f.model.as_str()
        } else {
            ""
        };
        let l = [
            operation.as_str(),
            provider(api),
            request_model,
            response_model,
        ];
        let error = error_type(f);
        self.duration
            .with_label_values(&[l[0], l[1], l[2], l[3], error.as_deref().unwrap_or("")])
            .observe(f.duration.as_secs_f64());
        if f.api != Api::Unknown {
            let usage = |kind: &str, n: u64| {
                self.token_usage
                    .with_label_values(&[l[0], l[1], l[2], l[3], kind])
                    .observe(n as f64);
            };
            if let Some(input) = f.input_tokens {
                usage("input", input);
            }
            usage("output", f.output_tokens);
        }
        if error.is_some() {
            return;
        }
        if let Some(ttft) = f.first_token {
            self.ttft.with_label_values(&l).observe(ttft.as_secs_f64());
        }
        if let Some(decode) = f.decode_time() {
            if f.output_tokens >= 2 {
                let tpot = decode.as_secs_f64() / (f.output_tokens - 1) as f64;
                self.tpot.with_label_values(&l).observe(tpot);
            }
        }
    }
}

#[cfg(test)]
mod tests;
