//! Metering, the outermost layer: one [`Meter`] per request, received with its head.
//!
//! The meter's clock starts when the request head arrives, here. The meter goes down the stack
//! beside the request, as a [`Metered`] request; [`inspect`](super::inspect) sends it with what
//! the body said, which puts the request in flight; it comes back up beside the response or
//! the error. This file is where every request is recorded, exactly once, since the one meter
//! ends in exactly one of three places (or, for a joined upgrade, in the one task that holds
//! it):
//! - an error ([`ProxyError`]) from any layer below (shed at the cap, a body that cannot be
//!   read, no upstream, no head in time): the meter finishes at once with the error's status
//!   and outcome, and the client gets the error's JSON response;
//! - a response head: the meter learns the status and content type, and the body is wrapped in
//!   a [`TapBody`], which finishes the meter when the body ends, fails or is dropped. When
//!   `--inject-usage` asked for usage and the response is SSE, [`StripUsage`] wraps the tap, so
//!   the meter still sees the usage chunk the client does not. (A `101` the upstream agreed to
//!   never comes back here with its meter: the layer below, [`upgrades`](super::upgrades),
//!   moves the meter into the task that joins the connection, which finishes it with outcome
//!   `upgraded` when they close; this layer gets its [`Reply::Joined`] head);
//! - the meter's own drop, when hyper drops the request's future (the client went away before
//!   the response head): outcome `client_disconnect`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower::{Layer, Service};

use super::{header_str, BoxFuture, ProxyBody, ProxyError};
use crate::error::BoxError;
use crate::idle::IdleBody;
use crate::inject::StripUsage;
use crate::meter::{Meter, Recorder};
use crate::read::{content_framing, Framing};
use crate::tap::TapBody;

/// Builds [`Metering`] services.
#[derive(Clone)]
pub struct MeteringLayer {
    recorder: Arc<Recorder>,
    idle_timeout: Option<Duration>,
}

/// Meters every request that passes, whichever way it ends.
#[derive(Clone)]
pub struct Metering<S> {
    inner: S,
    recorder: Arc<Recorder>,
    idle_timeout: Option<Duration>,
}

/// A request with its meter beside it: the meter goes down the stack with the request and
/// comes back up with its [`Answer`].
pub struct Metered<T> {
    pub meter: Meter,
    pub inner: T,
}

/// What comes back up a layer: the response, or the error that ended the request (a refusal of
/// the proxy's own or an upstream's failure), with the request's meter.
pub type Answer<B> = Metered<Result<Response<B>, ProxyError>>;

/// What comes back up to the metering layer from the one below it
/// ([`upgrades`](super::upgrades)).
// The answer (its meter is most of it) is every request's path and moved once: boxing it would
// cost an allocation per request to shrink a value that lives for one return.
#[allow(clippy::large_enum_variant)]
pub enum Reply<B> {
    /// An answer with the request's meter, for this layer to end.
    Answer(Answer<B>),
    /// The `101` of an upgrade that layer joined: the meter went with the joined connection,
    /// which finishes it when it closes.
    Joined(Response<ProxyBody>),
}

impl<B> From<Answer<B>> for Reply<B> {
    fn from(answer: Answer<B>) -> Self {
        Reply::Answer(answer)
    }
}

fn finish_with_error(mut meter: Meter, err: &ProxyError) {
    meter.set_status(err.status().as_u16());
    meter.finish(err.outcome());
}

// === impl MeteringLayer ===

impl MeteringLayer {
    /// `idle_timeout` is `--idle-timeout`, the tap's limit on silence between body frames.
    pub fn new(recorder: Arc<Recorder>, idle_timeout: Option<Duration>) -> Self {
        MeteringLayer {
            recorder,
            idle_timeout,
        }
    }
}

impl<S> Layer<S> for MeteringLayer {
    type Service = Metering<S>;

    fn layer(&self, inner: S) -> Metering<S> {
        Metering {
            inner,
            recorder: Arc::clone(&self.recorder),
            idle_timeout: self.idle_timeout,
        }
    }
}

