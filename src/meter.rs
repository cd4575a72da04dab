//! Per-request measurement: the state machine behind every metric of a request.
//!
//! A [`Meter`] is created when a request is sent upstream ([`Recorder::start`]), is told about the
//! response ([`Meter::on_response`]), sees every body frame as it passes ([`Meter::on_data`]) and
//! is finished exactly once ([`Meter::finish`]): at the end of the stream, on an error, or, through
//! `Drop`, when the client went away. Everything is recorded at that one point, so a request is
//! counted once and the in-flight gauges can never leak.
//!
//! Times are measured from the request's arrival at the proxy (its head was read), not from the
//! moment it is sent upstream: reading the body is part of what the client waits for, and a
//! client that writes its head and body separately (httpx does) starts its own clock at the head.
//! A request leaves the in-flight gauges at its stream's end marker (`[DONE]`, `message_stop`,
//! ...) rather than at the end of the HTTP body: a client may send its next request the moment
//! it reads that marker, and counting the old one until its body's last chunk passes would show
//! more requests in flight than the client has open.
//!
//! Concurrency is measured, not sampled: [`Concurrency`] keeps the integral over time of the
//! number of requests in flight, so the mean over any request's decode window is a subtraction.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus::Histogram;

use crate::metrics::{concurrency_band, Metrics, Outcome, ParseError, Phase};
use crate::protocol::request::RequestInfo;
use crate::protocol::{self, Api, Extractor, Framing, Message};
use crate::{ndjson, sse};

/// The time integral of the number of requests in flight.
#[derive(Debug)]
pub struct Concurrency {
    state: Mutex<ConcurrencyState>,
}

#[derive(Debug)]
struct ConcurrencyState {
    origin: Instant,
    last: Instant,
    in_flight: u64,
    /// Sum of in_flight x seconds since `origin`, up to `last`.
    integral: f64,
}

impl Default for Concurrency {
    fn default() -> Self {
        let now = Instant::now();
        Concurrency {
            state: Mutex::new(ConcurrencyState {
                origin: now,
                last: now,
                in_flight: 0,
                integral: 0.0,
            }),
        }
    }
}

/// The concurrency tracker's state at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// The instant the integral runs to: the time asked for, or a later one when another
    /// request had already moved the tracker past it (the clock is read before the lock).
    pub at: Instant,
    /// Requests x seconds up to `at`.
    pub integral: f64,
    /// Requests in flight at `at`.
    pub in_flight: u64,
}

impl Snapshot {
    /// The time-weighted mean number of requests in flight from `self` to `later`. Both ends
    /// use the tracker's own instants: mixing the caller's clock readings with integrals that
    /// ran to a later instant made short (bursty) windows look idle. A window of no length has
    /// the number in flight at its end.
    pub fn mean_until(&self, later: &Snapshot) -> f64 {
        let span = later.at.saturating_duration_since(self.at).as_secs_f64();
        if span > 0.0 {
            (later.integral - self.integral) / span
        } else {
            later.in_flight as f64
        }
    }
}

impl Concurrency {
    fn update(&self, now: Instant, delta: i64) -> Snapshot {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = now.max(s.last);
        s.integral += s.in_flight as f64 * (now - s.last).as_secs_f64();
        s.last = now;
        s.in_flight = s.in_flight.saturating_add_signed(delta);
        Snapshot {
            at: now,
            integral: s.integral,
            in_flight: s.in_flight,
        }
    }

    /// The tracker at `now` (or just after, see [`Snapshot::at`]).
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        self.update(now, 0)
    }

    /// Requests in flight right now.
    pub fn current(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_flight
    }

    /// Seconds since this tracker was created (for rates over its whole life).
    pub fn age(&self, now: Instant) -> f64 {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        now.saturating_duration_since(s.origin).as_secs_f64()
    }
}

/// What every meter shares: the metrics, the concurrency tracker and the parsing limits.
pub struct Recorder {
    pub metrics: Arc<Metrics>,
    pub concurrency: Concurrency,
    /// `--max-line-bytes`: the longest line (or JSON body) kept for parsing.
    pub max_line: usize,
    /// `--api`: the wire format every response is read as (`None`: detected per response).
    pub api: Option<Api>,
}

