//! Per-request timing: the state machine that turns what a response's body says into one
//! [`Finished`] record.
//!
//! A [`Meter`] is created when a request's head arrives ([`Recorder::receive`]), is sent with
//! what its body said ([`Meter::send`]), is told about the response ([`Meter::on_response`]),
//! sees every body frame as it passes ([`Meter::on_data`]) and ends once, when [`Meter::finish`] consumes it: the tap calls it at the end of the stream,
//! on an error, on the idle timeout, or when the client went away. A request is recorded there
//! and only there, so it is counted once and the in-flight gauges can never leak. Decoding is the
//! [`Reader`]'s: the meter hands it bytes and times the token-bearing events it returns.
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

pub mod concurrency;
pub mod counting;
pub mod settings;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use self::concurrency::{Concurrency, Snapshot};
pub use self::counting::Counting;
use self::counting::{Mismatches, Settled};
pub use self::settings::{Settings, DEFAULT_MAX_LINE_BYTES};
use crate::capacity::{intake, Capacity, StreamGaps};
use crate::context::{Ident, Identify};
use crate::cost::{GpuSeconds, Held, Labels, Ledger, Prompt, Ticket};
use crate::metrics::{InFlight, Metrics, ModelMetrics, Phase};
use crate::protocol::detect;
use crate::protocol::operation::{Operation, Route};
use crate::protocol::request::RequestInfo;
use crate::protocol::{Api, OutputKind};
use crate::read::{Event, Reader};
use crate::record::{
    concurrency_band, CachedInput, Finished, FirstOutput, Outcome, ParseErrors, Sink, SloResult,
};
use crate::slo::{self, Choice, Classes};
use crate::tenant::Tenants;

/// What every meter shares: the metrics, the concurrency tracker and the parsing limits.
pub struct Recorder {
    metrics: Arc<Metrics>,
    /// The live capacity model the meter feeds (the server's); `None`: nothing is modelled.
    capacity: Option<Arc<Capacity>>,
    concurrency: Arc<Concurrency>,
    /// The GPUs' time, split among the requests in flight as it is spent (`crate::cost`).
    ledger: Arc<Ledger>,
    /// `--max-line-bytes` and `--api`: how responses are read.
    reading: Settings,
    /// The SLO class table (`--slo`): a request is in its default class until told otherwise.
    classes: Arc<Classes>,
    /// The `tenant` label's resolver (`--tenant-header`, `--tenant-from-key`); `None`: no label.
    tenants: Option<Arc<Tenants>>,
    /// Reads each request's [`Ident`] off its head; `None` when nothing takes it (no request
    /// log, no span export): then no request pays for it.
    identify: Option<Identify>,
    /// What takes each finished record, in order: the metrics, the capacity model, the request
    /// log, the spans. The meter's work ends in one loop over them.
    sinks: Vec<Arc<dyn Sink>>,
    /// With `--tokenizer`: the warning that its counts differ from the server's, rate-limited.
    mismatches: Mismatches,
}

impl Recorder {
    /// A recorder into `metrics` that reads responses as `reading` says.
    pub fn new(metrics: Arc<Metrics>, reading: Settings) -> Self {
        let concurrency = Arc::new(Concurrency::default());
        let ledger = Arc::new(Ledger::new(metrics.gpus()));
        metrics.export_books(Arc::clone(&ledger));
        // Charges made before the first rates are settled into the same counters.
        let weak = Arc::downgrade(&metrics);
        ledger.settle_into(Box::new(move |model, tenant, g| {
            if let Some(m) = weak.upgrade() {
                m.charge_settled(model, tenant, g);
            }
        }));
        let sinks: Vec<Arc<dyn Sink>> = vec![Arc::clone(&metrics) as Arc<dyn Sink>];
        Recorder {
            metrics,
            capacity: None,
            concurrency,
            ledger,
            reading,
            classes: Arc::new(Classes::default()),
            tenants: None,
            identify: None,
            sinks,
            mismatches: Mismatches::default(),
        }
    }

    /// Hands every finished record to `sinks` too, after the metrics and the capacity model,
    /// with the heads read by `identify`.
    pub fn with_sinks(mut self, identify: Option<Identify>, sinks: Vec<Arc<dyn Sink>>) -> Self {
        self.identify = identify;
        self.sinks.extend(sinks);
        self
    }

