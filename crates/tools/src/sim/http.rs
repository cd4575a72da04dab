//! The simulator's HTTP server: routes, request handling, and the streaming response body.
//!
//! A generation request is read whole, turned into a [`Job`](super::engine::Job) for the engine, and answered with a
//! `TokenBody` that writes each token as the engine emits it (streaming), or with one JSON document
//! once the last token is out (non-streaming: the headers wait too, as on a real server). A client
//! that hangs up drops the body, which takes the sequence out of the batch at the next step.
//!
//! GET routes: `/health`, `/v1/models`, `/sim/stats` (the engine's own record of every request:
//! arrival, first and last token times, tokens; see `docs/sim.md`), and `/api/tags` with
//! `--api ollama`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::net::TcpListener;

use super::account::TenantId;
use super::decoding::{Decoding, SpecCounts, Step};
use super::engine::{Engine, StatsReport, Ticket};
use super::prefix::{PrefixCaching, PrefixLookup};
use super::text::{estimate_tokens, Lengths, Rng, Token, Words};
use super::wire::{self, BodyError, Dialect, Handler, Parsed, Reply, Timings};

/// Request bodies larger than this are refused (413): far above any real prompt we simulate, and
/// it bounds what a client can make the simulator hold.
const MAX_REQUEST_BODY: usize = 32 << 20;

/// The response body type of every route.
pub type SimBody = http_body_util::combinators::BoxBody<Bytes, Interrupted>;

/// The simulator stopped before a response was complete.
#[derive(Debug, thiserror::Error)]
#[error("the simulator stopped before the response was complete")]
pub struct Interrupted;

/// What every request handler shares.
#[derive(Debug)]
pub struct State {
    pub engine: Engine,
    pub dialect: Dialect,
    /// Reported when the request names no model.
    pub model: String,
    pub seed: u64,
    /// `--prefix-cache-hit-rate` or `--prefix-cache-tokens`.
    pub prefix_cache: PrefixCaching,
    /// That cache, serving every request its cached tokens.
    pub prefix: PrefixLookup,
    pub lengths: Lengths,
    /// `--enable-per-request-metrics`.
    pub per_request_metrics: bool,
    /// `--tenant-header`: whose GPU time a request is.
    pub tenant_header: hyper::header::HeaderName,
}