impl Recorder {
    pub fn new(metrics: Arc<Metrics>, max_line: usize) -> Self {
        Recorder {
            metrics,
            concurrency: Concurrency::default(),
            max_line,
            api: None,
        }
    }

    /// Reads every response as `api` instead of detecting its format (`--api`).
    pub fn with_api(mut self, api: Option<Api>) -> Self {
        self.api = api;
        self
    }

    /// A request that arrived just now is being sent upstream.
    pub fn start(self: &Arc<Self>, request: RequestInfo) -> Meter {
        self.start_at(request, Instant::now())
    }

    /// A request that arrived at `arrived` is being sent upstream now.
    pub fn start_at(self: &Arc<Self>, request: RequestInfo, arrived: Instant) -> Meter {
        let now = Instant::now();
        self.metrics.phase(Phase::Prefill, 1);
        self.concurrency.update(now, 1);
        Meter {
            recorder: Arc::clone(self),
            decoder: Decoder::Opaque,
            stream: Stream {
                request,
                start: arrived.min(now),
                status: 0,
                extractor: Box::new(protocol::Opaque::default()),
                model: None,
                itl: None,
                first_byte: None,
                first_token: None,
                last_token: None,
                at_first: None,
                at_last: None,
                counted: 0,
                left: false,
            },
            finished: false,
        }
    }
}

enum Decoder {
    Sse(sse::Decoder),
    Ndjson(ndjson::Decoder),
    /// A whole JSON document, kept up to the line limit and parsed once at the end.
    Json {
        body: Vec<u8>,
        overflow: bool,
    },
    Opaque,
}

/// What is known about the response so far (everything but the decoder, so the decoder's
/// callback can borrow it).
struct Stream {
    request: RequestInfo,
    /// When the request arrived at the proxy.
    start: Instant,
    status: u16,
    extractor: Box<dyn Extractor>,
    /// The `model` label, fixed at the first token so live and final observations agree.
    model: Option<String>,
    itl: Option<Histogram>,
    first_byte: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The concurrency tracker at the first and at the latest token.
    at_first: Option<Snapshot>,
    at_last: Option<Snapshot>,
    /// Output tokens counted from events so far.
    counted: u64,
    /// The request has left the in-flight gauges (at its end marker, or when finished).
    left: bool,
}

/// The measurement of one request.
pub struct Meter {
    recorder: Arc<Recorder>,
    decoder: Decoder,
    stream: Stream,
    finished: bool,
}

impl Meter {
    /// The response head arrived: choose how to read the body.
    pub fn on_response(&mut self, status: u16, path: &str, content_type: &str, encoded: bool) {
        self.stream.status = status;
        if encoded {
            // A compressed body cannot be read without decompressing it; we forward it untouched.
            self.recorder
                .metrics
                .parse_error(ParseError::ContentEncoding, 1);
            return;
        }
        let (framing, extractor) = protocol::select(path, content_type, self.recorder.api);
        let max = self.recorder.max_line;
        self.decoder = match framing {
            Framing::Sse => Decoder::Sse(sse::Decoder::new(max)),
            Framing::Ndjson => Decoder::Ndjson(ndjson::Decoder::new(max)),
            Framing::Json => Decoder::Json {
                body: Vec::new(),
                overflow: false,
            },
            Framing::Opaque => Decoder::Opaque,
        };
        self.stream.extractor = extractor;
    }

    /// The upstream answered with an error we generated ourselves (502/504): no response head.
    pub fn set_status(&mut self, status: u16) {
        self.stream.status = status;
    }

    /// A body frame is passing through to the client now.
    pub fn on_data(&mut self, data: &[u8], now: Instant) {
        if data.is_empty() {
            return;
        }
        let (stream, rec) = (&mut self.stream, &*self.recorder);
        stream.first_byte.get_or_insert(now);
        let mut on = |msg: Message<'_>| stream.on_message(rec, &msg, now);
        match &mut self.decoder {
            Decoder::Sse(d) => d.feed(data, &mut on),
            Decoder::Ndjson(d) => d.feed(data, &mut on),
            Decoder::Json { body, overflow } => {
                if *overflow {
                } else if body.len() + data.len() > rec.max_line {
                    *overflow = true;
                    *body = Vec::new();
                } else {
                    body.extend_from_slice(data);
                }
            }
            Decoder::Opaque => {}
        }
        if !self.stream.left && self.stream.extractor.summary().ended {
            self.leave(now);
        }
    }

