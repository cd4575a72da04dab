//! The name of every metric family tokenmeter exports under its own scheme (`tokenmeter_*`),
//! once, grouped as the families are registered.
//!
//! The families register under these names, and the live page, the tools (`tokenmeter bench`,
//! `capacity`, `cost`, `demo`) and the tests read the exposition by them, so a rename is one edit
//! that the compiler carries everywhere. What each family means, its type and its labels are in
//! docs/metrics.md's table of series, and the whole exposition's families, types, help texts and label
//! names are pinned by a golden file (`crates/tokenmeter/tests/golden/exposition.txt`). The names
//! are a contract with dashboards, rules and users' queries: changing one is a breaking change.
//!
//! The groups at the top level are the request path's, registered by [`super::Metrics::new`]; the
//! three modules are the families exported only when their part runs ([`capacity`], [`cost`]'s
//! charges, [`engine_view`]), whose short names would otherwise collide.
//!
//! Not here, because they are other contracts: the `vllm:*` series of `--compat vllm` (vLLM's own
//! names, in `vllm.rs`) and the `gen_ai_*` series of `--compat otel` (OpenTelemetry's GenAI
//! semantic conventions, in [`super::otel`]), each named where it is mapped, beside the rule it
//! follows; and the simulator's `tokenmeter_sim_*` page (`tokenmeter sim`, in the tools crate),
//! which is the simulated engine's, not the proxy's.

// --- The process and its configuration: constant for the life of the process.

/// Always 1; the `version` label names the build.
pub const BUILD_INFO: &str = "tokenmeter_build_info";
/// Unix time the process started.
pub const START_TIME_SECONDS: &str = "tokenmeter_start_time_seconds";
/// `--gpus`, with where the count came from.
pub const GPUS: &str = "tokenmeter_gpus";
/// `--gpu-hour-cost`, exported only when set.
pub const GPU_HOUR_COST: &str = "tokenmeter_gpu_hour_cost";

// --- Admission: the caps on requests and connections, and what they turned away.

pub const IN_FLIGHT_LIMIT: &str = "tokenmeter_in_flight_limit";
pub const CONNECTIONS_LIMIT: &str = "tokenmeter_connections_limit";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "tokenmeter_connections_refused_total";
pub const HTTP2_CONNECTIONS_CLOSED_TOTAL: &str = "tokenmeter_http2_connections_closed_total";
pub const METRICS_CONNECTIONS_LIMIT: &str = "tokenmeter_metrics_connections_limit";
pub const METRICS_CONNECTIONS_SHED_TOTAL: &str = "tokenmeter_metrics_connections_shed_total";

// --- Requests and streams: what is in flight, how requests ended, what could not be read.

/// The gauge by `phase` (prefill, decode) that every leak check reads back to 0.
pub const REQUESTS_IN_FLIGHT: &str = "tokenmeter_requests_in_flight";
pub const REQUESTS_TOTAL: &str = "tokenmeter_requests_total";
pub const PARSE_ERRORS_TOTAL: &str = "tokenmeter_parse_errors_total";

// --- Latency: per-request timings of the stream, observed as it streams and when it ends.

pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "tokenmeter_time_to_first_token_seconds";
pub const TIME_TO_FIRST_BYTE_SECONDS: &str = "tokenmeter_time_to_first_byte_seconds";
pub const TIME_TO_FIRST_OUTPUT_SECONDS: &str = "tokenmeter_time_to_first_output_seconds";
pub const INTER_TOKEN_LATENCY_SECONDS: &str = "tokenmeter_inter_token_latency_seconds";
pub const TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "tokenmeter_time_per_output_token_seconds";
pub const REQUEST_TOKENS_PER_SECOND: &str = "tokenmeter_request_tokens_per_second";
pub const REQUEST_DURATION_SECONDS: &str = "tokenmeter_request_duration_seconds";
pub const REQUEST_MAX_STALL_SECONDS: &str = "tokenmeter_request_max_stall_seconds";
pub const REQUEST_BURSTS_TOTAL: &str = "tokenmeter_request_bursts_total";