    /// Feeds `capacity` as tokens pass and requests end (it takes each finished record right
    /// after the metrics).
    pub fn with_capacity(mut self, capacity: Arc<Capacity>) -> Self {
        self.sinks.insert(1, Arc::clone(&capacity) as Arc<dyn Sink>);
        capacity.publish_rates(Arc::clone(&self.ledger));
        self.capacity = Some(capacity);
        self
    }

    /// The concurrency tracker: requests in flight and their integral over time.
    pub fn concurrency(&self) -> &Concurrency {
        &self.concurrency
    }

    /// The metrics every meter records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Labels requests by tenant (`--tenant-header`, `--tenant-from-key`).
    pub fn with_tenants(mut self, tenants: Option<Arc<Tenants>>) -> Self {
        self.tenants = tenants;
        self
    }

    /// Judges requests by these SLO classes (`--slo`, `--slo-file`).
    pub fn with_classes(mut self, classes: Arc<Classes>) -> Self {
        self.classes = classes;
        self
    }

    /// A request's head arrived at `arrived`: its meter, not yet in flight. What the head says
    /// is read here, once: the SLO class its headers and path name (a POST only: inference is
    /// always one), its tenant, and what the request log and spans take of it.
    pub fn receive<B>(self: &Arc<Self>, req: &http::Request<B>, arrived: Instant) -> Meter {
        let judged = req.method() == http::Method::POST;
        let (headers, path) = (req.headers(), req.uri().path());
        Meter {
            stage: Some(Stage::Received(Head {
                recorder: Arc::clone(self),
                arrived,
                slo: judged.then(|| self.classes.resolve(headers, path, None)),
                // Once per request, from the head: the hot path only carries the value.
                tenant: self.tenants.as_ref().map(|t| t.resolve(headers)),
                ident: self.identify.as_ref().map(|i| {
                    let authority = req.uri().authority().map(|a| a.as_str());
                    i.of_uri(req.method(), path, authority, headers)
                }),
            })),
        }
    }

    /// A request that arrived just now is being sent upstream (for tests and benches: the
    /// proxy receives a request first, [`Recorder::receive`], and sends it when it is read).
    #[cfg(any(test, feature = "testing"))]
    pub fn start(self: &Arc<Self>, request: RequestInfo) -> Meter {
        self.start_at(request, Instant::now())
    }

    /// A request that arrived at `arrived` is being sent upstream now (for tests and benches).
    #[cfg(any(test, feature = "testing"))]
    pub fn start_at(self: &Arc<Self>, request: RequestInfo, arrived: Instant) -> Meter {
        Meter {
            stage: Some(Stage::Sent(self.sent(request, arrived))),
        }
    }

    /// The measurement of a request sent now: it enters the in-flight gauges and the
    /// concurrency integral.
    fn sent(self: &Arc<Self>, request: RequestInfo, arrived: Instant) -> State {
        let now = Instant::now();
        let in_flight = self.metrics.in_flight(request.model.as_deref());
        in_flight.add(Phase::Prefill, 1);
        let at_start = self.concurrency.update(now, 1);
        let ticket = self.ledger.enter(now, request.body_bytes, None);
        State {
            reader: Reader::opaque(),
            clock: Clock {
                recorder: Arc::clone(self),
                in_flight,
                request,
                start: arrived.min(now),
                status: 0,
                answered: false,
                encoded: false,
                model: None,
                first_byte: None,
                first_token: None,
                last_token: None,
                at_first: None,
                at_last: None,
                gaps: StreamGaps::default(),
                ttft_pending: None,
                max_stall: None,
                first_output: FirstOutput::default(),
                streamed: 0,
                held: 0,
                at_start,
                at_leave: None,
                ticket,
                share: None,
                slo: Some(self.classes.default_choice()),
                tenant: None,
                left: false,
                route: Route::default(),
                model_from_response: false,
                ident: None,
                counting: None,
            },
        }
    }
}

