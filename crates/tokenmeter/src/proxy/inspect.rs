//! Request inspection: what the client asked for, read from its body before it is sent.
//!
//! A JSON body up to `--max-request-body` is read whole, to learn the model (an inference server
//! needs the whole body before it starts, so this costs no latency); `--inject-usage` rewrites it
//! here ([`crate::inject::add_usage`]) when its [`Policy`] says so, and learns from each response
//! head whether the upstream is OpenAI's own API, where it must not. Anything else, and anything larger, streams through as it
//! comes ([`Prefixed`] forwards what was read before the limit was crossed).
//!
//! With `--tokenizer`, the request's prompt is counted too: on the tokenizing threads, from the body
//! read whole, while the request is already on its way ([`Counting`]).
//!
//! What was learnt is handed to the request's meter as the request is sent
//! ([`Meter::send`](crate::meter::Meter::send)): from then on the request is in flight. A body
//! that fails while it is read is an error like any other, 400 `request_body`, which the
//! metering layer records as `bad_request`; a client that goes away meanwhile drops the meter
//! with this layer's future, and is recorded as `client_disconnect`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project::pin_project;
use tower::{Layer, Service};

use super::metering::{Answer, Metered};
use super::resend::Replayable;
use super::{full, BoxFuture, ProxyBody, ProxyError};
use crate::error::BoxError;
use crate::inject::{self, Policy};
use crate::meter::Counting;
use crate::protocol::operation::Operation;
use crate::protocol::request::{self, RequestInfo};
use crate::protocol::{detect, Api};
use crate::tokenize::Tokenizers;

/// Builds [`Inspect`] services.
#[derive(Clone)]
pub struct InspectLayer {
    max_request_body: usize,
    inject: Arc<Policy>,
    tokenizers: Option<Arc<Tokenizers>>,
}

/// Reads the request, sends its meter, then calls the stack below.
#[derive(Clone)]
pub struct Inspect<S> {
    inner: S,
    max_request_body: usize,
    inject: Arc<Policy>,
    tokenizers: Option<Arc<Tokenizers>>,
}

// === impl InspectLayer ===

impl InspectLayer {
    /// `max_request_body` is `--max-request-body`; `inject`, `--inject-usage` and what it knows.
    pub fn new(max_request_body: usize, inject: Arc<Policy>) -> Self {
        InspectLayer {
            max_request_body,
            inject,
            tokenizers: None,
        }
    }

    /// Counts prompts (and, through the meter, answers) with these tokenizers (`--tokenizer`).
    pub fn with_tokenizers(mut self, tokenizers: Option<Arc<Tokenizers>>) -> Self {
        self.tokenizers = tokenizers;
        self
    }
}

impl<S> Layer<S> for InspectLayer {
    type Service = Inspect<S>;

    fn layer(&self, inner: S) -> Inspect<S> {
        Inspect {
            inner,
            max_request_body: self.max_request_body,
            inject: Arc::clone(&self.inject),
            tokenizers: self.tokenizers.clone(),
        }
    }
}

// === impl Inspect ===

impl<S, B, R> Service<Metered<Request<B>>> for Inspect<S>
where
    S: Service<Request<ProxyBody>, Response = Response<R>, Error = ProxyError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
    R: Send + 'static,
{
    type Response = Answer<R>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Answer<R>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below refuse requests one by one, as errors from `call`, never here.
        match self.inner.poll_ready(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: Metered<Request<B>>) -> Self::Future {
        // The clone that was made ready is the one that is called (tower's contract).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (max, policy) = (self.max_request_body, Arc::clone(&self.inject));
        let tokenizers = self.tokenizers.clone();
        let Metered {
            mut meter,
            inner: req,
        } = req;
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let path = parts.uri.path();
            let inject_usage = policy.rewrites();
            let read = read_body(&mut parts.headers, path, body, max, inject_usage).await;
            let (body, info, whole) = match read {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(error = %e, "client request body failed");
                    let inner = Err(ProxyError::RequestBody(e));
                    return Ok(Metered { meter, inner });
                }
            };
            let counting = counting(tokenizers.as_deref(), path, &info, whole.as_ref());
            meter.send(&parts, info);
            if let Some(c) = counting {
                meter.count_with(c);
            }
            if let Some(whole) = whole {
                parts.extensions.insert(Replayable(whole));
            }
            let sent: BoxFuture<_> = Box::pin(inner.call(Request::from_parts(parts, body)));
            let inner = sent.await;
            if let Ok(resp) = &inner {
                policy.response_head(resp.headers());
            }
            Ok(Metered { meter, inner })
        })
    }
}

