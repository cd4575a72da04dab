//! The request path's metric families, one group per struct, each registered by its own
//! function through the [`Registrar`].
//!
//! A group is the families one concern writes: admission, requests and streams, latency,
//! tokens, throughput, SLO. [`super::Metrics::new`] calls the groups' `register` in turn, so
//! adding a family is a name in [`super::names`], a field and a registration in its group, and
//! the code that observes it; the golden exposition test then names the file to update.
//! The families exported only when their part runs (capacity, cost, the engine's view) and the
//! other naming schemes register in their own files, through the same [`Registrar`].

use prometheus::{
    Gauge, GaugeVec, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use super::labels::{tenanted, ParseError};
use super::registrar::{counter, gauge, histogram, int_counter, int_gauge, Registrar};
use super::{names, Buckets, MetricsConfig, Phase};
use crate::protocol::TokenSource;

/// The process and its configuration: set once here, never again, so no handle is kept.
pub(super) fn register_process(r: &Registrar, cfg: &MetricsConfig) -> prometheus::Result<()> {
    let build = IntGaugeVec::new(
        Opts::new(
            names::BUILD_INFO,
            "Always 1; the version label says which build.",
        ),
        &["version"],
    )?;
    r.register(&build)?;
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    int_gauge(
        r,
        names::START_TIME_SECONDS,
        "Unix time the process started.",
    )?
    .set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64),
    );
    let gpus = GaugeVec::new(
        Opts::new(
            names::GPUS,
            "GPUs behind this proxy (--gpus); source says where the number came from.",
        ),
        &["source"],
    )?;
    r.register(&gpus)?;
    gpus.with_label_values(&[cfg.gpu_source.as_str()])
        .set(cfg.gpus);
    if let Some(cost) = cfg.gpu_hour_cost {
        gauge(
            r,
            names::GPU_HOUR_COST,
            "What one GPU costs per hour, in USD (--gpu-hour-cost).",
        )?
        .set(cost);
    }
    Ok(())
}

/// The admission caps and what they turned away.
pub(super) struct Admission {
    pub(super) in_flight_limit: IntGauge,
    pub(super) connections_limit: IntGauge,
    pub(super) connections_refused: IntCounter,
    /// By the GOAWAY's reason: HTTP/2's fixed set of error codes, named by the server.
    pub(super) http2_closed: IntCounterVec,
    pub(super) metrics_connections_limit: IntGauge,
    pub(super) metrics_connections_shed: IntCounter,
}

impl Admission {
    pub(super) fn register(r: &Registrar) -> prometheus::Result<Self> {
        Ok(Admission {
            in_flight_limit: int_gauge(
                r,
                names::IN_FLIGHT_LIMIT,
                "--max-in-flight: requests proxied at once; more are shed (503, outcome shed).",
            )?,
            connections_limit: int_gauge(
                r,
                names::CONNECTIONS_LIMIT,
                "--max-connections: open client connections; more are closed when accepted.",
            )?,
            connections_refused: int_counter(
                r,
                names::CONNECTIONS_REFUSED_TOTAL,
                "Client connections closed as soon as they were accepted, at --max-connections.",
            )?,
            http2_closed: counter(
                r,
                names::HTTP2_CONNECTIONS_CLOSED_TOTAL,
                "Client HTTP/2 connections tokenmeter closed with a GOAWAY for what the client did, by the GOAWAY's reason: enhance_your_calm for a flood limit (rapid reset, too many stream errors, a CONTINUATION or empty-frame flood), protocol_error and the others for a broken peer.",
                &["reason"],
            )?,
            metrics_connections_limit: int_gauge(
                r,
                names::METRICS_CONNECTIONS_LIMIT,
                "--metrics-max-connections: open connections on the metrics listener; past it the idlest gives way.",
            )?,
            metrics_connections_shed: int_counter(
                r,
                names::METRICS_CONNECTIONS_SHED_TOTAL,
                "Metrics-listener connections closed at --metrics-max-connections: the idlest one, to make room for a new one, or the new one when every open one was in a request.",
            )?,
        })
    }
}

/// Requests and streams: in flight by phase, counted when they end, and what could not be read.
pub(super) struct Requests {
    pub(super) total: IntCounterVec,
    pub(super) in_flight: IntGaugeVec,
    /// The decode-phase child of `in_flight`, resolved once: read on every token-bearing event.
    pub(super) decoding: IntGauge,
    pub(super) parse_errors: IntCounterVec,
}

