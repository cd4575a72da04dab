//! vLLM's names for what tokenmeter measures on the wire: `--compat vllm`.
//!
//! Teams that already run vLLM's Grafana dashboards and alerts, the Gateway API Inference
//! Extension's endpoint picker or KEDA triggers read series such as
//! `vllm:time_to_first_token_seconds{model_name}`. With `--compat vllm` tokenmeter exports them
//! too, in front of any server (llama.cpp, Ollama, TGI, a hosted API), beside its own
//! `tokenmeter_*` series, with vLLM's label names (`model_name`, plus `engine="tokenmeter"`
//! where vLLM puts its engine index) and vLLM's bucket boundaries (vLLM's
//! `vllm/v1/metrics/loggers.py`; its length histograms stop at the model's context length,
//! which the wire does not say, so ours use `--buckets-tokens`).
//!
//! Only what the wire shows is exported. KV-cache usage, prefix-cache hits and preemptions
//! happen inside the engine: those series are absent, not faked. The split of the wait before
//! the first token into queue and prefill is inside the engine too, but an engine may state it
//! in the stream ([`crate::protocol::timings`]): `vllm:request_queue_time_seconds` and
//! `vllm:request_prefill_time_seconds` are observed from the stated values, for the requests
//! whose stream states them, and absent otherwise. Definitions follow vLLM's where the wire allows
//! (docs/definitions.md has them side by side with tokenmeter's, OpenTelemetry's, GuideLLM's
//! and vLLM bench's):
//! - TTFT and e2e latency run from the request's arrival at the proxy (vLLM: at its API server);
//! - inter-token latency is one observation per token-bearing event, the gap since the previous
//!   one (vLLM: one per engine step that produced tokens for the request);
//! - time per output token is decode time / (output tokens - 1), and 0 for a one-token answer,
//!   observed for every request that produced a token, as vLLM does;
//! - generation tokens are counted as they stream, as vLLM counts them at every engine step
//!   (`VllmLive::generation`), and settled to the final count when the request ends;
//! - "running" is a request whose tokens are streaming, "waiting" one sent upstream that has no
//!   token yet: the engine's queue and its prefill together.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::registrar::{counter, histogram, Registrar};
use super::Buckets;
use crate::protocol::Stop;
use crate::record::{Finished, Outcome};

/// The `engine` label's value: where vLLM names its engine index, we name ourselves.
pub const ENGINE: &str = "tokenmeter";

/// vLLM's label names on every series.
const LABELS: [&str; 2] = ["model_name", "engine"];

/// vLLM's `finished_reason` values (`FinishReason` in vLLM's `v1/engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedReason {
    /// The model ended its answer (end-of-sequence, a stop string, a tool call).
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The client went away, or the proxy's timeout ended the stream.
    Abort,
    /// The upstream failed.
    Error,
}

impl FinishedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishedReason::Stop => "stop",
            FinishedReason::Length => "length",
            FinishedReason::Abort => "abort",
            FinishedReason::Error => "error",
        }
    }

    /// A finished request's reason: the stream's own word when it ended normally (a complete
    /// response that names none ended by itself: `stop`), else how the request ended. `None`
    /// for requests that never reached an engine (the proxy's own 400, a request shed) or were no inference
    /// (an upgraded connection).
    pub fn of(outcome: Outcome, stop: Option<Stop>) -> Option<FinishedReason> {
        match outcome {
            Outcome::Complete => Some(match stop {
                Some(Stop::Length) => FinishedReason::Length,
                Some(Stop::Stop) | None => FinishedReason::Stop,
            }),
            Outcome::ClientDisconnect | Outcome::Timeout => Some(FinishedReason::Abort),
            Outcome::UpstreamError => Some(FinishedReason::Error),
            Outcome::BadRequest | Outcome::Upgraded | Outcome::Shed => None,
        }
    }
}

