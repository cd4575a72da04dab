//! The request path: a `tower` service stack, composed in one place, [`stack`].
//!
//! Read [`stack`] top to bottom to follow a request. Each layer is one file and one idea:
//!
//! 0. [`metering`]: receives the request's [`Meter`](crate::meter::Meter) with its head. The
//!    meter goes down the stack beside the request ([`metering::Metered`]) and comes back with
//!    the response or the error; here every error becomes its JSON response and outcome, and a
//!    response body is wrapped in the [`TapBody`](crate::tap::TapBody) over the
//!    [`IdleBody`](crate::idle::IdleBody) that holds `--idle-timeout` (and, when usage was
//!    injected into an SSE stream, in [`StripUsage`](crate::inject::StripUsage) outside it).
//! 1. [`upgrades`]: takes the client's half of an upgrade (WebSocket) on the way down; on the
//!    upstream's `101` it joins the two connections in a task that holds the meter and ends it
//!    with outcome `upgraded` when they close.
//! 2. [`admission`]: a place under `--max-in-flight`, held until the response body ends; at the
//!    cap the request is shed at once, before its body is read: 503 with `Retry-After`, outcome
//!    `shed`, nothing sent upstream.
//! 3. [`inspect`]: reads a JSON body up to `--max-request-body` to learn the model (an inference
//!    server cannot start before it has the whole body anyway, so this costs no latency),
//!    applies `--inject-usage`'s request rewrite, and sends the meter with what it learnt: the
//!    request is in flight from then on. A body it cannot read is refused: 400, outcome
//!    `bad_request`.
//! 4. [`timeout`]: `--upstream-timeout` on the response head: 504 `upstream_timeout`.
//! 5. [`upstream`]: the pooled client over the `http://`/`https://` connector
//!    ([`crate::tls::client`]). It rewrites the head for the upstream (origin, base path, HTTP
//!    version, hop-by-hop headers and `Host` dropped; an upgrade keeps its two) and maps a
//!    connection failure to a 502 whose `cause` names it (`unavailable`, `connect_timeout`, a
//!    certificate's problem). Each HTTP version has its own client, and [`version`] chooses
//!    one once for the process (`https://` by the first connection's ALPN): HTTP/1.1 goes
//!    through [`pool`], whose connections are driven by the response body in the client
//!    connection's task; HTTP/2 through hyper-util's client; upgrades through an HTTP/1.1
//!    client of their own.
//!
//! The stack has two request types, and one place where the first becomes the second: from
//! [`metering`] down to [`inspect`] a request travels with its meter as one value
//! ([`metering::Metered`]); [`inspect`] sends the meter and calls the layers below with the
//! plain `Request<ProxyBody>`, holding the meter in its future until the answer comes back, so
//! [`timeout`] and [`upstream`] never see a meter. [`stack`] says so where it composes them.
//!
//! Errors travel up as [`ProxyError`], which alone decides a refusal's status code, JSON body and
//! outcome. **Invariant:** every request is metered exactly once, whichever way it ends: it has
//! one meter from its head on, a value that moves down and back up the stack and ends in one of
//! the three places [`metering`] names (an error, the tap, or its drop when the client left),
//! or, for an upgrade, in the task [`upgrades`] joins it in.
//! The proxy never fails a request for a reason of its own other than those in [`ProxyError`],
//! and never answers 400 for an upstream's failure.
//!
//! Beside the layers: `pool/wake.rs` is the waker a pooled connection is polled with, so that
//! handing a chunk to the body does not wake the task doing it (one poll of the task per chunk);
//! `resend.rs` is the proxy's own rule for sending a request again: `inspect` marks a body it read
//! whole (`Replayable`), the pool asks for a copy (`resend::again`), and neither knows the other;
//! `settings.rs` holds `Settings`, the layers' own settings.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tower::ServiceBuilder;

use crate::error::BoxError;
use crate::inject;
use crate::meter::Recorder;
use crate::overload::Limiter;
use crate::record::Outcome;
use crate::tls::client::{self as tls_client, ClientTls, Failure};
use crate::tokenize::Tokenizers;

pub mod admission;
pub mod inspect;
pub mod metering;
pub mod pool;
pub mod resend;
pub mod settings;
#[cfg(test)]
mod testing;
pub mod timeout;
pub mod upgrades;
pub mod upstream;
pub mod version;

pub use settings::{
    Admission, Settings, Target, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_REQUEST_BODY, DEFAULT_POOL_IDLE_TIMEOUT,
    DEFAULT_RETRY_AFTER, DEFAULT_UPSTREAM_TIMEOUT,
};

/// The body type on both sides of the proxy.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// The future every layer returns. Boxing the inner future before an `async` block awaits it
/// also keeps the compiler from asking that future to be `Send` for every lifetime.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The whole request path, outermost layer first (what [`stack`] builds).
pub type Proxy = metering::Metering<
    upgrades::Upgrades<
        admission::Admission<inspect::Inspect<timeout::Timeout<upstream::Upstream>>>,
    >,