// --- Tokens: how many, of which kind, and where the counts came from.

pub const REQUEST_OUTPUT_TOKENS: &str = "tokenmeter_request_output_tokens";
pub const REQUEST_INPUT_TOKENS: &str = "tokenmeter_request_input_tokens";
pub const OUTPUT_TOKENS_TOTAL: &str = "tokenmeter_output_tokens_total";
pub const INPUT_TOKENS_TOTAL: &str = "tokenmeter_input_tokens_total";
pub const REASONING_TOKENS_TOTAL: &str = "tokenmeter_reasoning_tokens_total";
pub const CACHED_INPUT_TOKENS_TOTAL: &str = "tokenmeter_cached_input_tokens_total";
pub const TOKENS_PER_EVENT: &str = "tokenmeter_tokens_per_event";
pub const TOKEN_COUNT_SOURCE_TOTAL: &str = "tokenmeter_token_count_source_total";
pub const TOKENIZER_CHECKS_TOTAL: &str = "tokenmeter_tokenizer_checks_total";

// --- Throughput: the aggregate output rate, refreshed at each scrape.

pub const OUTPUT_TOKENS_PER_SECOND: &str = "tokenmeter_output_tokens_per_second";
pub const OUTPUT_TOKENS_PER_SECOND_PER_GPU: &str = "tokenmeter_output_tokens_per_second_per_gpu";

// --- SLO: the classes' objectives, each request's verdict, and goodput.

pub const SLO_OBJECTIVE: &str = "tokenmeter_slo_objective";
pub const SLO_REQUESTS_TOTAL: &str = "tokenmeter_slo_requests_total";
pub const GOODPUT_OUTPUT_TOKENS_TOTAL: &str = "tokenmeter_goodput_output_tokens_total";

// --- The engine's timings: the parts of TTFT a stream states.

pub const TIME_TO_FIRST_TOKEN_PART_SECONDS: &str = "tokenmeter_time_to_first_token_part_seconds";
pub const ENGINE_TIMING_MISMATCH_TOTAL: &str = "tokenmeter_engine_timing_mismatch_total";
pub const ENGINE_TIMINGS_REQUESTS_TOTAL: &str = "tokenmeter_engine_timings_requests_total";
pub const SPEC_DECODE_ACCEPTANCE_RATE: &str = "tokenmeter_spec_decode_acceptance_rate";

// --- The logs and the span exporter: registered only when each is on.

/// `--request-log`.
pub const REQUEST_LOG_DROPPED_TOTAL: &str = "tokenmeter_request_log_dropped_total";
/// `--workload-log`.
pub const WORKLOAD_LOG_LINES_TOTAL: &str = "tokenmeter_workload_log_lines_total";
/// `--workload-log`.
pub const WORKLOAD_LOG_DROPPED_TOTAL: &str = "tokenmeter_workload_log_dropped_total";
/// `--workload-log`.
pub const WORKLOAD_LOG_SKIPPED_TOTAL: &str = "tokenmeter_workload_log_skipped_total";
/// `--otlp-endpoint`.
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "tokenmeter_trace_spans_dropped_total";