impl Requests {
    pub(super) fn register(r: &Registrar, tenant: bool) -> prometheus::Result<Self> {
        let in_flight = IntGaugeVec::new(
            Opts::new(
                names::REQUESTS_IN_FLIGHT,
                "Requests in flight: prefill (no token yet) or decode (streaming), until the stream's end marker.",
            ),
            &["phase"],
        )?;
        r.register(&in_flight)?;
        // Both phases from the start: a leak check reads 0, not a missing series.
        for p in [Phase::Prefill, Phase::Decode] {
            in_flight.with_label_values(&[p.as_str()]).set(0);
        }
        let parse_errors = counter(
            r,
            names::PARSE_ERRORS_TOTAL,
            "Parts of response bodies that could not be parsed (they are still forwarded untouched).",
            &["reason"],
        )?;
        for e in ParseError::ALL {
            parse_errors.with_label_values(&[e.as_str()]);
        }
        Ok(Requests {
            total: counter(
                r,
                names::REQUESTS_TOTAL,
                "Requests by model, HTTP status code, outcome and the API parser that ran.",
                &tenanted(&["model", "code", "outcome", "api"], tenant),
            )?,
            decoding: in_flight.with_label_values(&[Phase::Decode.as_str()]),
            in_flight,
            parse_errors,
        })
    }
}

/// Latency: the timings of each stream.
pub(super) struct Latency {
    pub(super) ttft: HistogramVec,
    pub(super) ttfb: HistogramVec,
    pub(super) first_output: HistogramVec,
    pub(super) itl: HistogramVec,
    pub(super) tpot: HistogramVec,
    pub(super) request_tps: HistogramVec,
    pub(super) duration: HistogramVec,
    pub(super) max_stall: HistogramVec,
    pub(super) bursts: IntCounterVec,
}

impl Latency {
    pub(super) fn register(r: &Registrar, b: &Buckets, tenant: bool) -> prometheus::Result<Self> {
        let m = ["model"];
        Ok(Latency {
            ttft: histogram(
                r,
                names::TIME_TO_FIRST_TOKEN_SECONDS,
                "From the request's arrival to the first token-bearing event (of any kind), by band of the prompt's tokens.",
                &tenanted(&["model", "prompt"], tenant),
                &b.ttft,
            )?,
            ttfb: histogram(
                r,
                names::TIME_TO_FIRST_BYTE_SECONDS,
                "From the request's arrival to the first byte of the response body.",
                &m,
                &b.ttft,
            )?,
            first_output: histogram(
                r,
                names::TIME_TO_FIRST_OUTPUT_SECONDS,
                "From the request's arrival to the first event of each kind of output (reasoning, content, tool_call).",
                &["model", "kind"],
                &b.ttft,
            )?,
            itl: histogram(
                r,
                names::INTER_TOKEN_LATENCY_SECONDS,
                "Gap between token-bearing events divided by the tokens the later one carries, observed once per token.",
                &m,
                &b.itl,
            )?,
            tpot: histogram(
                r,
                names::TIME_PER_OUTPUT_TOKEN_SECONDS,
                "Per request: (last token time - first token time) / (output tokens - 1).",
                &m,
                &b.itl,
            )?,
            request_tps: histogram(
                r,
                names::REQUEST_TOKENS_PER_SECOND,
                "Per request decode speed, (output tokens - 1) / decode time, by band of mean requests in flight during the decode.",
                &tenanted(&["model", "concurrency"], tenant),
                &b.tps,
            )?,
            duration: histogram(
                r,
                names::REQUEST_DURATION_SECONDS,
                "End to end: the request's arrival to the last byte of the response.",
                &m,
                &b.duration,
            )?,
            max_stall: histogram(
                r,
                names::REQUEST_MAX_STALL_SECONDS,
                "Per request: the longest gap between two token-bearing events (TTFT not counted).",
                &m,
                &b.stall,
            )?,
            bursts: counter(
                r,
                names::REQUEST_BURSTS_TOTAL,
                "Requests whose tokens all arrived faster than 50 us each with no engine-stated decode time: a burst, not a speed, left out of the tokens/s and TPOT histograms.",
                &m,
            )?,
        })
    }
}

/// Tokens: per request and in total, by kind, and where the counts came from.
pub(super) struct Tokens {
    pub(super) output: HistogramVec,
    pub(super) input: HistogramVec,
    pub(super) output_total: IntCounterVec,
    pub(super) input_total: IntCounterVec,
    pub(super) reasoning_total: IntCounterVec,
    pub(super) cached_input_total: IntCounterVec,
    pub(super) per_event: HistogramVec,
    pub(super) source: IntCounterVec,
    pub(super) tokenizer_checks: IntCounterVec,
}