>;

/// Builds the request path. It reads top to bottom, the order a request passes the layers.
///
/// The result is a `tower::Service<Request<Incoming>>` that never fails (every error is a
/// response) and is cheap to clone (one clone per request; the client pool is shared).
/// `limiter` counts the requests in flight (`--max-in-flight`); `/readyz` reads it too.
pub fn stack(
    cfg: &Settings,
    recorder: Arc<Recorder>,
    tls: &ClientTls,
    limiter: Arc<Limiter>,
    inject: Arc<inject::Policy>,
    tokenizers: Option<Arc<Tokenizers>>,
) -> Proxy {
    ServiceBuilder::new()
        .layer(metering::MeteringLayer::new(recorder, cfg.idle_timeout))
        .layer(upgrades::UpgradesLayer)
        .layer(admission::AdmissionLayer::new(
            limiter,
            cfg.admission.retry_after,
        ))
        // Above: `Metered<Request>`. Inspect sends the meter; below: `Request<ProxyBody>`.
        .layer(inspect::InspectLayer::new(cfg.max_request_body, inject).with_tokenizers(tokenizers))
        .layer(timeout::TimeoutLayer::new(cfg.upstream_timeout))
        .service(upstream::Upstream::new(cfg, tls))
}

/// Why the proxy answered a request itself instead of forwarding the upstream's response.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client's request body failed while it was read (a reset, a framing error).
    #[error("{0}")]
    RequestBody(#[source] hyper::Error),
    /// The request's URI cannot be forwarded to the upstream.
    #[error("{0}")]
    BadUri(#[source] http::Error),
    /// No response head within `--upstream-timeout`.
    #[error("upstream sent no response headers within {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream could not be reached, or failed before its response head.
    /// (hyper-util's error for HTTP/2, TLS and upgrades; the pool's for plain HTTP/1.1.)
    #[error("{}", tls_client::message(Failure::classify(&**.0), &**.0))]
    Unavailable(#[source] BoxError),
    /// `--max-in-flight` requests are being proxied already: shed, never sent upstream.
    #[error("tokenmeter is at its limit of requests in flight; retry in {retry_after} s")]
    Overloaded { retry_after: u32 },
}

// === impl ProxyError ===

impl ProxyError {
    /// The status code the client gets, and the `code` label.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::RequestBody(_) | ProxyError::BadUri(_) => StatusCode::BAD_REQUEST,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Unavailable(_) => StatusCode::BAD_GATEWAY,
            ProxyError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `type` field of the JSON error body.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::RequestBody(_) => "request_body",
            ProxyError::BadUri(_) => "bad_uri",
            ProxyError::UpstreamTimeout(_) => "upstream_timeout",
            ProxyError::Unavailable(e) => Failure::classify(&**e).kind(),
            ProxyError::Overloaded { .. } => "overloaded",
        }
    }

    /// Why the upstream could not be reached (the JSON body's `cause`), for a 502.
    pub fn cause(&self) -> Option<&'static str> {
        match self {
            ProxyError::Unavailable(e) => Some(Failure::classify(&**e).as_str()),
            _ => None,
        }
    }

    /// The `outcome` label: the client's fault, the upstream's slowness, or its failure.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::RequestBody(_) | ProxyError::BadUri(_) => Outcome::BadRequest,
            ProxyError::UpstreamTimeout(_) => Outcome::Timeout,
            ProxyError::Unavailable(_) => Outcome::UpstreamError,
            ProxyError::Overloaded { .. } => Outcome::Shed,
        }
    }

    /// The JSON error response the client gets.
    pub fn to_response(&self) -> Response<ProxyBody> {
        let mut body = error_body(self.status(), self.kind(), &self.to_string());
        if let (Some(cause), Some(e)) = (self.cause(), body.get_mut("error")) {
            e["cause"] = cause.into();
        }
        let mut resp = json_response(self.status(), &body);
        if let ProxyError::Overloaded { retry_after } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        resp
    }
}

/// An OpenAI-style JSON error, so SDKs show the message.
fn error_body(status: StatusCode, kind: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16(), "source": "tokenmeter"}
    })
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A header's value as text, or "" when it is absent or not visible ASCII.
fn header_str(headers: &http::HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A body of bytes already in hand.
fn full(bytes: Bytes) -> ProxyBody {
    BodyExt::boxed(Full::new(bytes).map_err(|e: Infallible| match e {}))
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn an_error_response_is_openai_shaped_json() {
        let err = ProxyError::UpstreamTimeout(Duration::from_millis(1500));
        assert_eq!(err.outcome(), Outcome::Timeout);
        let resp = err.to_response();
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"error": {
                "message": "upstream sent no response headers within 1.5s",
                "type": "upstream_timeout", "code": 504, "source": "tokenmeter"}})
        );
    }
}