/// The measurement of one request, from the arrival of its head to its end.
///
/// The metering layer receives it with the head ([`Recorder::receive`]); it goes down the stack
/// beside the request and is sent with what the body said ([`Meter::send`]), which puts the
/// request in flight. [`Meter::finish`] consumes it, so a request is recorded once by
/// construction. Dropping a meter that was never finished records it as
/// [`Outcome::ClientDisconnect`]: the client went away before the response head (hyper dropped
/// the service future that held it). A meter finished or dropped before it was sent is recorded
/// as a request of unknown content, entering and leaving the gauges at that moment.
pub struct Meter {
    /// `None` only inside `finish` and `drop`, after the stage was taken to be recorded.
    stage: Option<Stage>,
}

// A meter is received and sent once per request and moved, never copied in a loop: boxing the
// larger stage would cost every request an allocation to save bytes only while a body is read.
#[allow(clippy::large_enum_variant)]
enum Stage {
    /// The head has arrived; the body is being read, or the request was refused.
    Received(Head),
    /// Sent upstream: in flight until it leaves.
    Sent(State),
}

/// What a request's head said, until the request is sent.
struct Head {
    recorder: Arc<Recorder>,
    arrived: Instant,
    slo: Option<Choice>,
    tenant: Option<Arc<str>>,
    ident: Option<Arc<Ident>>,
}

struct State {
    reader: Reader,
    clock: Clock,
}

/// Everything but the reader, so the reader's returned events can be timed while it is borrowed.
struct Clock {
    recorder: Arc<Recorder>,
    /// The gauges this request entered, and leaves.
    in_flight: InFlight,
    request: RequestInfo,
    /// When the request arrived at the proxy.
    start: Instant,
    status: u16,
    /// The upstream's response head arrived (`status` may be the proxy's own error).
    answered: bool,
    /// The body is compressed: forwarded, not read.
    encoded: bool,
    /// The `model` handles, fixed at the first token so live and final observations agree.
    model: Option<ModelMetrics>,
    first_byte: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The concurrency tracker at the first and at the latest token.
    at_first: Option<Snapshot>,
    at_last: Option<Snapshot>,
    /// The gaps between this stream's tokens, for the live capacity model.
    gaps: StreamGaps,
    /// The TTFT, until it is observed: that waits for the prompt's token count, which gives its
    /// `prompt` band. Where the stream states the count before or with its first token
    /// (Anthropic's `message_start`, vLLM's usage in every chunk) that is at once; where usage
    /// comes last, when it arrives; where it never comes, at the end, as `unknown`.
    ttft_pending: Option<std::time::Duration>,
    /// The longest gap between two token-bearing events so far.
    max_stall: Option<std::time::Duration>,
    /// Arrival to the first event of each kind of output.
    first_output: FirstOutput,
    /// Tokens already counted in the output total as they streamed.
    streamed: u64,
    /// Tokens added to the wire's view of the KV cache (`Metrics::wire_streamed`) while in
    /// flight, taken back when the request leaves.
    held: i64,
    /// The concurrency tracker as the request entered and left the in-flight gauges: the band of
    /// a request without a decode window.
    at_start: Snapshot,
    at_leave: Option<Snapshot>,
    /// Its account in the GPU-time books while in flight, and its share once it has left.
    ticket: Ticket,
    share: Option<Held>,
    /// The SLO class and targets the request is judged against (`None`: not judged).
    slo: Option<Choice>,
    /// The `tenant` label value, resolved once by inspection (`None`: `none`, or no label).
    tenant: Option<Arc<str>>,
    /// The request has left the in-flight gauges (at its end marker, or when finished).
    left: bool,
    /// What the client's path says (the GenAI operation, the format it implies).
    route: Route,
    /// The `model` handles carry the model the stream named (not the request's).
    model_from_response: bool,
    /// What the head said of the request, for the sinks.
    ident: Option<Arc<Ident>>,
    /// With `--tokenizer`: the request's tokenizer and its prompt's count.
    counting: Option<Counting>,
}

// === impl Head ===

impl Head {
    /// The request is sent now, with what its body said and its class: it enters the gauges.
    fn send(self, request: RequestInfo, slo: Option<Choice>) -> State {
        let mut state = self.recorder.sent(request, self.arrived);
        let c = &mut state.clock;
        (c.slo, c.tenant, c.ident) = (slo, self.tenant, self.ident);
        state
    }
}