    /// The upstream switched protocols (`101`): what follows is no inference stream. The
    /// request leaves the in-flight gauges now, so a WebSocket held open for an hour does not
    /// count as an hour-long prefill nor weigh on the concurrency of the requests beside it;
    /// [`Meter::finish`] with [`Outcome::Upgraded`] records it when the connection closes.
    pub fn upgraded(&mut self, now: Instant) {
        self.stream.status = 101;
        self.leave(now);
    }

    /// Takes the request out of the in-flight gauges, once.
    fn leave(&mut self, now: Instant) {
        if std::mem::replace(&mut self.stream.left, true) {
            return;
        }
        let phase = if self.stream.first_token.is_some() {
            Phase::Decode
        } else {
            Phase::Prefill
        };
        self.recorder.metrics.phase(phase, -1);
        self.recorder.concurrency.update(now, -1);
    }

    /// Ends the measurement and records it. Later calls do nothing.
    pub fn finish(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let now = Instant::now();
        // The wall clock beside `now`, read only for the per-request debug line.
        let wall = tracing::enabled!(tracing::Level::DEBUG).then(SystemTime::now);
        self.flush(outcome == Outcome::Complete, now);
        // Leave the in-flight gauges first: nothing below may return before this.
        self.leave(now);
        // A client may hang up once the stream's own end marker has passed, before the HTTP
        // body's end (GuideLLM stops reading at `[DONE]`): it received the whole response.
        let outcome =
            if outcome == Outcome::ClientDisconnect && self.stream.extractor.summary().ended {
                Outcome::Complete
            } else {
                outcome
            };
        let rec = &*self.recorder;
        let m = &rec.metrics;
        let s = &self.stream;

        let api = s.extractor.api();
        let summary = s.extractor.summary();
        let model = s.model.clone().unwrap_or_else(|| s.model_label(rec));
        let code = if s.status == 0 { 502 } else { s.status };
        m.count_request(&model, code, outcome, api);
        // Never the body, the path or headers: only bounded, non-secret facts.
        tracing::debug!(
            code,
            outcome = outcome.as_str(),
            api = api.as_str(),
            model = %model,
            duration_ms = (now - s.start).as_millis() as u64,
            "request finished"
        );
        m.parse_error(ParseError::InvalidJson, summary.malformed);
        m.parse_error(ParseError::LineTooLong, self.decoder.errors());
        m.duration
            .with_label_values(&[&model])
            .observe((now - s.start).as_secs_f64());
        if let Some(fb) = s.first_byte {
            m.ttfb
                .with_label_values(&[&model])
                .observe((fb - s.start).as_secs_f64());
        }
        if api == Api::Unknown {
            return;
        }

        let (output, source) = summary.output(s.counted);
        if output > s.counted {
            // The usage report corrects the windowed rate for tokens no event showed.
            m.rate.add(output - s.counted, now);
        }
        m.token_source.with_label_values(&[source.as_str()]).inc();
        m.output_tokens_total
            .with_label_values(&[&model])
            .inc_by(output);
        m.output_tokens
            .with_label_values(&[&model])
            .observe(output as f64);
        if let Some(input) = summary.input_tokens {
            m.input_tokens_total
                .with_label_values(&[&model])
                .inc_by(input);
            m.input_tokens
                .with_label_values(&[&model])
                .observe(input as f64);
        }
        if let (Some(first), Some(last)) = (s.first_token, s.last_token) {
            let decode = (last - first).as_secs_f64();
            if output >= 2 && decode > 0.0 {
                let mean = match (&s.at_first, &s.at_last) {
                    (Some(a), Some(b)) => a.mean_until(b),
                    _ => 1.0,
                };
                // Our own request was in flight throughout: the mean is at least 1.
                let band = concurrency_band(mean.max(1.0));
                // `last_token_unix_ms` places the decode window on the wall clock, read beside
                // `now` (the line's own timestamp comes later, by however long the thread was
                // preempted in between).
                let last_token_unix_ms = wall
                    .and_then(|w| w.checked_sub(now - last))
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0.0, |d| d.as_secs_f64() * 1e3);
                tracing::debug!(
                    output,
                    ttft_ms = (first - s.start).as_secs_f64() * 1e3,
                    decode_ms = decode * 1e3,
                    last_token_unix_ms,
                    mean_in_flight = mean,
                    band,
                    "request decoded"
                );
                m.tpot
                    .with_label_values(&[&model])
                    .observe(decode / (output - 1) as f64);
                m.request_tps
                    .with_label_values(&[&model, band])
                    .observe((output - 1) as f64 / decode);
            }
        }
    }

    /// Completes the decoder's pending input at the end of the body.
    fn flush(&mut self, complete: bool, now: Instant) {
        let (stream, rec) = (&mut self.stream, &*self.recorder);
        let mut on = |msg: Message<'_>| stream.on_message(rec, &msg, now);
        match &mut self.decoder {
            // A body cut short ends in a fragment of a line: not an event, and not malformed.
            Decoder::Sse(d) if complete => d.finish(&mut on),
            Decoder::Ndjson(d) if complete => d.finish(&mut on),
            Decoder::Sse(_) | Decoder::Ndjson(_) => {}
            Decoder::Json { body, overflow } => {
                if *overflow {
                    rec.metrics.parse_error(ParseError::LineTooLong, 1);
                } else if complete && !body.is_empty() {
                    // A non-streaming response: its tokens count, but it has no first token.
                    let n = stream.extractor.on_message(&Message {
                        event: "",
                        data: body,
                    });
                    stream.counted += u64::from(n);
                    rec.metrics.rate.add(u64::from(n), now);
                }
            }
            Decoder::Opaque => {}
        }
    }
}