/// Accepts connections until `shutdown` completes. Connections already open are left to finish
/// on their own (they live as long as the runtime).
pub async fn serve(listener: TcpListener, state: Arc<State>, shutdown: impl Future<Output = ()>) {
    let accept = async {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "sim: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // One small write per token: it must leave at once.
            let _ = stream.set_nodelay(true);
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(handle(&state, req).await) }
                });
                if let Err(e) = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "sim: connection ended with an error");
                }
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => {}
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<SimBody> {
    let mut resp = Response::new(Full::new(body.into()).map_err(|n| match n {}).boxed());
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<SimBody> {
    match serde_json::to_vec(value) {
        Ok(b) => full(status, "application/json", b),
        Err(_) => full(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "cannot encode",
        ),
    }
}

/// An error body in the shape the route's API uses.
fn error(route: Option<Handler>, status: StatusCode, message: &str) -> Response<SimBody> {
    json(status, &wire::error_body(route, status.as_u16(), message))
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<SimBody> {
    let path = req.uri().path().to_string();
    if req.method() == Method::GET {
        return match path.as_str() {
            "/health" => full(StatusCode::OK, "text/plain", ""),
            "/v1/models" => json(
                StatusCode::OK,
                &serde_json::json!({
                    "object": "list",
                    "data": [{"id": state.model, "object": "model", "created": 0, "owned_by": "tokenmeter-sim"}],
                }),
            ),
            "/api/tags" if state.dialect == Dialect::Ollama => json(
                StatusCode::OK,
                &serde_json::json!({"models": [{"name": state.model, "model": state.model, "size": 0}]}),
            ),
            "/sim/stats" => json(StatusCode::OK, &stats(state)),
            "/metrics" => full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                super::metrics::render_all(&state.model, state.engine.stats()),
            ),
            _ => error(None, StatusCode::NOT_FOUND, "no such route"),
        };
    }
    let Some(route) = Handler::find(state.dialect, &path).filter(|_| req.method() == Method::POST)
    else {
        return error(None, StatusCode::NOT_FOUND, "no such route");
    };
    let tenant = state.engine.stats().accounts.tenant(
        req.headers()
            .get(&state.tenant_header)
            .and_then(|v| v.to_str().ok()),
    );
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error(
                Some(route),
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
            );
        }
        // The client went away or sent a broken body: nobody will read the answer.
        Err(_) => {
            return error(
                Some(route),
                StatusCode::BAD_REQUEST,
                "cannot read the request body",
            )
        }
    };
    let parsed = if state.prefix.wants_keys() {
        wire::parse_with_keys(route, &body)
    } else {
        wire::parse(route, &body)
    };
    match parsed {
        Ok(parsed) => generate(state, route, parsed, tenant).await,
        Err(e @ (BodyError::NotJson | BodyError::BadLimit(_))) => {
            error(Some(route), StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

#[derive(Serialize)]
struct StatsBody<'a> {
    api: &'a str,
    model: &'a str,
    seed: u64,
    step_base_s: f64,
    step_per_seq_s: f64,
    prefill_per_token_s: f64,
    step_per_1k_kv_tokens_s: f64,
    prefix_cache_hit_rate: f64,
    /// `--prefix-cache-tokens` (0: none).
    prefix_cache_tokens: u32,
    max_batch: usize,
    /// `--tokens-per-event` (absent under speculative decoding).
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_event: Option<u32>,
    /// `--spec-acceptance` and `--spec-tokens` (absent without speculative decoding).
    #[serde(skip_serializing_if = "Option::is_none")]
    spec_acceptance: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec_tokens: Option<u32>,
    #[serde(flatten)]
    report: StatsReport,
}

fn stats(state: &State) -> StatsBody<'_> {
    let m = state.engine.model();
    let (tokens_per_event, spec_acceptance, spec_tokens) = match state.engine.decoding() {
        Decoding::Fixed(n) => (Some(n), None, None),
        Decoding::Speculative { acceptance, draft } => (None, Some(acceptance), Some(draft)),
    };
    StatsBody {
        api: state.dialect.name(),
        model: &state.model,
        seed: state.seed,
        step_base_s: m.step_base.as_secs_f64(),
        step_per_seq_s: m.step_per_seq.as_secs_f64(),
        prefill_per_token_s: m.prefill_per_token.as_secs_f64(),
        step_per_1k_kv_tokens_s: m.step_per_1k_kv_tokens.as_secs_f64(),
        prefix_cache_hit_rate: state.prefix_cache.rate(),
        prefix_cache_tokens: state.prefix_cache.tokens(),
        max_batch: m.max_batch,
        tokens_per_event,
        spec_acceptance,
        spec_tokens,
        report: state.engine.stats().report(),
    }
}

async fn generate(state: &State, route: Handler, p: Parsed, tenant: TenantId) -> Response<SimBody> {
    let received = Instant::now();
    // Length first, then the words, from one stream: a request's text is the same whatever its
    // limit, only cut shorter.
    let seed = state.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ p.prompt_hash;
    let mut rng = Rng::new(seed);
    let natural = state.lengths.sample(&mut rng);
    let output_tokens = p.max_tokens.unwrap_or(natural);
    let prompt_tokens = estimate_tokens(p.prompt_chars);
    let job = state
        .prefix
        .job(prompt_tokens, &p.prefix_keys, output_tokens);
    // The step sizes (under speculative decoding) from a stream of their own, so they leave the
    // words and the length as they are without it.
    let steps_seed = Rng::new(seed ^ 0x5350_4543_4445_434F).next_u64();
    let Ok(ticket) = state.engine.submit_seeded(job, tenant, steps_seed) else {
        return error(
            Some(route),
            StatusCode::SERVICE_UNAVAILABLE,
            "the simulator is stopping",
        );
    };
    let model = p.model.as_deref().unwrap_or(&state.model);
    let response = Reply {
        route,
        stream: p.stream,
        include_usage: p.include_usage,
        model: serde_json::to_string(model).unwrap_or_else(|_| "\"\"".into()),
        id: ticket.id,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        prompt_tokens,
        // Stated only with the cache on, as vLLM states it only when asked to: without it the
        // responses stay as they were.
        cached_tokens: state.prefix_cache.is_on().then_some(job.cached_tokens),
        output_tokens,
        limited: p.max_tokens.is_some(),
        details: p.details,
        per_request_metrics: state.per_request_metrics,
    };
    let id = ticket.id;
    let mut body = TokenBody {
        response,
        words: Words::new(rng),
        ticket,
        rendered: 0,
        pending: None,
        event: Vec::new(),
        spec: SpecCounts::default(),
        keep_text: !p.stream || route == Handler::TgiGenerateStream,
        text: String::new(),
        buf: String::new(),
        head_sent: false,
        done: false,
        received,
        first: None,
    };
    let mut resp = if body.response.stream {
        let ct = body.response.content_type();
        let mut r = Response::new(body.boxed());
        r.headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
        r.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        r
    } else {
        match body.complete().await {
            Ok(text) => full(StatusCode::OK, "application/json", text),
            Err(Interrupted) => {
                return error(
                    Some(route),
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the simulator is stopping",
                )
            }
        }
    };
    if let Ok(v) = header::HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert("x-sim-request-id", v);
    }
    resp
}