/// What the client's path says of the request: the GenAI operation and the format it implies.
fn route(path: &str) -> Route {
    Route {
        operation: Operation::of_path(path),
        api: detect::path_hint(path),
    }
}

// === impl Meter ===

impl Meter {
    /// The request was read and is being sent upstream now, with what its body said: it enters
    /// the in-flight gauges. `head` is the client's (its path before any base path); the model
    /// refines the SLO class the head named. A meter already sent is unchanged.
    pub fn send(&mut self, head: &http::request::Parts, request: RequestInfo) {
        let Some(Stage::Received(h)) = self.stage.take_if(|s| matches!(s, Stage::Received(_)))
        else {
            return;
        };
        let path = head.uri.path();
        let slo = h.slo.as_ref().map(|_| {
            let model = request.model.as_deref();
            h.recorder.classes.resolve(&head.headers, path, model)
        });
        let mut state = h.send(request, slo);
        state.clock.route = route(path);
        self.stage = Some(Stage::Sent(state));
    }

    /// Counts the request with a tokenizer too (`--tokenizer`): its prompt now, its output at
    /// its end. For a request that was sent; set before its response head.
    pub fn count_with(&mut self, counting: Counting) {
        if let Some(Stage::Sent(s)) = &mut self.stage {
            // The prompt's prefill is charged at its count as soon as it is known.
            let (ledger, ticket) = (Arc::clone(&s.clock.recorder.ledger), s.clock.ticket);
            counting.on_prompt(move |c| {
                let prompt = Prompt {
                    tokens: c.tokens,
                    uncached: c.tokens,
                };
                ledger.prompt(ticket, prompt, Instant::now());
            });
            s.clock.counting = Some(counting);
        }
    }

    /// The `traceparent` the upstream gets: tokenmeter's span as the parent, in the caller's
    /// trace (`None` when no span of ours is recorded for the request).
    pub fn traceparent(&self) -> Option<String> {
        let ident = match &self.stage {
            Some(Stage::Received(h)) => h.ident.as_ref(),
            Some(Stage::Sent(s)) => s.clock.ident.as_ref(),
            None => None,
        };
        ident?.trace.as_ref()?.traceparent()
    }

    /// What the request's body said, once it was sent.
    pub fn request(&self) -> Option<&RequestInfo> {
        match &self.stage {
            Some(Stage::Sent(s)) => Some(&s.clock.request),
            _ => None,
        }
    }

    /// Whether the request body asked the upstream for a usage report the client did not ask
    /// for (`--inject-usage`), which the response must then lose.
    pub fn usage_injected(&self) -> bool {
        self.request().is_some_and(|r| r.usage_injected)
    }

    /// The measurement of the request as sent: one only received is sent now, as a request of
    /// unknown content (the proxy answered it itself, or it ended before its body was read).
    fn sending(&mut self) -> Option<&mut State> {
        if let Some(Stage::Received(mut h)) =
            self.stage.take_if(|s| matches!(s, Stage::Received(_)))
        {
            let slo = h.slo.take();
            self.stage = Some(Stage::Sent(h.send(RequestInfo::default(), slo)));
        }
        match &mut self.stage {
            Some(Stage::Sent(s)) => Some(s),
            _ => None,
        }
    }

    /// The response head arrived: choose how to read the body.
    pub fn on_response(&mut self, status: u16, path: &str, content_type: &str, encoded: bool) {
        let Some(s) = self.sending() else { return };
        s.clock.status = status;
        s.clock.answered = true;
        if encoded {
            // A compressed body cannot be read without decompressing it; we forward it untouched.
            s.clock.encoded = true;
            return;
        }
        let rec = &s.clock.recorder;
        s.reader = Reader::new(
            path,
            content_type,
            rec.reading.api,
            rec.reading.max_line_bytes,
        );
        if s.clock.counting.is_some() {
            s.reader.transcribe();
        }
    }

    /// The request's SLO class and targets (chosen from its headers, path and model), or `None`
    /// for a request that is not judged.
    pub fn set_slo(&mut self, choice: Option<Choice>) {
        if let Some(s) = self.sending() {
            s.clock.slo = choice;
        }
    }

