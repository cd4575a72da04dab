//! The end of a request: its record built from what the meter timed, charged its GPU time,
//! judged against its SLO class, and handed to every sink, once. With `--tokenizer` the counts
//! are settled first, on the tokenizing threads, so the connection's task never waits for them.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::counting::{self, Settled};
use super::{Clock, State};
use crate::capacity::intake;
use crate::cost::{GpuSeconds, Labels, Prompt};
use crate::protocol::Api;
use crate::record::{concurrency_band, CachedInput, Finished, Outcome, ParseErrors, SloResult};
use crate::slo;

impl State {
    pub(super) fn finish(mut self, outcome: Outcome) {
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
            running_step_end: s.running_step_end.map(since),
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

impl Clock {
    /// The request's SLO result, judged on its record.
    fn judge(&self, f: &Finished) -> Option<SloResult> {
        let choice = self.slo.as_ref()?;
        // A joined WebSocket has no response to time (its upgrade request is a GET anyway).
        if f.outcome == Outcome::Upgraded {
            return None;
        }
        let end = slo::End::of(
            self.status,
            f.outcome == Outcome::Complete,
            f.outcome == Outcome::ClientDisconnect,
        );
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
}
