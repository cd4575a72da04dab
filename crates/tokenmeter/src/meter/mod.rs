//! Per-request timing: the state machine that turns what a response's body says into one
//! [`crate::record::Finished`] record.
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
//!
//! Here the meter times; `recorder.rs` holds what every meter shares and starts one, `finish.rs`
//! builds the record at the end (charged, judged, handed to the sinks), `testing.rs` what tests
//! drive a meter with.
//!
//! `concurrency.rs` is the exact time integral of requests in flight, read at every token without
//! a lock. `counting.rs` is a request counted with `--tokenizer` (its prompt at admission, its
//! streamed text when it ends): such a request is settled on the tokenizing threads and recorded
//! from there, after it has left the gauges. A `Recorder`'s fields are private to `meter`, set
//! with its `with_*` methods.

pub mod concurrency;
pub mod counting;
mod finish;
mod recorder;
pub mod settings;
#[cfg(any(test, feature = "testing"))]
mod testing;

use std::sync::Arc;
use std::time::Instant;

pub use self::concurrency::{Concurrency, Snapshot};
pub use self::counting::Counting;
use self::recorder::route;
pub use self::recorder::Recorder;
pub use self::settings::{Settings, DEFAULT_MAX_LINE_BYTES};
use crate::capacity::StreamGaps;
use crate::context::Ident;
use crate::cost::{Held, Prompt, Ticket};
use crate::metrics::{InFlight, ModelMetrics, Phase};

use crate::protocol::operation::Route;
use crate::protocol::request::RequestInfo;
use crate::protocol::OutputKind;
use crate::read::{Event, Reader};
use crate::record::{FirstOutput, Outcome};
use crate::slo::Choice;

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
    /// The end of the step the engine was running when the request arrived, as the proxy saw
    /// it, taken at the first token (the capacity model's prefill fit starts its step there).
    running_step_end: Option<Instant>,
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
    /// Tokens added to the wire's view of the KV cache (`Capacity::wire_streamed`) while in
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
    /// The `tenant` label value, resolved once at the head (`None`: `none`, or no label).
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

// === impl Clock ===

impl Clock {
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
        let first = self.last_token.is_none();
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
        if let (false, Some(c)) = (self.left, &rec.capacity) {
            self.held += i64::from(tokens);
            c.wire_streamed(i64::from(tokens));
            // The gap since this stream's last tokens was one decode step (or several, for an
            // event that carries several tokens) at the number of streams decoding now.
            let decoding = rec.metrics.decoding() as f64;
            self.gaps.on_tokens(c.as_ref(), tokens, decoding, now);
            c.saw_step_end(now);
            if first {
                self.running_step_end = c.running_step_end(self.start, now);
            }
        }
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
        if let Some(c) = capacity {
            c.wire_streamed(-std::mem::take(&mut self.held));
        }
        self.at_leave = Some(self.recorder.concurrency.update(now, -1));
        self.share = self.recorder.ledger.leave(self.ticket, now);
    }
}

#[cfg(test)]
mod tests;