    /// The request's path (the client's, before any `--upstream` prefix): what it says of the
    /// GenAI operation and the wire format, known before any response (so a request that fails
    /// before its response head still has them).
    pub fn set_route(&mut self, path: &str) {
        if let Some(s) = self.sending() {
            s.clock.route = route(path);
        }
    }

    /// The request's `tenant` label value (bounded: [`Tenants::resolve`]); set before the first
    /// token, which resolves the live handles with it.
    pub fn set_tenant(&mut self, tenant: Option<Arc<str>>) {
        if let Some(s) = self.sending() {
            s.clock.tenant = tenant;
        }
    }

    /// What the request's head said of it (for the request log and the span).
    pub fn set_ident(&mut self, ident: Option<Arc<Ident>>) {
        if let Some(s) = self.sending() {
            s.clock.ident = ident;
        }
    }

    /// The proxy answered itself (400, 502, 504): there is no upstream response head.
    pub fn set_status(&mut self, status: u16) {
        if let Some(s) = self.sending() {
            s.clock.status = status;
        }
    }

    /// The upstream switched protocols (`101`): what follows is no inference stream. The
    /// request leaves the in-flight gauges now, so a WebSocket held open for an hour does not
    /// count as an hour-long prefill nor weigh on the concurrency of the requests beside it;
    /// [`Meter::finish`] with [`Outcome::Upgraded`] records it when the connection closes.
    pub fn upgraded(&mut self, now: Instant) {
        if let Some(s) = self.sending() {
            s.clock.status = 101;
            s.clock.answered = true;
            s.clock.leave(now);
        }
    }

    /// A body frame is passing through to the client now.
    pub fn on_data(&mut self, data: &[u8], now: Instant) {
        let Some(Stage::Sent(State { reader, clock })) = &mut self.stage else {
            return;
        };
        if data.is_empty() {
            return;
        }
        clock.first_byte.get_or_insert(now);
        let chunk = reader.feed(data);
        for e in chunk.events {
            clock.on_tokens(*e, chunk.model, now);
        }
        if chunk.ended {
            clock.leave(now);
        }
        if clock.ttft_pending.is_some() {
            if let Some(input) = reader.summary().input_tokens.or(clock.prompt_tokens()) {
                clock.observe_ttft(Some(input));
            }
        }
    }

    /// Ends the measurement and records it.
    pub fn finish(mut self, outcome: Outcome) {
        self.end(outcome);
    }