impl Decoder {
    fn errors(&self) -> u64 {
        match self {
            Decoder::Sse(d) => d.errors().line_too_long,
            Decoder::Ndjson(d) => d.errors().line_too_long,
            _ => 0,
        }
    }
}

impl Stream {
    fn model_label(&self, rec: &Recorder) -> String {
        let named = self.extractor.summary().model.as_deref();
        rec.metrics
            .models
            .label(named.or(self.request.model.as_deref()))
    }

    fn on_message(&mut self, rec: &Recorder, msg: &Message<'_>, now: Instant) {
        let tokens = self.extractor.on_message(msg);
        if tokens == 0 {
            return;
        }
        let m = &rec.metrics;
        match self.last_token {
            None => {
                let model = self.model_label(rec);
                m.ttft
                    .with_label_values(&[&model])
                    .observe((now - self.start).as_secs_f64());
                self.itl = Some(m.itl.with_label_values(&[&model]));
                self.model = Some(model);
                self.first_token = Some(now);
                self.at_first = Some(rec.concurrency.snapshot(now));
                // A token after the end marker (a broken upstream) must not re-enter the gauges.
                if !self.left {
                    m.phase(Phase::Prefill, -1);
                    m.phase(Phase::Decode, 1);
                }
            }
            Some(last) => {
                // Spread the gap over the tokens this event carries, observed once per token.
                if let Some(h) = &self.itl {
                    let per_token = (now - last).as_secs_f64() / f64::from(tokens);
                    for _ in 0..tokens {
                        h.observe(per_token);
                    }
                }
            }
        }
        self.last_token = Some(now);
        self.at_last = Some(rec.concurrency.snapshot(now));
        self.counted += u64::from(tokens);
        m.rate.add(u64::from(tokens), now);
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        // Dropped before finishing: the client went away (hyper drops the body, or the whole
        // service future before the response head).
        self.finish(Outcome::ClientDisconnect);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::MetricsConfig;

    fn recorder() -> Arc<Recorder> {
        let m = Metrics::new(&MetricsConfig::default()).expect("metrics");
        Arc::new(Recorder::new(Arc::new(m), 1 << 20))
    }

    fn sample(rec: &Recorder, line_start: &str) -> f64 {
        let text = String::from_utf8(rec.metrics.render()).expect("utf-8");
        text.lines()
            .filter(|l| l.starts_with(line_start))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    const CHUNK: &str = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

    #[test]
    fn tokens_ttft_and_itl_follow_the_event_times() {
        let rec = recorder();
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        let t0 = meter.stream.start;
        // Three events, the middle one split across two frames.
        let (a, b) = CHUNK.split_at(20);
        meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(100));
        meter.on_data(a.as_bytes(), t0 + Duration::from_millis(110));
        meter.on_data(b.as_bytes(), t0 + Duration::from_millis(120));
        meter.on_data(CHUNK.as_bytes(), t0 + Duration::from_millis(140));
        assert_eq!(
            sample(&rec, "tokenmeter_requests_in_flight{phase=\"decode\"}"),
            1.0
        );
        meter.finish(Outcome::Complete);
        let ttft = sample(&rec, "tokenmeter_time_to_first_token_seconds_sum");
        assert!((ttft - 0.1).abs() < 1e-9, "{ttft}");
        let itl = sample(&rec, "tokenmeter_inter_token_latency_seconds_sum");
        assert!((itl - 0.04).abs() < 1e-9, "{itl}");
        assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 3.0);
        // (3 - 1) tokens over 40 ms of decode.
        let tps = sample(&rec, "tokenmeter_request_tokens_per_second_sum");
        assert!((tps - 50.0).abs() < 1e-6, "{tps}");
        assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    }