/// The counting of a chat or completions request to an OpenAI-compatible path with a body read
/// whole, when a tokenizer is given for its model; its prompt's count starts now.
fn counting(
    tokenizers: Option<&Tokenizers>,
    path: &str,
    info: &RequestInfo,
    whole: Option<&Bytes>,
) -> Option<Counting> {
    let body = whole.filter(|b| !b.is_empty())?;
    // Chat and completions only: an embeddings request has no answer to count, and its input
    // is not a prompt the tokenizer reads.
    let generates = matches!(
        Operation::of_path(path),
        Some(Operation::Chat | Operation::TextCompletion)
    );
    if !generates || detect::path_hint(path) != Some(Api::OpenAi) {
        return None;
    }
    let tokenizers = tokenizers?;
    let tokenizer = tokenizers.for_model(info.model.as_deref())?;
    let blocks = tokenizers.blocks();
    Some(Counting::start(
        Arc::clone(tokenizer),
        path,
        body.clone(),
        blocks,
    ))
}

/// Reads a JSON body up to `max`; anything else, or anything larger, streams through. The body
/// read whole (or none) comes back a third time, for the pool to send again if it must.
async fn read_body<B>(
    headers: &mut HeaderMap,
    path: &str,
    mut body: B,
    max: usize,
    inject_usage: bool,
) -> Result<(ProxyBody, RequestInfo, Option<Bytes>), hyper::Error>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
{
    let is_json = super::header_str(headers, header::CONTENT_TYPE).contains("json");
    let declared = body.size_hint().upper().unwrap_or(0) as usize;
    if !is_json || declared > max || body.is_end_stream() {
        // No body at all can be sent again as well as a whole one.
        let whole = body.is_end_stream().then(Bytes::new);
        return Ok((
            BodyExt::boxed(body.map_err(BoxError::from)),
            RequestInfo::default(),
            whole,
        ));
    }
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Some(data) = frame.data_ref() {
            buf.extend_from_slice(data);
        }
        if buf.len() > max {
            // Too large to read: forward what we have, then the rest as it comes.
            let prefixed = Prefixed {
                prefix: Some(buf.freeze()),
                rest: body,
            };
            return Ok((BodyExt::boxed(prefixed), RequestInfo::default(), None));
        }
    }
    let mut bytes = buf.freeze();
    let (mut info, layout) = request::read(&bytes);
    if inject_usage && info.stream && !info.include_usage {
        if let Some(rewritten) = inject::add_usage(path, &bytes, &layout) {
            headers.insert(header::CONTENT_LENGTH, rewritten.len().into());
            bytes = Bytes::from(rewritten);
            info.usage_injected = true;
        }
    }
    info.body_bytes = bytes.len() as u64;
    Ok((full(bytes.clone()), info, Some(bytes)))
}

/// A body that yields bytes already read, then the rest of the client's body.
#[pin_project]
pub struct Prefixed<B> {
    prefix: Option<Bytes>,
    #[pin]
    rest: B,
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(p) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        this.rest.poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut h = self.rest.size_hint();
        let p = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        h.set_lower(h.lower() + p);
        if let Some(u) = h.upper() {
            h.set_upper(u + p);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use std::collections::VecDeque;

    use http_body_util::Full;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    use super::*;
    use crate::proxy::metering::MeteringLayer;
    use crate::proxy::testing::{assert_has, metered, recorder, scrape};
    use crate::proxy::upgrades::UpgradesLayer;

    /// What the stub below the layer received.
    #[derive(Default)]
    struct Seen {
        body: Vec<u8>,
        content_length: Option<String>,
        info: Option<RequestInfo>,
        calls: usize,
    }

    /// Runs one request through `Inspect` over a stub that records what reached it.
    async fn run<B>(req: Request<B>, max: usize, inject: bool) -> (Response<ProxyBody>, Seen)
    where
        B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
    {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stub = {
            let seen = Arc::clone(&seen);
            service_fn(move |req: Request<ProxyBody>| {
                let seen = Arc::clone(&seen);
                async move {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect().await.expect("body").to_bytes();
                    let mut s = seen.lock().expect("lock");
                    s.calls += 1;
                    s.body = bytes.to_vec();
                    s.content_length = parts
                        .headers
                        .get(header::CONTENT_LENGTH)
                        .map(|v| v.to_str().expect("ascii").to_string());
                    Ok::<_, ProxyError>(Response::new(full(Bytes::from_static(b"ok"))))
                }
            })
        };
        let (_, rec) = recorder();
        let setting = if inject {
            inject::Setting::On
        } else {
            inject::Setting::Off
        };
        let svc = InspectLayer::new(max, Arc::new(Policy::new(setting))).layer(stub);
        let answer = svc.oneshot(metered(&rec, req)).await.expect("infallible");
        let mut seen = std::mem::take(&mut *seen.lock().expect("lock"));
        // What the meter was sent with.
        seen.info = answer.meter.request().cloned();
        (answer.inner.expect("a response"), seen)
    }

    /// A body of one data frame with the error type the server's `Incoming` has.
    fn body(
        bytes: &'static [u8],
    ) -> impl Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin {
        Full::new(Bytes::from_static(bytes)).map_err(|e: Infallible| match e {})
    }

    fn json(
        uri: &str,
        b: &'static [u8],
    ) -> Request<impl Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static>
    {
        Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body(b))
            .expect("request")
    }