    fn end(&mut self, outcome: Outcome) {
        self.sending();
        if let Some(Stage::Sent(s)) = self.stage.take() {
            s.finish(outcome);
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        // Never finished: the client went away before a tap took the meter (hyper dropped the
        // service future before the response head).
        self.end(Outcome::ClientDisconnect);
    }
}

// === impl State ===

impl State {
    fn finish(mut self, outcome: Outcome) {
        let now = Instant::now();
        // The wall clock beside `now`, read only for the per-request debug line.
        let wall = tracing::enabled!(tracing::Level::DEBUG).then(SystemTime::now);
        let (reader, clock) = (&mut self.reader, &mut self.clock);
        let chunk = reader.finish(outcome == Outcome::Complete);
        for e in chunk.events {
            clock.on_tokens(*e, chunk.model, now);
        }
        // A non-streaming response: its tokens count, but it has no first token.
        clock
            .recorder
            .metrics
            .tokens(u64::from(chunk.document), now);
        let input = reader.summary().input_tokens.or(clock.prompt_tokens());
        clock.observe_ttft(input);
        // Leave the in-flight gauges first: nothing below may return before this.
        clock.leave(now);
        let s = &self.clock;
        let summary = self.reader.summary();
        // A client may hang up once the stream's own end marker has passed, before the HTTP
        // body's end (GuideLLM stops reading at `[DONE]`): it received the whole response.
        let outcome = if outcome == Outcome::ClientDisconnect && summary.ended {
            Outcome::Complete
        } else {
            outcome
        };
        let api = self.reader.api();
        let (model, model_from_response) = match &s.model {
            Some(h) => (h.label().to_owned(), s.model_from_response),
            None => (
                s.model_label(summary.model.as_deref()),
                summary.model.is_some(),
            ),
        };
        let code = if s.status == 0 { 502 } else { s.status };
        let (output, token_source) = self.reader.output();
        let since = |t: Instant| t.saturating_duration_since(s.start);
        let f = Finished {
            model,
            code,
            outcome,
            api,
            duration: since(now),
            first_byte: s.first_byte.map(since),
            first_token: s.first_token.map(since),
            last_token: s.last_token.map(since),
            output_tokens: output,
            token_source,
            input_tokens: summary.input_tokens,
            stop: summary.stop,
            mean_in_flight: match (&s.at_first, &s.at_last) {
                (Some(a), Some(b)) => Some(a.mean_until(b)),
                _ => None,
            },
            streamed_tokens: s.streamed,
            max_stall: s.max_stall,
            first_output: s.first_output,
            reasoning_tokens: self.reader.reasoning(),
            cached_input: CachedInput {
                read: summary.cached_read,
                write: summary.cached_write,
            },
            engine: summary.engine,
            parse_errors: ParseErrors {
                line_too_long: self.reader.errors().line_too_long,
                invalid_json: summary.malformed,
                content_encoding: u64::from(s.encoded),
            },
            slo: None,
            route: s.route,
            request_model: s.request.model.clone(),
            model_from_response,
            tenant: s.tenant.clone(),
            ident: s.ident.clone(),
            gpu_seconds: None,
            body_bytes: s.request.body_bytes,
            input_estimated: false,
            prompt_blocks: None,
        };
        // A place among the tokenizing jobs; without one the request keeps the stream's counts
        // (and its event sizes as the stream gave them).
        let Some((counting, place)) = self.clock.counting.take().zip(counting::Place::take())
        else {
            let transcript = self.reader.take_transcript();
            self.record(f, Settled::default(), transcript, now, wall);
            return;
        };
        // With a tokenizer the counts are settled first, on the tokenizing threads: tokenizing the
        // answer never holds up the connection's task. The request has left the gauges above.
        let token_ids = summary.token_id_tokens.is_some();
        let transcript = self.reader.take_transcript();
        place.run(move || {
            let mut f = f;
            let mismatches = &self.clock.recorder.mismatches;
            let settled = counting.settle(&mut f, transcript.as_deref(), token_ids, mismatches);
            self.record(f, settled, transcript, now, wall);
        });
    }

    /// Records `f`, finished at `now`: judged, charged, and handed to every sink. `settled` is
    /// what a tokenizer learnt of it, `transcript` the text it was counted from.
    fn record(
        mut self,
        f: Finished,
        settled: Settled,
        transcript: Option<Box<crate::read::Transcript>>,
        now: Instant,
        wall: Option<SystemTime>,
    ) {
        let gpu_seconds = self.clock.charge(&f, Instant::now().max(now));
        let s = &self.clock;
        let m = &s.recorder.metrics;
        let counted = self.reader.counted();
        if f.api != Api::Unknown && f.output_tokens > counted {
            // The usage report (or the tokenizer) corrects the windowed rate for tokens no
            // event showed.
            m.tokens(f.output_tokens - counted, now);
        }
        if let Some(h) = &s.model {
            // Sizes were held back while a tokenizer counts: its sizes where they are the best
            // known, else the stream's own.
            match (&settled.per_event, &transcript) {
                (Some(sizes), _) => h.event_sizes(sizes),
                (None, Some(t)) => h.event_sizes(&t.sizes),
                (None, None) => {}
            }
        }
        for c in &settled.checks {
            m.tokenizer_check(c.direction.as_str(), c.equal);
        }
        drop(transcript);
        let f = Finished {
            slo: s.judge(&f),
            gpu_seconds: Some(gpu_seconds),
            ..f
        };
        debug_lines(&f, now, wall, s.last_token);
        for sink in &s.recorder.sinks {
            sink.finished(&f, now);
        }
    }
}

/// One `debug` line per request, and one more per decoded request (TTFT, decode time, mean,
/// band, and the engine's stated parts) so the real-server check can pair each request with
/// the client's record of it and hold the engine's account against the wire's. Never
/// the body, the path or headers: only bounded, non-secret facts.
fn debug_lines(f: &Finished, now: Instant, wall: Option<SystemTime>, last: Option<Instant>) {
    let trace = f.ident.as_deref().and_then(|i| i.trace.as_ref());
    tracing::debug!(
        code = f.code,
        outcome = f.outcome.as_str(),
        trace_id = trace.map(|t| crate::context::hex(&t.trace_id)),
        span_id = trace.and_then(|t| t.span_id).map(|s| crate::context::hex(&s)),
        api = f.api.as_str(),
        model = %f.model,
        duration_ms = f.duration.as_millis() as u64,
        "request finished"
    );
    if f.api == Api::Unknown {
        return;
    }
    let (Some(first), Some(decode), Some(last)) = (f.first_token, f.decode_time(), last) else {
        return;
    };
    let decode = decode.as_secs_f64();
    if f.output_tokens < 2 || decode <= 0.0 {
        return;
    }
    // `last_token_unix_ms` places the decode window on the wall clock, read beside `now` (the
    // line's own timestamp comes later, by however long the thread was preempted in between).
    let last_token_unix_ms = wall
        .and_then(|w| w.checked_sub(now - last))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64() * 1e3);
    // The engine's stated parts, where its stream stated them (absent fields otherwise).
    let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    let engine = f.engine.as_ref();
    tracing::debug!(
        output = f.output_tokens,
        ttft_ms = first.as_secs_f64() * 1e3,
        decode_ms = decode * 1e3,
        last_token_unix_ms,
        mean_in_flight = f.mean_in_flight.unwrap_or(1.0),
        band = f.band(),
        queue_ms = ms(engine.and_then(|t| t.queue)),
        model_load_ms = ms(engine.and_then(|t| t.model_load)),
        prefill_ms = ms(engine.and_then(|t| t.prefill)),
        generation_ms = ms(engine.and_then(|t| t.generation)),
        "request decoded"
    );
}

