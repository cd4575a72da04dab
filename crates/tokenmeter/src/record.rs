//! The record of one finished request ([`Finished`]), built once by the meter when the request
//! ends and taken by the metrics, the capacity model's mix and every [`Sink`] (the request log,
//! the spans): what each of them knows of a request, it knows from here.
//!
//! Also what the record is made of: how the request ended ([`Outcome`]), its SLO result, its
//! cache and parse-error tallies, and the concurrency band it ran at ([`concurrency_band`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::context::Ident;
use crate::protocol::operation::Route;
use crate::protocol::timings::EngineTimings;
use crate::protocol::{Api, Stop, TokenSource};
use crate::slo::Verdict;

/// How a request ended: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream finished the response and the client received all of it.
    Complete,
    /// The client went away before the response ended.
    ClientDisconnect,
    /// The upstream could not be reached, or failed mid-response.
    UpstreamError,
    /// The upstream took longer than `--upstream-timeout` or `--idle-timeout`.
    Timeout,
    /// The proxy refused the request itself (an unreadable request body, a URI it cannot
    /// forward): a 400 that never reached the upstream.
    BadRequest,
    /// The upstream switched protocols (`101`, a WebSocket): the two connections were joined
    /// until they closed.
    Upgraded,
    /// The proxy was at `--max-in-flight` and answered 503 itself: never sent upstream.
    Shed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ClientDisconnect => "client_disconnect",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
            Outcome::BadRequest => "bad_request",
            Outcome::Upgraded => "upgraded",
            Outcome::Shed => "shed",
        }
    }
}

/// The concurrency band a (time-weighted mean) number of requests in flight falls in.
pub fn concurrency_band(mean_in_flight: f64) -> &'static str {
    const BANDS: [(f64, &str); 8] = [
        (1.5, "1"),
        (4.5, "2-4"),
        (8.5, "5-8"),
        (16.5, "9-16"),
        (32.5, "17-32"),
        (64.5, "33-64"),
        (128.5, "65-128"),
        (256.5, "129-256"),
    ];
    BANDS
        .iter()
        .find(|(upper, _)| mean_in_flight < *upper)
        .map_or("257+", |(_, band)| band)
}

/// Arrival to the first event of each [`crate::protocol::OutputKind`], in its `ALL` order.
pub type FirstOutput = [Option<Duration>; 3];

/// The record of one finished request: everything the metrics take from it, built by the meter
/// when the request ends. Durations run from the request's arrival at the proxy.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The `model` label (already bounded by `metrics::Metrics::model_label`).
    pub model: String,
    /// The status code the client got (the upstream's, or the proxy's own 400/502/504).
    pub code: u16,
    pub outcome: Outcome,
    /// The parser that read the body (`unknown`: none did, and no token metric is recorded).
    pub api: Api,
    /// Arrival to the end of the response.
    pub duration: Duration,
    /// Arrival to the first byte of the response body.
    pub first_byte: Option<Duration>,
    /// Arrival to the first and to the last token-bearing event.
    pub first_token: Option<Duration>,
    pub last_token: Option<Duration>,
    /// Arrival to the end of the step the engine was running when the request arrived, as the
    /// proxy saw it (`crate::capacity::Capacity::running_step_end`): where its own step began.
    pub running_step_end: Option<Duration>,
    /// Output tokens by the order of truth, and where the count came from.
    pub output_tokens: u64,
    pub token_source: TokenSource,
    /// Prompt tokens, where the stream reported them.
    pub input_tokens: Option<u64>,
    /// Why the model stopped, where the stream said so.
    pub stop: Option<Stop>,
    /// The time-weighted mean number of requests in flight over the decode window (from the
    /// first to the last token), when there was one.
    pub mean_in_flight: Option<f64>,
    /// Output tokens already added to `tokenmeter_output_tokens_total` while the stream ran;
    /// `record` adds only what the final count has beyond them (a counter never decreases).
    pub streamed_tokens: u64,
    /// The longest gap between two token-bearing events (TTFT not counted); `None` with fewer
    /// than two such events.
    pub max_stall: Option<Duration>,
    /// Arrival to the first event of each kind of output.
    pub first_output: FirstOutput,
    /// Reasoning tokens (part of `output_tokens`): the usage report's, else counted from
    /// reasoning events; `None` when the stream showed none.
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens read from and written to the server's prompt cache, where usage says.
    pub cached_input: CachedInput,
    /// Where the engine says the request's time went, where its stream stated it.
    pub engine: Option<EngineTimings>,
    /// What could not be parsed.
    pub parse_errors: ParseErrors,
    /// The request's SLO class and result.
    pub slo: Option<SloResult>,
    // --- for `--compat otel` ---
    /// What the request's path said: its GenAI operation and the format the path implies.
    pub route: Route,
    /// The model the request body named, as sent (bounded only when it becomes a label).
    pub request_model: Option<String>,
    /// `model` is the one the response named (not the request's fallback, nor `unknown`).
    pub model_from_response: bool,
    /// The `tenant` label (already bounded by `crate::tenant`); `None` is `metrics::NO_TENANT`.
    /// Read only when the label exists (`MetricsConfig::tenant`).
    pub tenant: Option<Arc<str>>,
    /// What the request's head said of it (method, path, request id, trace), for the request
    /// log and the span; `None` when neither is on (nothing per request is read for them).
    pub ident: Option<Arc<Ident>>,
    /// Its charge of GPU time (`crate::cost`); `None` where the request was never metered as
    /// in flight (a record built by hand).
    pub gpu_seconds: Option<crate::cost::GpuSeconds>,
    // --- for the workload trace (`--workload-log`) ---
    /// The request body's size in bytes (0 where none was read): what a prompt's length is
    /// estimated from where nothing counted it.
    pub body_bytes: u64,
    /// `input_tokens` is the tokenizer's estimate, not a count (a prompt over its size limit,
    /// or with media parts).
    pub input_estimated: bool,
    /// The prompt's blocks, each named by a hash of every token up to its end (with
    /// `--tokenizer`, when the trace asks for them); `None` otherwise.
    pub prompt_blocks: Option<Arc<[u64]>>,
}