/// The vLLM-named families, registered in the same registry as tokenmeter's own.
pub(super) struct Vllm {
    ttft: HistogramVec,
    itl: HistogramVec,
    tpot: HistogramVec,
    e2e: HistogramVec,
    decode: HistogramVec,
    queue: HistogramVec,
    prefill: HistogramVec,
    prompt_tokens: HistogramVec,
    generation_tokens: HistogramVec,
    prompt_total: IntCounterVec,
    generation_total: IntCounterVec,
    success: IntCounterVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    /// `vllm:kv_cache_usage_perc` from the wire's view, where the cache's size is known.
    kv_usage: prometheus::GaugeVec,
}

/// One request's live vLLM handles (TTFT, ITL), resolved with the request's `ModelMetrics`.
#[derive(Clone)]
pub(super) struct VllmLive {
    pub ttft: Histogram,
    pub itl: Histogram,
    /// `vllm:num_requests_running` of this model: a request decodes under the model its
    /// stream named, as its TTFT is labelled.
    pub running: IntGauge,
    /// `vllm:generation_tokens_total` of this model, moved by every token-bearing event.
    pub generation: IntCounter,
}

/// One request's vLLM in-flight gauges: waiting under the model the request named, running
/// under the one its stream named (see `InFlight::decoding`).
#[derive(Clone)]
pub(super) struct VllmInFlight {
    pub running: IntGauge,
    pub waiting: IntGauge,
}

fn gauge_vec(r: &Registrar, name: &str, help: &str) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), &LABELS)?;
    r.register(&g)?;
    Ok(g)
}