// === impl Clock ===

impl Clock {
    /// The request's SLO result, judged on its record.
    fn judge(&self, f: &Finished) -> Option<SloResult> {
        let choice = self.slo.as_ref()?;
        // A joined WebSocket has no response to time (its upgrade request is a GET anyway).
        if f.outcome == Outcome::Upgraded {
            return None;
        }
        let two_xx = (200..300).contains(&self.status);
        let end = match f.outcome {
            // Gone before any response head (status 0), or from a 2xx response.
            Outcome::ClientDisconnect if self.status == 0 || two_xx => slo::End::ClientDisconnect,
            Outcome::Complete if two_xx => slo::End::Complete,
            // Upstream errors, timeouts, refusals and every non-2xx answer.
            _ => slo::End::Failed,
        };
        // A burst has no speed to judge: its tokens/s target is not missed, nor met by it.
        let decode_tps = f.tokens_per_second();
        let obs = slo::Observation {
            ttft: f.first_token,
            decode_tps,
            elapsed: f.duration,
            end,
        };
        // With a decode window, the band of tokenmeter_request_tokens_per_second; else the
        // mean in flight over the request's life, so a request that queued at high load is
        // not placed in band 1.
        let band = if decode_tps.is_some() {
            f.band()
        } else {
            let life = self
                .at_leave
                .map_or(1.0, |end| self.at_start.mean_until(&end));
            concurrency_band(life.max(1.0))
        };
        Some(SloResult {
            class: Arc::clone(&choice.class),
            verdict: slo::judge(&choice.targets, &obs),
            band,
        })
    }

    /// The `model` label: the name the stream gave (by its first token, when called then), else
    /// the request's.
    fn model_label(&self, named: Option<&str>) -> String {
        let m = &self.recorder.metrics;
        m.model_label(named.or(self.request.model.as_deref()))
    }