// === impl Metering ===

impl<S, R, B> Service<Request<R>> for Metering<S>
where
    S: Service<Metered<Request<R>>, Response = Reply<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    R: 'static,
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<ProxyBody>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<R>) -> Self::Future {
        // The client's wait starts when its request head has arrived, before its body.
        let meter = self.recorder.receive(&req, Instant::now());
        // The client's path: the one the wire format is told by, before any base path.
        let path = req.uri().path().to_owned();
        let idle_timeout = self.idle_timeout;
        // tokenmeter's span is the upstream's parent: the engine's spans join the caller's
        // trace under it. Without a span of ours, the caller's header goes on unchanged.
        if let Some(tp) = meter.traceparent() {
            if let Ok(v) = http::HeaderValue::from_str(&tp) {
                req.headers_mut().insert("traceparent", v);
            }
        }
        let sent: BoxFuture<_> = Box::pin(self.inner.call(Metered { meter, inner: req }));
        Box::pin(async move {
            let Ok(reply) = sent.await;
            match reply {
                Reply::Answer(Metered {
                    meter,
                    inner: Ok(resp),
                }) => Ok(tap(resp, meter, &path, idle_timeout)),
                Reply::Answer(Metered {
                    meter,
                    inner: Err(err),
                }) => {
                    finish_with_error(meter, &err);
                    Ok(err.to_response())
                }
                Reply::Joined(resp) => Ok(resp),
            }
        })
    }
}