/// What takes each [`Finished`] record: the metrics, the capacity model, the request log, the
/// span exporter, in that order (the meter's one loop, [`crate::meter::Recorder`]). Called once
/// per request, at `at` (when it ended), on the thread that finished it: an implementation
/// records, or queues (bounded), and returns.
pub trait Sink: Send + Sync {
    fn finished(&self, f: &Finished, at: Instant);
}

/// A request's SLO class and the judge's result, for `tokenmeter_slo_requests_total` and goodput.
#[derive(Debug, Clone, PartialEq)]
pub struct SloResult {
    /// The `class` label: a declared class name (see [`crate::slo::Classes`]).
    pub class: Arc<str>,
    pub verdict: Verdict,
    /// The `concurrency` band: the decode window's, else the request's whole life's.
    pub band: &'static str,
}

/// Cached prompt tokens a stream's usage reported: the `kind` label of
/// `tokenmeter_cached_input_tokens_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CachedInput {
    /// Served from the cache (OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`).
    pub read: Option<u64>,
    /// Written to the cache (Anthropic `cache_creation_input_tokens`).
    pub write: Option<u64>,
}

/// A request's parse-error tallies, by `reason`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParseErrors {
    pub line_too_long: u64,
    pub invalid_json: u64,
    pub content_encoding: u64,
}

/// The least decode time per token read as a speed: 50 µs, 20,000 tokens/s for one stream.
/// The fastest serving stacks publish about 2,000 tokens/s per stream; ten times that is no
/// decode but a burst: tokens the engine made earlier and its front end flushed at once (a
/// starved API server on a busy host does that), whose arrival says nothing of how fast they
/// were made.
pub const MIN_DECODE_PER_TOKEN: Duration = Duration::from_micros(50);

/// The decode window a request's speed is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decode {
    /// First to last token on the wire.
    Wire(Duration),
    /// The wire's window was a burst; the engine stated its own generation time (vLLM's
    /// per-request metrics, llama.cpp's and Ollama's timings), at least the floor per token.
    Engine(Duration),
    /// All tokens came faster than [`MIN_DECODE_PER_TOKEN`] each and the engine stated
    /// nothing better: no speed.
    Burst,
}

impl Finished {
    /// From the first to the last token, when both were seen.
    pub fn decode_time(&self) -> Option<Duration> {
        Some(self.last_token?.saturating_sub(self.first_token?))
    }

    /// The window a decode speed is read from, for a read stream of at least two tokens over a
    /// decode window: the wire's, unless it is shorter than [`MIN_DECODE_PER_TOKEN`] per token.
    pub fn decode(&self) -> Option<Decode> {
        let wire = self.decode_time()?;
        if self.api == Api::Unknown || self.output_tokens < 2 || wire.is_zero() {
            return None;
        }
        let floor = MIN_DECODE_PER_TOKEN.saturating_mul((self.output_tokens - 1) as u32);
        if wire >= floor {
            return Some(Decode::Wire(wire));
        }
        match self.engine.as_ref().and_then(|e| e.generation) {
            Some(stated) if stated >= floor => Some(Decode::Engine(stated)),
            _ => Some(Decode::Burst),
        }
    }