    /// A token-bearing event passed at `now`; `named` is the model the stream had named by its
    /// first token-bearing event. Allocation-free and lock-free after the first token, whose
    /// handles are resolved once.
    fn on_tokens(&mut self, e: Event, named: Option<&str>, now: Instant) {
        let tokens = e.tokens;
        let since = now.saturating_duration_since(self.start);
        for (i, kind) in OutputKind::ALL.into_iter().enumerate() {
            if e.kinds.contains(kind) && self.first_output[i].is_none() {
                self.first_output[i] = Some(since);
            }
        }
        match self.last_token {
            None => {
                let m = &self.recorder.metrics;
                let h = m.model(self.model_label(named), self.tenant.as_ref());
                self.model_from_response = named.is_some();
                self.ttft_pending = Some(since);
                // The wait was load the engine held before the request decoded.
                if let Some(c) = &self.recorder.capacity {
                    c.waited(since, now);
                }
                self.model = Some(h);
                self.first_token = Some(now);
                let rec = &self.recorder;
                self.at_first = Some(rec.concurrency.snapshot(now));
                rec.ledger.first_token(self.ticket, now);
                // A token after the end marker (a broken upstream) must not re-enter the gauges.
                if !self.left {
                    if let Some(h) = &self.model {
                        self.in_flight.decoding(h);
                    }
                    self.in_flight.add(Phase::Prefill, -1);
                    self.in_flight.add(Phase::Decode, 1);
                }
            }
            Some(last) => {
                let gap = now.saturating_duration_since(last);
                if self.max_stall < Some(gap) {
                    self.max_stall = Some(gap);
                }
                if let Some(h) = &self.model {
                    h.inter_token(gap, tokens);
                }
            }
        }
        if let Some(h) = &self.model {
            if self.counting.is_some() {
                // Its size is observed at the end, when the tokenizer knows it.
                h.event_unsized(tokens);
            } else {
                h.event(tokens);
            }
            self.streamed += u64::from(tokens);
        }
        let rec = &self.recorder;
        self.last_token = Some(now);
        self.at_last = Some(rec.concurrency.snapshot(now));
        rec.metrics.tokens(u64::from(tokens), now);
        if !self.left {
            self.held += i64::from(tokens);
            rec.metrics.wire_streamed(i64::from(tokens));
        }
        if let (false, Some(c)) = (self.left, &rec.capacity) {
            // The gap since this stream's last tokens was one decode step (or several, for an
            // event that carries several tokens) at the number of streams decoding now.
            let decoding = rec.metrics.decoding() as f64;
            self.gaps.on_tokens(c.as_ref(), tokens, decoding, now);
        }
    }

    /// The request's charge of GPU time, once it has left (`crate::cost`): its share of the
    /// time it was in flight, its prefill settled to the prompt its record states.
    fn charge(&mut self, f: &Finished, now: Instant) -> GpuSeconds {
        let Some(held) = self.share.take() else {
            return GpuSeconds::default();
        };
        if f.outcome == Outcome::UpstreamError && !self.answered {
            // The upstream could not be reached (or failed before it answered): the engine
            // never ran it, so its time in flight is idle, not a charge to `model="unknown"`.
            self.recorder.ledger.void(held, now);
            return GpuSeconds::default();
        }
        let prompt = f.input_tokens.map(|input| Prompt {
            tokens: intake::whole_prompt(f, input),
            uncached: intake::uncached_prompt(f).unwrap_or(input),
        });
        let labels = || Labels {
            model: f.model.clone(),
            tenant: f.tenant.clone(),
        };
        self.recorder.ledger.charge(held, prompt, now, labels)
    }

    /// The prompt's tokens as the tokenizer counted them, once it has (`--tokenizer`).
    fn prompt_tokens(&self) -> Option<u64> {
        self.counting.as_ref()?.prompt().map(|c| c.tokens)
    }

    /// Observes the pending TTFT in the band of `input_tokens` (once: it is taken).
    fn observe_ttft(&mut self, input_tokens: Option<u64>) {
        if let (Some(ttft), Some(h)) = (self.ttft_pending.take(), &self.model) {
            h.first_token(ttft, input_tokens);
        }
    }

    /// Takes the request out of the in-flight gauges, once.
    fn leave(&mut self, now: Instant) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        let capacity = self.recorder.capacity.as_deref();
        if let Some(c) = capacity {
            self.gaps.finish(c);
        }
        let phase = if self.first_token.is_some() {
            Phase::Decode
        } else {
            // It held the engine (or its queue) until it ended, without a first token.
            if let Some(c) = capacity {
                c.waited(now.saturating_duration_since(self.start), now);
            }
            Phase::Prefill
        };
        self.in_flight.add(phase, -1);
        self.recorder
            .metrics
            .wire_streamed(-std::mem::take(&mut self.held));
        self.at_leave = Some(self.recorder.concurrency.update(now, -1));
        self.share = self.recorder.ledger.leave(self.ticket, now);
    }
}

#[cfg(test)]
mod tests;