    #[tokio::test]
    async fn a_json_body_is_read_for_its_model_and_forwarded_unchanged() {
        let raw: &[u8] = br#"{"model":"llama","stream":true,"messages":[]}"#;
        let (resp, seen) = run(json("/v1/chat/completions", raw), 1024, false).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(seen.body, raw);
        let info = seen.info.expect("inspected");
        assert_eq!(
            (info.model.as_deref(), info.stream, info.usage_injected),
            (Some("llama"), true, false)
        );
    }

    #[tokio::test]
    async fn inject_usage_rewrites_the_body_and_its_length() {
        let raw: &[u8] = br#"{"model":"m","stream":true}"#;
        let (_, seen) = run(json("/v1/chat/completions", raw), 1024, true).await;
        let want = r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#;
        assert_eq!(String::from_utf8(seen.body).expect("utf8"), want);
        assert_eq!(seen.content_length, Some(want.len().to_string()));
        assert!(seen.info.expect("inspected").usage_injected);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_streams_through_whole_and_unread() {
        // Two frames: the first alone is over the limit, so the second is never read here.
        let frames: Vec<Result<Frame<Bytes>, hyper::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(br#"{"model":"big","#))),
            Ok(Frame::data(Bytes::from_static(br#""stream":true}"#))),
        ];
        let req = Request::post("/v1/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Frames(frames.into()))
            .expect("request");
        let (_, seen) = run(req, 8, true).await;
        assert_eq!(seen.body, br#"{"model":"big","stream":true}"#);
        assert_eq!(seen.info.expect("inspected"), RequestInfo::default());
    }

    #[tokio::test]
    async fn a_body_that_fails_is_refused_and_metered_once() {
        let (metrics, rec) = recorder();
        let svc = stack(rec);
        let frames: Vec<Result<Frame<Bytes>, hyper::Error>> = vec![Err(hyper_error().await)];
        let req = Request::post("/v1/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Frames(frames.into()))
            .expect("request");
        let resp = svc.oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), 400);
        let want = r#"tokenmeter_requests_total{api="unknown",code="400",model="unknown",outcome="bad_request"} 1"#;
        assert_has(&scrape(&metrics), want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gone_while_its_body_is_read_is_metered_once() {
        let (metrics, rec) = recorder();
        let svc = stack(rec);
        let req = Request::post("/v1/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Silent)
            .expect("request");
        // What hyper does when the connection closes: the service future is dropped.
        let gave_up = tokio::time::timeout(std::time::Duration::from_secs(1), svc.oneshot(req));
        assert!(gave_up.await.is_err(), "the body never ends");
        let text = scrape(&metrics);
        let want = r#"tokenmeter_requests_total{api="unknown",code="502",model="unknown",outcome="client_disconnect"} 1"#;
        assert_has(&text, want);
        assert!(!text.contains("bad_request"), "{text}");
    }

    /// Metering over inspection over a stub upstream that answers every request: a request
    /// inspection refuses is recorded by the layer that records every request.
    fn stack<B>(
        rec: Arc<crate::meter::Recorder>,
    ) -> impl Service<Request<B>, Response = Response<ProxyBody>, Error = Infallible>
    where
        B: Body<Data = Bytes, Error = hyper::Error> + Send + Sync + Unpin + 'static,
    {
        let stub = service_fn(|_req: Request<ProxyBody>| async {
            Ok::<_, ProxyError>(Response::new(full(Bytes::new())))
        });
        ServiceBuilder::new()
            .layer(MeteringLayer::new(rec, None))
            .layer(UpgradesLayer)
            .layer(InspectLayer::new(
                1024,
                Arc::new(Policy::new(inject::Setting::Off)),
            ))
            .service(stub)
    }

    /// A client body that never sends anything.
    struct Silent;

    impl Body for Silent {
        type Data = Bytes;
        type Error = hyper::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
            Poll::Pending
        }
    }

    /// A client body of the given frames (or errors), each ready at once, and no size hint.
    struct Frames(VecDeque<Result<Frame<Bytes>, hyper::Error>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = hyper::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    /// A real `hyper::Error` (they cannot be built directly): a connection that sends no head.
    async fn hyper_error() -> hyper::Error {
        let (client, server) = tokio::io::duplex(64);
        drop(server);
        let io = hyper_util::rt::TokioIo::new(client);
        match hyper::client::conn::http1::handshake::<_, Full<Bytes>>(io).await {
            Ok((mut send, conn)) => {
                tokio::spawn(conn);
                let req = Request::get("/")
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                send.send_request(req).await.expect_err("peer is gone")
            }
            Err(e) => e,
        }
    }
}