/// A response that writes tokens as the engine emits them.
struct TokenBody {
    response: Reply,
    words: Words,
    ticket: Ticket,
    /// Tokens written so far.
    rendered: u32,
    /// The size of the next event, once drawn from the ticket's steps (the engine drew the same
    /// for the step that makes it).
    pending: Option<Step>,
    /// The tokens of the event being written (one buffer, reused).
    event: Vec<Token>,
    /// This request's drafts so far, under speculative decoding.
    spec: SpecCounts,
    /// The whole output so far, kept only where the format needs it (TGI repeats it at the end;
    /// a non-streaming response is it), so a long stream holds no more memory than a short one.
    keep_text: bool,
    text: String,
    buf: String,
    head_sent: bool,
    done: bool,
    received: Instant,
    first: Option<Instant>,
}

impl TokenBody {
    fn timings(&self) -> Timings {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let progress = &self.ticket.progress;
        Timings {
            prefill: first.saturating_duration_since(self.received),
            decode: now.saturating_duration_since(first),
            engine_queue: progress.queue(),
            engine_prefill: progress.prefill(),
            spec: self
                .ticket
                .steps
                .decoding()
                .is_speculative()
                .then_some(self.spec),
        }
    }

    /// Writes the tokens emitted since the last call into `buf`, one event per engine step
    /// (with the tail after the last one, when streaming).
    fn render_new(&mut self) {
        let emitted = self
            .ticket
            .progress
            .emitted()
            .min(self.response.output_tokens);
        if emitted > self.rendered && self.first.is_none() {
            self.first = Some(Instant::now());
        }
        if emitted > self.rendered && !self.head_sent {
            self.head_sent = true;
            if self.response.stream {
                self.response.head(&mut self.buf);
            }
        }
        while self.rendered < emitted {
            let left = self.response.output_tokens - self.rendered;
            let step = *self
                .pending
                .get_or_insert_with(|| self.ticket.steps.next(left));
            // The engine emits whole steps; a part of one would wait for the rest.
            if step.tokens == 0 || emitted - self.rendered < step.tokens {
                break;
            }
            self.pending = None;
            self.spec.add(step);
            self.event.clear();
            for _ in 0..step.tokens {
                let tok = self.words.next_token();
                if self.keep_text {
                    self.text.push_str(tok.text);
                }
                self.event.push(tok);
            }
            if self.response.stream {
                self.response
                    .event(self.rendered, &self.event, &self.text, &mut self.buf);
            }
            self.rendered += step.tokens;
        }
        if self.rendered == self.response.output_tokens && !self.done {
            self.done = true;
            if self.response.stream {
                let t = self.timings();
                self.response.tail(&t, &mut self.buf);
            }
        }
    }

    fn take_frame(&mut self) -> Option<Frame<Bytes>> {
        (!self.buf.is_empty()).then(|| Frame::data(Bytes::from(std::mem::take(&mut self.buf))))
    }

    /// Non-streaming: waits for the last token and returns the whole document.
    async fn complete(&mut self) -> Result<String, Interrupted> {
        while self.ticket.wake.recv().await.is_some() {
            self.render_new();
        }
        self.render_new();
        if !self.done {
            return Err(Interrupted);
        }
        let t = self.timings();
        Ok(self.response.whole(&self.text, &t))
    }
}

impl Body for TokenBody {
    type Data = Bytes;
    type Error = Interrupted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Interrupted>>> {
        let this = self.get_mut();
        if !this.head_sent && !this.response.head_waits_for_first_token() {
            this.head_sent = true;
            this.response.head(&mut this.buf);
            if let Some(f) = this.take_frame() {
                return Poll::Ready(Some(Ok(f)));
            }
        }
        loop {
            if this.done {
                return Poll::Ready(this.take_frame().map(Ok));
            }
            match this.ticket.wake.poll_recv(cx) {
                Poll::Ready(Some(())) => {
                    this.render_new();
                    if let Some(f) = this.take_frame() {
                        return Poll::Ready(Some(Ok(f)));
                    }
                }
                // The engine let go of the sequence: complete (rendered on the next turn), or the
                // engine stopped.
                Poll::Ready(None) => {
                    this.render_new();
                    if !this.done {
                        this.done = true;
                        return Poll::Ready(Some(Err(Interrupted)));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.buf.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