/// Shows the response to the meter and wraps its body in the tap (and the usage filter).
fn tap<B>(
    resp: Response<B>,
    mut meter: Meter,
    path: &str,
    idle_timeout: Option<Duration>,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = resp.into_parts();
    let content_type = header_str(&parts.headers, header::CONTENT_TYPE);
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    meter.on_response(parts.status.as_u16(), path, content_type, encoded);
    // The same test of "is this SSE" as the meter's framing (case-insensitive, parameters aside).
    let strip_usage = meter.usage_injected() && content_framing(content_type) == Some(Framing::Sse);
    let body = TapBody::new(IdleBody::new(body, idle_timeout), meter);
    if strip_usage {
        // The body loses the usage chunk: its length is no longer the upstream's.
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, BodyExt::boxed(StripUsage::new(body)));
    }
    Response::from_parts(parts, BodyExt::boxed(body))
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;
    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::metrics::Metrics;
    use crate::protocol::request::RequestInfo;
    use crate::proxy::testing::{assert_has, recorder, scrape};

    const CONTENT: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    /// A streaming chat request.
    fn request() -> Request<ProxyBody> {
        Request::post("/v1/chat/completions")
            .body(super::super::full(Bytes::new()))
            .expect("request")
    }

    /// Sends the meter as inspection does, having read model `m`, usage injected or not.
    fn send(req: &mut Metered<Request<ProxyBody>>, usage_injected: bool) {
        let info = RequestInfo {
            model: Some("m".into()),
            stream: true,
            include_usage: false,
            usage_injected,
            body_bytes: 0,
        };
        let (parts, _) = Request::post(req.inner.uri().clone())
            .body(())
            .expect("head")
            .into_parts();
        req.meter.send(&parts, info);
    }

    /// Runs a request over a stub stack below that sends it (model `m`, usage injected or
    /// not) and answers `content_type` with `body`.
    async fn run(
        usage_injected: bool,
        content_type: &'static str,
        body: String,
    ) -> (Arc<Metrics>, Response<ProxyBody>, Bytes) {
        let (metrics, rec) = recorder();
        let stub = service_fn(move |mut req: Metered<Request<ProxyBody>>| {
            send(&mut req, usage_injected);
            let body = body.clone();
            async move {
                let resp = Response::builder()
                    .header(header::CONTENT_TYPE, content_type)
                    .header(header::CONTENT_LENGTH, body.len())
                    .body(Full::new(Bytes::from(body)))
                    .expect("response");
                let inner = Ok(resp);
                Ok::<_, Infallible>(Reply::from(Metered {
                    meter: req.meter,
                    inner,
                }))
            }
        });
        let svc = MeteringLayer::new(rec, None).layer(stub);
        let resp = svc.oneshot(request()).await.expect("infallible");
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        (
            metrics,
            Response::from_parts(parts, super::super::full(Bytes::new())),
            bytes,
        )
    }

    // Regression: the usage filter's SSE test was `starts_with("text/event-stream")`, so a
    // server that spelt its content type in capitals leaked the injected chunk to the client.
    #[tokio::test]
    async fn the_usage_chunk_is_stripped_whatever_the_content_type_case() {
        let stream = format!("{CONTENT}{USAGE}{DONE}");
        let ct = "Text/Event-Stream; charset=utf-8";
        let (metrics, resp, body) = run(true, ct, stream).await;
        assert_eq!(&body[..], format!("{CONTENT}{DONE}").as_bytes());
        assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
        // The meter read the chunk the client did not get.
        let text = scrape(&metrics);
        assert_has(&text, r#"tokenmeter_output_tokens_total{model="m"} 7"#);
        assert_has(
            &text,
            r#"tokenmeter_token_count_source_total{source="usage"} 1"#,
        );
    }

    #[tokio::test]
    async fn nothing_is_stripped_unless_usage_was_injected_into_sse() {
        let stream = format!("{CONTENT}{USAGE}{DONE}");
        let (_, resp, body) = run(false, "text/event-stream", stream.clone()).await;
        assert_eq!(&body[..], stream.as_bytes());
        assert_eq!(
            resp.headers()[header::CONTENT_LENGTH],
            stream.len().to_string()
        );
        let (_, _, body) = run(true, "application/x-ndjson", stream.clone()).await;
        assert_eq!(&body[..], stream.as_bytes());
    }

    #[tokio::test]
    async fn a_complete_response_is_recorded_once() {
        let stream = format!("{CONTENT}{CONTENT}{DONE}");
        let (metrics, resp, _) = run(false, "text/event-stream", stream).await;
        assert_eq!(resp.status(), 200);
        let text = scrape(&metrics);
        assert_has(
            &text,
            r#"tokenmeter_requests_total{api="openai",code="200",model="m",outcome="complete"} 1"#,
        );
        assert_has(&text, "tokenmeter_requests_in_flight{phase=\"decode\"} 0");
    }

    #[tokio::test]
    async fn an_error_from_below_is_answered_and_recorded_once() {
        let bad_uri = http::Uri::builder()
            .path_and_query("no spaces")
            .build()
            .expect_err("invalid");
        let cases = [
            (
                ProxyError::UpstreamTimeout(Duration::from_secs(2)),
                504,
                "timeout",
            ),
            (ProxyError::BadUri(bad_uri), 400, "bad_request"),
        ];
        for (err, code, outcome) in cases {
            let (metrics, rec) = recorder();
            let err = Arc::new(std::sync::Mutex::new(Some(err)));
            let stub = service_fn(move |mut req: Metered<Request<ProxyBody>>| {
                send(&mut req, false);
                let err = err.lock().expect("lock").take().expect("called once");
                let inner = Err::<Response<Full<Bytes>>, _>(err);
                async move {
                    Ok::<_, Infallible>(Reply::from(Metered {
                        meter: req.meter,
                        inner,
                    }))
                }
            });
            let svc = MeteringLayer::new(rec, None).layer(stub);
            let resp = svc.oneshot(request()).await.expect("infallible");
            assert_eq!(resp.status(), code);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            let text = scrape(&metrics);
            let line = format!(
                r#"tokenmeter_requests_total{{api="unknown",code="{code}",model="m",outcome="{outcome}"}} 1"#
            );
            assert_has(&text, &line);
            assert_has(&text, "tokenmeter_requests_in_flight{phase=\"prefill\"} 0");
        }
    }
}