impl Vllm {
    pub(super) fn new(r: &Registrar, b: &Buckets) -> prometheus::Result<Self> {
        let l = &LABELS;
        Ok(Vllm {
            ttft: histogram(
                r,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds (tokenmeter: from the request's arrival at the proxy).",
                l,
                &b.ttft,
            )?,
            itl: histogram(
                r,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds (tokenmeter: the gap before each token-bearing event).",
                l,
                &b.itl,
            )?,
            tpot: histogram(
                r,
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request: decode time / (output tokens - 1).",
                l,
                &b.itl,
            )?,
            e2e: histogram(
                r,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds (tokenmeter: arrival to the last byte).",
                l,
                &b.duration,
            )?,
            decode: histogram(
                r,
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request (first to last token).",
                l,
                &b.duration,
            )?,
            queue: histogram(
                r,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request (as the engine's stream states it).",
                l,
                &b.duration,
            )?,
            prefill: histogram(
                r,
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request (as the engine's stream states it).",
                l,
                &b.duration,
            )?,
            prompt_tokens: histogram(
                r,
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed (where the stream reports them).",
                l,
                &b.tokens,
            )?,
            generation_tokens: histogram(
                r,
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                l,
                &b.tokens,
            )?,
            prompt_total: counter(
                r,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed (where the stream reports them), counted when a request ends.",
                l,
            )?,
            generation_total: counter(
                r,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed, counted as they stream.",
                l,
            )?,
            success: counter(
                r,
                "vllm:request_success_total",
                "Count of successfully processed requests, by finished_reason.",
                &["model_name", "engine", "finished_reason"],
            )?,
            running: gauge_vec(
                r,
                "vllm:num_requests_running",
                "Number of requests streaming tokens (decoding) through the proxy.",
            )?,
            waiting: gauge_vec(
                r,
                "vllm:num_requests_waiting",
                "Number of requests sent upstream with no token yet (the engine's queue and prefill together).",
            )?,
            kv_usage: {
                let g = prometheus::GaugeVec::new(
                    Opts::new(
                        "vllm:kv_cache_usage_perc",
                        "KV-cache usage (1 = full) from the wire's view: tokenmeter_kv_cache_wire_tokens over the known cache size (--kv-cache-tokens or the engine's).",
                    ),
                    &LABELS,
                )?;
                r.register(&g)?;
                g
            },
        })
    }

    /// Sets `vllm:kv_cache_usage_perc` (`None`: the cache's size is not known; absent). The
    /// cache is the engine's, not a model's; vLLM labels it with the model it serves, and its
    /// dashboard selects by `model_name`, so it is set under every model the running and waiting
    /// gauges know (a bounded set: the `model` label's).
    pub(super) fn kv_usage(&self, usage: Option<f64>) {
        self.kv_usage.reset();
        let Some(u) = usage else { return };
        let mut models: Vec<String> = Vec::new();
        let families = [
            prometheus::core::Collector::collect(&self.running),
            prometheus::core::Collector::collect(&self.waiting),
        ];
        for family in families.iter().flatten() {
            for m in family.get_metric() {
                for l in m.get_label() {
                    if l.name() == "model_name" && !models.iter().any(|x| x == l.value()) {
                        models.push(l.value().to_string());
                    }
                }
            }
        }
        for model in models {
            self.kv_usage
                .with_label_values(&[model.as_str(), ENGINE])
                .set(u.clamp(0.0, 1.0));
        }
    }

    pub(super) fn live(&self, model: &str) -> VllmLive {
        VllmLive {
            ttft: self.ttft.with_label_values(&[model, ENGINE]),
            itl: self.itl.with_label_values(&[model, ENGINE]),
            running: self.running.with_label_values(&[model, ENGINE]),
            generation: self.generation_total.with_label_values(&[model, ENGINE]),
        }
    }

    pub(super) fn in_flight(&self, model: &str) -> VllmInFlight {
        VllmInFlight {
            running: self.running.with_label_values(&[model, ENGINE]),
            waiting: self.waiting.with_label_values(&[model, ENGINE]),
        }
    }

    /// Records one finished request that a parser read.
    pub(super) fn record(&self, f: &Finished) {
        let Some(reason) = FinishedReason::of(f.outcome, f.stop) else {
            return;
        };
        let l = [f.model.as_str(), ENGINE];
        self.success
            .with_label_values(&[l[0], l[1], reason.as_str()])
            .inc();
        self.e2e
            .with_label_values(&l)
            .observe(f.duration.as_secs_f64());
        if let Some(t) = &f.engine {
            for (h, stated) in [(&self.queue, t.queue), (&self.prefill, t.prefill)] {
                if let Some(d) = stated {
                    h.with_label_values(&l).observe(d.as_secs_f64());
                }
            }
        }
        let output = f.output_tokens;
        // Counted as they streamed (`VllmLive::generation`); the final count settles the rest,
        // as for `tokenmeter_output_tokens_total`: what is missing is added, nothing taken back.
        self.generation_total
            .with_label_values(&l)
            .inc_by(output.saturating_sub(f.streamed_tokens));
        self.generation_tokens
            .with_label_values(&l)
            .observe(output as f64);
        if let Some(input) = f.input_tokens {
            self.prompt_total.with_label_values(&l).inc_by(input);
            self.prompt_tokens
                .with_label_values(&l)
                .observe(input as f64);
        }
        if let Some(decode) = f.decode_time() {
            let decode = decode.as_secs_f64();
            self.decode.with_label_values(&l).observe(decode);
            let tpot = if output >= 2 {
                decode / (output - 1) as f64
            } else {
                0.0
            };
            self.tpot.with_label_values(&l).observe(tpot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_finished_reason_follows_the_stream_then_the_outcome() {
        use FinishedReason as R;
        let cases = [
            (Outcome::Complete, None, Some(R::Stop)),
            (Outcome::Complete, Some(Stop::Stop), Some(R::Stop)),
            (Outcome::Complete, Some(Stop::Length), Some(R::Length)),
            (
                Outcome::ClientDisconnect,
                Some(Stop::Length),
                Some(R::Abort),
            ),
            (Outcome::Timeout, None, Some(R::Abort)),
            (Outcome::UpstreamError, None, Some(R::Error)),
            (Outcome::BadRequest, None, None),
            (Outcome::Upgraded, None, None),
        ];
        for (outcome, stop, want) in cases {
            assert_eq!(
                FinishedReason::of(outcome, stop),
                want,
                "{outcome:?} {stop:?}"
            );
        }
    }
}
