//! The name of every metric family tokenmeter exports under its own scheme, once.
//!
//! The families register under these names, and the live page and the load generator read the
//! exposition by them, so a rename is one edit that the compiler carries everywhere. What each
//! family means, its type and its labels are in docs/metrics.md's table of series. The names are a
//! contract with dashboards, rules and users' queries: changing one is a breaking change.
//!
//! The capacity model's families are named beside their code, in [`super::capacity::names`].

// Requests, tokens and their timing; the process and its limits.
pub const REQUESTS_IN_FLIGHT: &str = "tokenmeter_requests_in_flight";
pub const GPUS: &str = "tokenmeter_gpus";
pub const GPU_HOUR_COST: &str = "tokenmeter_gpu_hour_cost";
pub const SLO_OBJECTIVE: &str = "tokenmeter_slo_objective";
pub const BUILD_INFO: &str = "tokenmeter_build_info";
pub const START_TIME_SECONDS: &str = "tokenmeter_start_time_seconds";
pub const IN_FLIGHT_LIMIT: &str = "tokenmeter_in_flight_limit";
pub const CONNECTIONS_LIMIT: &str = "tokenmeter_connections_limit";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "tokenmeter_connections_refused_total";
pub const HTTP2_CONNECTIONS_CLOSED_TOTAL: &str = "tokenmeter_http2_connections_closed_total";
pub const METRICS_CONNECTIONS_LIMIT: &str = "tokenmeter_metrics_connections_limit";
pub const METRICS_CONNECTIONS_SHED_TOTAL: &str = "tokenmeter_metrics_connections_shed_total";
pub const PARSE_ERRORS_TOTAL: &str = "tokenmeter_parse_errors_total";
pub const TOKEN_COUNT_SOURCE_TOTAL: &str = "tokenmeter_token_count_source_total";
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "tokenmeter_time_to_first_token_seconds";
pub const TIME_TO_FIRST_BYTE_SECONDS: &str = "tokenmeter_time_to_first_byte_seconds";
pub const INTER_TOKEN_LATENCY_SECONDS: &str = "tokenmeter_inter_token_latency_seconds";
pub const TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "tokenmeter_time_per_output_token_seconds";
pub const REQUEST_TOKENS_PER_SECOND: &str = "tokenmeter_request_tokens_per_second";
pub const REQUEST_DURATION_SECONDS: &str = "tokenmeter_request_duration_seconds";
pub const REQUEST_OUTPUT_TOKENS: &str = "tokenmeter_request_output_tokens";
pub const REQUEST_INPUT_TOKENS: &str = "tokenmeter_request_input_tokens";
pub const OUTPUT_TOKENS_TOTAL: &str = "tokenmeter_output_tokens_total";
pub const INPUT_TOKENS_TOTAL: &str = "tokenmeter_input_tokens_total";
pub const TOKENS_PER_EVENT: &str = "tokenmeter_tokens_per_event";
pub const REQUEST_MAX_STALL_SECONDS: &str = "tokenmeter_request_max_stall_seconds";
pub const REQUEST_BURSTS_TOTAL: &str = "tokenmeter_request_bursts_total";
pub const TOKENIZER_CHECKS_TOTAL: &str = "tokenmeter_tokenizer_checks_total";
pub const TIME_TO_FIRST_OUTPUT_SECONDS: &str = "tokenmeter_time_to_first_output_seconds";
pub const REASONING_TOKENS_TOTAL: &str = "tokenmeter_reasoning_tokens_total";
pub const CACHED_INPUT_TOKENS_TOTAL: &str = "tokenmeter_cached_input_tokens_total";
pub const REQUESTS_TOTAL: &str = "tokenmeter_requests_total";
pub const OUTPUT_TOKENS_PER_SECOND: &str = "tokenmeter_output_tokens_per_second";
pub const OUTPUT_TOKENS_PER_SECOND_PER_GPU: &str = "tokenmeter_output_tokens_per_second_per_gpu";
pub const SLO_REQUESTS_TOTAL: &str = "tokenmeter_slo_requests_total";
pub const GOODPUT_OUTPUT_TOKENS_TOTAL: &str = "tokenmeter_goodput_output_tokens_total";
pub const REQUEST_LOG_DROPPED_TOTAL: &str = "tokenmeter_request_log_dropped_total";
pub const WORKLOAD_LOG_LINES_TOTAL: &str = "tokenmeter_workload_log_lines_total";
pub const WORKLOAD_LOG_DROPPED_TOTAL: &str = "tokenmeter_workload_log_dropped_total";
pub const WORKLOAD_LOG_SKIPPED_TOTAL: &str = "tokenmeter_workload_log_skipped_total";
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "tokenmeter_trace_spans_dropped_total";
pub const TIME_TO_FIRST_TOKEN_PART_SECONDS: &str = "tokenmeter_time_to_first_token_part_seconds";
pub const ENGINE_TIMING_MISMATCH_TOTAL: &str = "tokenmeter_engine_timing_mismatch_total";
pub const ENGINE_TIMINGS_REQUESTS_TOTAL: &str = "tokenmeter_engine_timings_requests_total";
pub const SPEC_DECODE_ACCEPTANCE_RATE: &str = "tokenmeter_spec_decode_acceptance_rate";
