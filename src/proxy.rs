//! Forwarding one request: the least code between accept and the upstream.
//!
//! [`Proxy::handle`] reads a JSON request body (up to `--max-request-body`, to learn the model;
//! an inference server cannot start before it has the whole body anyway), sends the request with
//! a pooled client, and wraps the response body in a [`TapBody`] that meters it on the way
//! through. Hop-by-hop headers are dropped both ways; everything else is passed as it is. An
//! upstream that cannot be reached gives a 502 and one that does not answer in time a 504, each
//! with a JSON error body, and each is counted.
//!
//! The one opt-in rewrite, `--inject-usage`, happens here too: the request body gets
//! `stream_options.include_usage` and the response is wrapped in [`crate::inject::StripUsage`]
//! outside the tap, so the meter sees the usage chunk and the client does not.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use pin_project::pin_project;

use crate::config::{Config, Upstream};
use crate::inject::{self, StripUsage};
use crate::meter::Recorder;
use crate::metrics::Outcome;
use crate::protocol::request::{self, RequestInfo};
use crate::tap::{BoxError, TapBody};

/// The body type on both sides of the proxy.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// Forwards requests to one upstream and meters the responses.
pub struct Proxy {
    client: Client<HttpConnector, ProxyBody>,
    upstream: Upstream,
    recorder: Arc<Recorder>,
    max_request_body: usize,
    upstream_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    upstream_http2: bool,
    inject_usage: bool,
}

impl Proxy {
    pub fn new(cfg: &Config, recorder: Arc<Recorder>) -> Self {
        let mut connector = HttpConnector::new();
        // Off by default in hyper-util: Nagle would hold back small SSE writes.
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .http2_only(cfg.upstream_http2)
            .build(connector);
        Proxy {
            client,
            upstream: cfg.upstream.clone(),
            recorder,
            max_request_body: cfg.max_request_body,
            upstream_timeout: cfg.upstream_timeout,
            idle_timeout: cfg.idle_timeout,
            upstream_http2: cfg.upstream_http2,
            inject_usage: cfg.inject_usage,
        }
    }

    /// Handles one request. Never fails: upstream problems become 502/504 responses.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        // The client's wait starts when its request head has arrived, before its body.
        let arrived = Instant::now();
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let (body, info) = match self.read_body(&mut parts.headers, &path, body).await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "client request body failed");
                return error_response(StatusCode::BAD_REQUEST, "request_body", &e.to_string());
            }
        };
        let strip_usage = info.usage_injected;
        parts.uri = match self.upstream_uri(&parts.uri) {
            Ok(u) => u,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_uri", &e.to_string()),
        };
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        // The client may speak HTTP/2 to us and the upstream HTTP/1.1, or the other way round.
        parts.version = if self.upstream_http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        let upstream_req = Request::from_parts(parts, body);

        let mut meter = self.recorder.start_at(info, arrived);
        let sent = self.client.request(upstream_req);
        let result = match self.upstream_timeout {
            Some(t) => match tokio::time::timeout(t, sent).await {
                Ok(r) => r,
                Err(_) => {
                    meter.set_status(504);
                    meter.finish(Outcome::Timeout);
                    let msg = format!("upstream sent no response headers within {t:?}");
                    return error_response(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", &msg);
                }
            },
            None => sent.await,
        };
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                meter.set_status(502);
                meter.finish(Outcome::UpstreamError);
                tracing::warn!(error = %error_chain(&e), "upstream request failed");
                let msg = format!("upstream unavailable: {}", error_chain(&e));
                return error_response(StatusCode::BAD_GATEWAY, "upstream_unavailable", &msg);
            }
        };

        let (mut parts, body) = resp.into_parts();
        let content_type = header_str(&parts.headers, header::CONTENT_TYPE);
        let encoded = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes() != b"identity");
        meter.on_response(parts.status.as_u16(), &path, content_type, encoded);
        let strip_usage = strip_usage && content_type.starts_with("text/event-stream");
        strip_hop_by_hop(&mut parts.headers);
        let body = TapBody::new(body, meter, self.idle_timeout);
        if strip_usage {
            // The body loses the usage chunk: its length is no longer the upstream's.
            parts.headers.remove(header::CONTENT_LENGTH);
            return Response::from_parts(parts, BodyExt::boxed(StripUsage::new(body)));
        }
        Response::from_parts(parts, BodyExt::boxed(body))
    }

    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        let origin = &self.upstream.origin;
        let mut b = Uri::builder();
        if let Some(s) = origin.scheme() {
            b = b.scheme(s.clone());
        }
        if let Some(a) = origin.authority() {
            b = b.authority(a.clone());
        }
        b.path_and_query(format!("{}{}", self.upstream.base_path, pq))
            .build()
    }

    /// Reads a JSON body up to the limit; anything else, or anything larger, streams through.
    async fn read_body(
        &self,
        headers: &mut HeaderMap,
        path: &str,
        mut body: Incoming,
    ) -> Result<(ProxyBody, RequestInfo), hyper::Error> {
        let is_json = header_str(headers, header::CONTENT_TYPE).contains("json");
        let declared = body.size_hint().upper().unwrap_or(0) as usize;
        if !is_json || declared > self.max_request_body || body.is_end_stream() {
            return Ok((
                BodyExt::boxed(body.map_err(BoxError::from)),
                RequestInfo::default(),
            ));
        }
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Some(data) = frame.data_ref() {
                buf.extend_from_slice(data);
            }
            if buf.len() > self.max_request_body {
                // Too large to read: forward what we have, then the rest as it comes.
                let prefixed = Prefixed {
                    prefix: Some(buf.freeze()),
                    rest: body,
                };
                return Ok((BodyExt::boxed(prefixed), RequestInfo::default()));
            }
        }
        let mut bytes = buf.freeze();
        let mut info = request::inspect(&bytes);
        if self.inject_usage && info.stream && !info.include_usage {
            if let Some(rewritten) = inject::add_usage(path, &bytes) {
                headers.insert(header::CONTENT_LENGTH, rewritten.len().into());
                bytes = Bytes::from(rewritten);
                info.usage_injected = true;
            }
        }
        Ok((
            BodyExt::boxed(Full::new(bytes).map_err(|e| match e {})),
            info,
        ))
    }
}

/// A body that yields bytes already read, then the rest of the client's body.
#[pin_project]
struct Prefixed {
    prefix: Option<Bytes>,
    #[pin]
    rest: Incoming,
}

impl Body for Prefixed {
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
        this.rest.poll_frame(cx).map_err(BoxError::from)
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

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers the Connection header names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::TRAILER);
}

fn header_str(headers: &HeaderMap, name: HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The error and its sources, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// An OpenAI-style JSON error, so SDKs show the message.
pub fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16(), "source": "tokenmeter"}
    });
    let mut resp = Response::new(BodyExt::boxed(
        Full::new(Bytes::from(body.to_string())).map_err(|e| match e {}),
    ));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_the_rest_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["authorization", "content-type"]);
    }
}