/// The capacity model's answers (`--capacity`), refreshed at each scrape; a series that needs a
/// fit is absent until there is one.
pub mod capacity {
    pub const STEP_SECONDS: &str = "tokenmeter_capacity_step_seconds";
    pub const FIT_SAMPLES: &str = "tokenmeter_capacity_fit_samples";
    pub const FIT_R2: &str = "tokenmeter_capacity_fit_r2";
    pub const OBSERVED_CONCURRENCY: &str = "tokenmeter_capacity_observed_concurrency";
    pub const MAX_CONCURRENCY: &str = "tokenmeter_capacity_max_concurrency";
    pub const OUTPUT_TPS: &str = "tokenmeter_capacity_output_tokens_per_second";
    pub const OUTPUT_TPS_PER_GPU: &str = "tokenmeter_capacity_output_tokens_per_second_per_gpu";
    pub const COST_PER_MILLION: &str = "tokenmeter_capacity_cost_per_million_output_tokens";
    pub const CURVE_TPS: &str = "tokenmeter_capacity_curve_tokens_per_second";
    pub const UTILIZATION: &str = "tokenmeter_capacity_utilization";
    pub const TPS_FLOOR: &str = "tokenmeter_capacity_tps_floor";
    /// The class's TTFT target, beside its floor: a reader of the exposition (`tokenmeter
    /// capacity --trace`) judges a replay by both.
    pub const TTFT_TARGET: &str = "tokenmeter_capacity_ttft_target_seconds";
    pub const REPLICAS: &str = "tokenmeter_capacity_replicas";
    pub const LIMIT_CONCURRENCY: &str = "tokenmeter_capacity_limit_concurrency";
    pub const MAX_REQUEST_RATE: &str = "tokenmeter_capacity_max_request_rate";
    pub const TTFT_SECONDS: &str = "tokenmeter_capacity_ttft_seconds";
    pub const PREFILL_PER_TOKEN: &str = "tokenmeter_capacity_prefill_seconds_per_token";
    pub const WORKLOAD_TOKENS: &str = "tokenmeter_capacity_workload_tokens";
    pub const WORKLOAD_REQUESTS: &str = "tokenmeter_capacity_workload_requests";
    pub const IN_FLIGHT: &str = "tokenmeter_capacity_in_flight";
    pub const KV_CACHE_TOKENS: &str = "tokenmeter_capacity_kv_cache_tokens";
    pub const KV_TOKENS_PER_REQUEST: &str = "tokenmeter_capacity_kv_tokens_per_request";
    pub const CHECK_CONCURRENCY: &str = "tokenmeter_capacity_check_concurrency";
    pub const CHECK_TTFT: &str = "tokenmeter_capacity_check_ttft_seconds";
    pub const CHECK_TPS: &str = "tokenmeter_capacity_check_tokens_per_second";
    pub const CHECK_ERROR: &str = "tokenmeter_capacity_check_error_ratio";
    pub const CHECK_TRUSTED: &str = "tokenmeter_capacity_check_trusted";
    /// The KV cache the requests in flight hold by the wire's count (prompts and what they
    /// streamed): exported with the capacity model, which knows the prompts.
    pub const KV_WIRE_TOKENS: &str = "tokenmeter_kv_cache_wire_tokens";
    /// 1 when a class's answer is exported, 0 when the model cannot answer it yet.
    pub const SUPPORTED: &str = "tokenmeter_capacity_supported";
    /// 1 for the `reason` the model cannot answer yet.
    pub const UNSUPPORTED: &str = "tokenmeter_capacity_unsupported";
    pub const ARRIVALS: &str = "tokenmeter_capacity_arrivals";
}

/// Who pays for the GPU: GPU-seconds charged by model, phase and tenant, idle and not assigned
/// yet, and with `--gpu-hour-cost` the same in USD.
pub mod cost {
    pub const GPU_SECONDS: &str = "tokenmeter_gpu_seconds_total";
    pub const GPU_IDLE_SECONDS: &str = "tokenmeter_gpu_idle_seconds_total";
    pub const GPU_UNASSIGNED_SECONDS: &str = "tokenmeter_gpu_unassigned_seconds";
    pub const GPU_COST_USD: &str = "tokenmeter_gpu_cost_usd_total";
}

/// The engine's own view, as its metrics state it (`--engine-metrics`): absent until the
/// engine states them.
pub mod engine_view {
    pub const KV_CACHE_TOKENS: &str = "tokenmeter_engine_kv_cache_tokens";
    pub const KV_CACHE_USAGE: &str = "tokenmeter_engine_kv_cache_usage_ratio";
    pub const REQUESTS_RUNNING: &str = "tokenmeter_engine_requests_running";
    pub const REQUESTS_WAITING: &str = "tokenmeter_engine_requests_waiting";
    pub const PREEMPTIONS: &str = "tokenmeter_engine_preemptions_total";
    pub const SCRAPES: &str = "tokenmeter_engine_metrics_scrapes_total";
}