    // Regression: behind a real vLLM, GuideLLM closed 3 of 99 completed streams right after
    // `data: [DONE]`, before the chunked terminator, and they were counted as client_disconnect.
    #[test]
    fn a_client_that_leaves_after_done_got_a_complete_response() {
        let rec = recorder();
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        meter.on_data(CHUNK.as_bytes(), Instant::now());
        meter.on_data(b"data: [DONE]\n\n", Instant::now());
        drop(meter);
        let complete = "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"complete\"}";
        assert_eq!(sample(&rec, complete), 1.0);
        assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 1.0);

        // Before the end marker, leaving is still a disconnect.
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        meter.on_data(CHUNK.as_bytes(), Instant::now());
        drop(meter);
        let cut = "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"client_disconnect\"}";
        assert_eq!(sample(&rec, cut), 1.0);
        assert_eq!(sample(&rec, complete), 1.0);
    }

    // Regression: behind a real vLLM at concurrency 16, GuideLLM sent its next request as soon as
    // it read `[DONE]`, before the old body's last chunk reached us, and the gauge showed 17.
    #[test]
    fn a_request_leaves_the_in_flight_gauges_at_its_end_marker() {
        let rec = recorder();
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        meter.on_data(CHUNK.as_bytes(), Instant::now());
        assert_eq!(rec.concurrency.current(), 1);
        meter.on_data(b"data: [DONE]\n\n", Instant::now());
        assert_eq!(rec.concurrency.current(), 0);
        assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
        // Finishing later must not leave a second time.
        meter.finish(Outcome::Complete);
        assert_eq!(rec.concurrency.current(), 0);
        assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
        let other = rec.start(RequestInfo::default());
        assert_eq!(rec.concurrency.current(), 1);
        assert_eq!(
            sample(&rec, "tokenmeter_requests_in_flight{phase=\"prefill\"}"),
            1.0
        );
        drop(other);
        assert_eq!(rec.concurrency.current(), 0);

        // A broken upstream sends a token after its end marker: the gauges stay balanced.
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        let role = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        meter.on_data(role.as_bytes(), Instant::now());
        meter.on_data(b"data: [DONE]\n\n", Instant::now());
        assert_eq!(rec.concurrency.current(), 0);
        let by_phase = |rec: &Recorder| {
            ["prefill", "decode"].map(|p| {
                sample(
                    rec,
                    &format!("tokenmeter_requests_in_flight{{phase=\"{p}\"}}"),
                )
            })
        };
        meter.on_data(CHUNK.as_bytes(), Instant::now());
        assert_eq!(by_phase(&rec), [0.0, 0.0]);
        drop(meter);
        assert_eq!(by_phase(&rec), [0.0, 0.0]);
        assert_eq!(rec.concurrency.current(), 0);
    }

    #[test]
    fn times_run_from_the_requests_arrival() {
        let rec = recorder();
        let arrived = Instant::now();
        let mut meter = rec.start_at(RequestInfo::default(), arrived);
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        meter.on_data(CHUNK.as_bytes(), arrived + Duration::from_millis(250));
        meter.finish(Outcome::Complete);
        let ttft = sample(&rec, "tokenmeter_time_to_first_token_seconds_sum");
        assert!((ttft - 0.25).abs() < 1e-9, "{ttft}");
    }

    #[test]
    fn a_stream_cut_mid_line_is_a_disconnect_not_malformed_input() {
        let rec = recorder();
        let mut meter = rec.start(RequestInfo::default());
        meter.on_response(200, "/v1/chat/completions", "text/event-stream", false);
        let now = Instant::now();
        meter.on_data(CHUNK.as_bytes(), now);
        meter.on_data(&CHUNK.as_bytes()[..30], now);
        drop(meter);
        assert_eq!(
            sample(&rec, "tokenmeter_requests_total{api=\"openai\",code=\"200\",model=\"m\",outcome=\"client_disconnect\"}"),
            1.0
        );
        assert_eq!(
            sample(
                &rec,
                "tokenmeter_parse_errors_total{reason=\"invalid_json\"}"
            ),
            0.0
        );
        assert_eq!(sample(&rec, "tokenmeter_output_tokens_total"), 1.0);
        assert_eq!(sample(&rec, "tokenmeter_requests_in_flight"), 0.0);
    }

    #[test]
    fn usage_wins_over_counted_events_and_feeds_the_rate() {
        let rec = recorder();
        let mut meter = rec.start(RequestInfo {
            model: Some("asked".into()),
            ..RequestInfo::default()
        });
        meter.on_response(200, "/v1/completions", "text/event-stream", false);
        let now = Instant::now();
        meter.on_data(b"data: {\"choices\":[{\"text\":\"ab\"}]}\n\n", now);
        meter.on_data(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n",
            now,
        );
        meter.finish(Outcome::Complete);
        assert_eq!(
            sample(&rec, "tokenmeter_output_tokens_total{model=\"asked\"}"),
            7.0
        );
        assert_eq!(
            sample(
                &rec,
                "tokenmeter_token_count_source_total{source=\"usage\"}"
            ),
            1.0
        );
        // All 7 tokens reach the windowed rate, not just the one event.
        assert!((rec.metrics.rate.rate(Instant::now()) - 0.7).abs() < 1e-9);
    }

    #[test]
    fn concurrency_integral_is_exact() {
        let c = Concurrency::default();
        let t0 = Instant::now();
        c.update(t0, 1);
        c.update(t0 + Duration::from_secs(1), 1);
        c.update(t0 + Duration::from_secs(3), -2);
        // 1 request for 1 s, then 2 for 2 s, then none.
        let i = c.snapshot(t0 + Duration::from_secs(10)).integral;
        assert!((i - 5.0).abs() < 1e-9, "{i}");
        assert_eq!(c.current(), 0);
    }

    // Regression: behind a real vLLM at concurrency 16, a response whose tokens arrived in a
    // burst landed in band `1`. Its clock readings were older than the tracker's latest update,
    // so both integrals ran to the same later instant: no area over a non-zero decode time.
    #[test]
    fn a_window_read_behind_the_trackers_clock_keeps_its_concurrency() {
        let c = Concurrency::default();
        let t0 = Instant::now();
        for _ in 0..16 {
            c.update(t0, 1);
        }
        // Another request moved the tracker to t0 + 10 ms before our two readings were taken.
        c.update(t0 + Duration::from_millis(10), -1);
        c.update(t0 + Duration::from_millis(10), 1);
        let first = c.snapshot(t0 + Duration::from_millis(2));
        let last = c.snapshot(t0 + Duration::from_millis(3));
        assert_eq!(first.mean_until(&last), 16.0);
        // An ordinary window: 16 for 10 ms, then 8 for 10 ms.
        let later = {
            for _ in 0..8 {
                c.update(t0 + Duration::from_millis(20), -1);
            }
            c.snapshot(t0 + Duration::from_millis(30))
        };
        let m = first.mean_until(&later);
        assert!((m - 12.0).abs() < 1e-9, "{m}");
    }
}