    /// Decode speed as `tokenmeter_request_tokens_per_second` observes it: (output - 1) /
    /// the decode window ([`Finished::decode`]); `None` for a burst.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let window = match self.decode()? {
            Decode::Wire(d) | Decode::Engine(d) => d,
            Decode::Burst => return None,
        };
        Some((self.output_tokens - 1) as f64 / window.as_secs_f64())
    }

    /// The concurrency band of the decode window (our own request was in flight throughout:
    /// the mean is at least 1).
    pub fn band(&self) -> &'static str {
        concurrency_band(self.mean_in_flight.unwrap_or(1.0).max(1.0))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::protocol::operation::Operation;

    /// A complete OpenAI chat request of 5 tokens: the record most tests vary.
    pub(crate) fn finished() -> Finished {
        Finished {
            model: "m".into(),
            code: 200,
            outcome: Outcome::Complete,
            api: Api::OpenAi,
            duration: Duration::from_millis(500),
            first_byte: Some(Duration::from_millis(50)),
            first_token: Some(Duration::from_millis(100)),
            last_token: Some(Duration::from_millis(300)),
            running_step_end: None,
            output_tokens: 5,
            token_source: TokenSource::Counted,
            input_tokens: Some(7),
            stop: None,
            mean_in_flight: Some(3.0),
            streamed_tokens: 0,
            max_stall: Some(Duration::from_millis(120)),
            first_output: [None, Some(Duration::from_millis(100)), None],
            reasoning_tokens: None,
            cached_input: CachedInput::default(),
            engine: None,
            parse_errors: ParseErrors::default(),
            slo: None,
            route: Route {
                operation: Some(Operation::Chat),
                api: Some(Api::OpenAi),
            },
            request_model: Some("req".into()),
            model_from_response: true,
            tenant: None,
            ident: None,
            gpu_seconds: None,
            body_bytes: 0,
            input_estimated: false,
            prompt_blocks: None,
        }
    }

    #[test]
    fn a_burst_is_no_speed_unless_the_engine_states_its_own_window() {
        use crate::protocol::timings::{EngineTimings, TimingSource};
        let f = finished();
        assert_eq!(f.decode(), Some(Decode::Wire(Duration::from_millis(200))));
        assert_eq!(f.tokens_per_second(), Some(4.0 / 0.2));
        // 58 tokens within 0.15 ms of the first: 2.6 µs each.
        let burst = Finished {
            output_tokens: 58,
            last_token: Some(Duration::from_millis(100) + Duration::from_micros(150)),
            ..finished()
        };
        assert_eq!(burst.decode(), Some(Decode::Burst));
        assert_eq!(burst.tokens_per_second(), None);
        // Exactly the floor per token is a speed.
        let edge = Finished {
            output_tokens: 11,
            last_token: Some(Duration::from_millis(100) + MIN_DECODE_PER_TOKEN * 10),
            ..finished()
        };
        assert_eq!(edge.decode(), Some(Decode::Wire(MIN_DECODE_PER_TOKEN * 10)));
        // The engine's stated generation time is used where the wire's is a burst, if it is
        // no burst itself.
        let stated = |ms: u64| {
            let mut t = EngineTimings::empty(TimingSource::Vllm);
            t.generation = Some(Duration::from_millis(ms));
            Finished {
                engine: Some(t),
                ..burst.clone()
            }
        };
        assert_eq!(
            stated(114).decode(),
            Some(Decode::Engine(Duration::from_millis(114)))
        );
        assert_eq!(stated(114).tokens_per_second(), Some(57.0 / 0.114));
        assert_eq!(stated(0).decode(), Some(Decode::Burst));
        // One token, or no window: nothing to read.
        let one = Finished {
            output_tokens: 1,
            ..finished()
        };
        assert_eq!(one.decode(), None);
    }

    #[test]
    fn bands_match_the_documented_edges() {
        let cases = [
            (1.0, "1"),
            (1.4, "1"),
            (2.0, "2-4"),
            (4.0, "2-4"),
            (5.0, "5-8"),
            (8.0, "5-8"),
            (16.0, "9-16"),
            (17.0, "17-32"),
            (64.0, "33-64"),
            (128.0, "65-128"),
            (256.0, "129-256"),
            (257.0, "257+"),
            (5000.0, "257+"),
        ];
        for (x, band) in cases {
            assert_eq!(concurrency_band(x), band, "{x}");
        }
    }
}