impl Tokens {
    pub(super) fn register(r: &Registrar, b: &Buckets, tenant: bool) -> prometheus::Result<Self> {
        let m = ["model"];
        let source = counter(
            r,
            names::TOKEN_COUNT_SOURCE_TOTAL,
            "Requests by where their token counts came from.",
            &["source"],
        )?;
        for s in TokenSource::ALL {
            source.with_label_values(&[s.as_str()]);
        }
        Ok(Tokens {
            output: histogram(
                r,
                names::REQUEST_OUTPUT_TOKENS,
                "Output tokens per request.",
                &m,
                &b.tokens,
            )?,
            input: histogram(
                r,
                names::REQUEST_INPUT_TOKENS,
                "Prompt tokens per request (where the stream reports them).",
                &m,
                &b.tokens,
            )?,
            output_total: counter(
                r,
                names::OUTPUT_TOKENS_TOTAL,
                "Output tokens generated.",
                &tenanted(&m, tenant),
            )?,
            input_total: counter(
                r,
                names::INPUT_TOKENS_TOTAL,
                "Prompt tokens processed (where the stream reports them).",
                &tenanted(&m, tenant),
            )?,
            reasoning_total: counter(
                r,
                names::REASONING_TOKENS_TOTAL,
                "Reasoning tokens (part of the output tokens): usage's reasoning details where reported, else counted from reasoning events.",
                &tenanted(&m, tenant),
            )?,
            cached_input_total: counter(
                r,
                names::CACHED_INPUT_TOKENS_TOTAL,
                "Prompt tokens read from (read) or written to (write) the server's prompt cache, where usage reports them.",
                &tenanted(&["model", "kind"], tenant),
            )?,
            per_event: histogram(
                r,
                names::TOKENS_PER_EVENT,
                "Output tokens per token-bearing event: token ids where sent, the growth of usage repeated in every chunk, else 1.",
                &m,
                &b.per_event,
            )?,
            source,
            tokenizer_checks: counter(
                r,
                names::TOKENIZER_CHECKS_TOTAL,
                "Requests whose --tokenizer count was checked against the server's usage, by direction (input, output) and result (equal, differs).",
                &["direction", "result"],
            )?,
        })
    }
}

/// Throughput: the aggregate output rate over `--rate-window`, set when the registry is
/// gathered.
pub(super) struct Throughput {
    pub(super) output_tps: Gauge,
    pub(super) output_tps_per_gpu: Gauge,
}

impl Throughput {
    pub(super) fn register(r: &Registrar) -> prometheus::Result<Self> {
        Ok(Throughput {
            output_tps: gauge(
                r,
                names::OUTPUT_TOKENS_PER_SECOND,
                "Aggregate output tokens/s over the last --rate-window.",
            )?,
            output_tps_per_gpu: gauge(
                r,
                names::OUTPUT_TOKENS_PER_SECOND_PER_GPU,
                "tokenmeter_output_tokens_per_second / tokenmeter_gpus.",
            )?,
        })
    }
}

/// SLO: each class's objective (set once), each request's verdict, and goodput.
pub(super) struct Slo {
    pub(super) requests: IntCounterVec,
    pub(super) goodput_tokens: IntCounterVec,
}

impl Slo {
    pub(super) fn register(r: &Registrar, cfg: &MetricsConfig) -> prometheus::Result<Self> {
        let objective = GaugeVec::new(
            Opts::new(
                names::SLO_OBJECTIVE,
                "The share of an SLO class's requests that must meet its targets (--slo objective).",
            ),
            &["class"],
        )?;
        r.register(&objective)?;
        for (class, o) in &cfg.slo_objectives {
            objective.with_label_values(&[class]).set(*o);
        }
        Ok(Slo {
            requests: counter(
                r,
                names::SLO_REQUESTS_TOTAL,
                "Requests by SLO class, model, concurrency band and result (met, the first target missed, error, or the client gone first), counted once when they end.",
                &tenanted(&["class", "model", "concurrency", "result"], cfg.tenant),
            )?,
            goodput_tokens: counter(
                r,
                names::GOODPUT_OUTPUT_TOKENS_TOTAL,
                "Output tokens of requests that met their SLO class's targets.",
                &tenanted(&["class", "model"], cfg.tenant),
            )?,
        })
    }
}
