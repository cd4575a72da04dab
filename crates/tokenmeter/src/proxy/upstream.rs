//! The bottom of the stack: the pooled client that talks to the upstream.
//!
//! A request is rewritten for the upstream: the upstream's origin and base path before the
//! client's path and query, the HTTP version the upstream speaks (a client may speak HTTP/2 to
//! us and the upstream HTTP/1.1, or the other way round), hop-by-hop headers and `Host` dropped
//! (the client sets `Host` from the URI). The response's hop-by-hop headers are dropped too;
//! everything else passes both ways as it is. A URI that cannot be rewritten is
//! [`ProxyError::BadUri`] (400); a connection that fails before the response head is
//! [`ProxyError::Unavailable`] (502), logged once per cause and minute ([`RateLimited`]): an
//! upstream whose certificate expired fails every request the same way.
//!
//! Each HTTP version has a client of its own over its own [`Connector`] (`http://` or `https://`,
//! within `--connect-timeout`), and [`VersionChoice`] names the one requests go to, once for the
//! process ([`super::version`]: `http://` is HTTP/1.1, `--upstream-http2` HTTP/2, `https://`
//! what ALPN settles on the first connection). An upgrade request
//! ([`crate::upgrade::requested`]) keeps `Connection: upgrade` and `Upgrade`, and goes over a
//! client of its own that speaks only HTTP/1.1 (HTTP/2 has no `Upgrade`, and an upgraded
//! connection never returns to a pool). Its `101` keeps `Connection: upgrade` and `Upgrade` too;
//! the connection is joined above, in [`super::upgrades`], from hyper's handles on both sides.
//!
//! HTTP/1.1 goes through [`Pool`], whose connections the response body drives in the client
//! connection's task, and which sends again a request a reused connection lost; there the
//! request line carries the path (origin form) and `Host` the upstream's authority, as
//! hyper-util's client writes them. HTTP/2 goes through hyper-util's client, whose one
//! connection carries every request at once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::Service;

use super::pool::{Pool, PooledBody};
use super::settings::{Settings, Target};
use super::version::{UpstreamVersion, VersionChoice};
use super::{BoxFuture, ProxyBody, ProxyError};
use crate::error::BoxError;
use crate::ratelog::RateLimited;
use crate::tls::client::{error_chain, Alpn, ClientTls, Conn, Connector, Failure};
use crate::upgrade;

/// Sends requests to the one upstream over a shared connection pool.
///
/// The stack is cloned for every request, so all of it sits behind one `Arc`: a clone is one
/// count, not a count for each of hyper-util's two clients, the pool and the target.
#[derive(Clone)]
pub struct Upstream(Arc<Shared>);

struct Shared {
    /// HTTP/1.1: plain, or over TLS offering only `http/1.1`.
    http1: Pool,
    /// HTTP/2: prior knowledge, or over TLS offering only `h2`.
    http2: Client<Connector, ProxyBody>,
    /// Upgrade requests: HTTP/1.1, a client of their own (an upgraded connection never
    /// returns to a pool).
    upgrades: Client<Connector, ProxyBody>,
    /// Which of `http1` and `http2` the other requests go to.
    version: VersionChoice,
    target: Target,
    failures: Arc<RateLimited<Failure>>,
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

// === impl Upstream ===

impl Upstream {
    /// `tls` is the loaded `--upstream-ca`/client certificate (unused for `http://`).
    pub fn new(cfg: &Settings, tls: &ClientTls) -> Self {
        let connector = |alpn| tls.connector(alpn, cfg.connect_timeout);
        let client = |alpn, http2_only| {
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(cfg.pool_idle_timeout)
                .http2_only(http2_only)
                .build(connector(alpn))
        };
        let origin = cfg.upstream.origin.clone();
        let version = if cfg.upstream_http2 {
            VersionChoice::fixed(UpstreamVersion::Http2)
        } else if cfg.upstream.is_https() {
            VersionChoice::by_alpn(connector(Alpn::Negotiate), origin.clone())
        } else {
            VersionChoice::fixed(UpstreamVersion::Http1)
        };
        Upstream(Arc::new(Shared {
            http1: Pool::new(origin, connector(Alpn::Http1), cfg.pool_idle_timeout),
            http2: client(Alpn::Http2, true),
            upgrades: client(Alpn::Http1, false),
            version,
            target: cfg.upstream.clone(),
            failures: Arc::default(),
        }))
    }
}

impl Shared {
    /// The client's request as the upstream gets it, in HTTP/1.1 ([`in_http2`] for the other).
    /// `upgrade` is the `Upgrade` value of an upgrade request, kept with `Connection: upgrade`.
    fn rewrite(
        &self,
        req: Request<ProxyBody>,
        upgrade: Option<&http::HeaderValue>,
    ) -> Result<Request<ProxyBody>, ProxyError> {
        let (mut parts, body) = req.into_parts();
        parts.uri = upstream_uri(&self.target, &parts.uri).map_err(ProxyError::BadUri)?;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        parts.version = http::Version::HTTP_11;
        if let Some(u) = upgrade {
            upgrade::restore(&mut parts.headers, u.clone());
        }
        Ok(Request::from_parts(parts, body))
    }

    /// A request that is not an upgrade, to the client of the upstream's version: at once when
    /// the version is settled (every request but an `https://` upstream's first), else once
    /// the first connection has settled it.
    fn send(
        self: &Arc<Self>,
        req: Request<ProxyBody>,
    ) -> BoxFuture<Result<Response<UpstreamBody>, BoxError>> {
        match self.version.settled() {
            Some(UpstreamVersion::Http1) => pooled(&self.http1, req, None),
            Some(UpstreamVersion::Http2) => client_request(&self.http2, in_http2(req)),
            None => {
                let up = Arc::clone(self);
                Box::pin(async move {
                    match up.version.get().await? {
                        (UpstreamVersion::Http1, first) => pooled(&up.http1, req, first).await,
                        (UpstreamVersion::Http2, _) => {
                            client_request(&up.http2, in_http2(req)).await
                        }
                    }
                })
            }
        }
    }
}

/// A request through the HTTP/1.1 pool; `first` is the connection that settled the version.
fn pooled(
    pool: &Pool,
    req: Request<ProxyBody>,
    first: Option<Box<Conn>>,
) -> BoxFuture<Result<Response<UpstreamBody>, BoxError>> {
    let pool = pool.clone();
    Box::pin(async move {
        let resp = pool.send(req, first).await?;
        Ok(resp.map(UpstreamBody::Pooled))
    })
}

/// A rewritten request as HTTP/2 sends it.
fn in_http2(mut req: Request<ProxyBody>) -> Request<ProxyBody> {
    *req.version_mut() = http::Version::HTTP_2;
    req
}

/// The upstream's response body, from the pool or from hyper-util's client.
pub enum UpstreamBody {
    Pooled(PooledBody),
    Client(Incoming),
}

impl Service<Request<ProxyBody>> for Upstream {
    type Response = Response<UpstreamBody>;
    type Error = ProxyError;
    type Future = BoxFuture<Result<Response<UpstreamBody>, ProxyError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        // The pool queues for a connection inside the request future, never here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ProxyBody>) -> Self::Future {
        let asked = upgrade::requested(req.headers());
        let up = &self.0;
        let req = match up.rewrite(req, asked.as_ref()) {
            Ok(req) => req,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let sent: BoxFuture<Result<Response<UpstreamBody>, BoxError>> = match asked {
            Some(_) => client_request(&up.upgrades, req),
            None => up.send(req),
        };
        let failures = Arc::clone(&up.failures);
        Box::pin(async move {
            match sent.await {
                Ok(resp) => {
                    let (mut parts, body) = resp.into_parts();
                    let switched =
                        asked.is_some() && parts.status == StatusCode::SWITCHING_PROTOCOLS;
                    let agreed = parts.headers.get(header::UPGRADE).cloned();
                    strip_hop_by_hop(&mut parts.headers);
                    // The upgrade's answer keeps its two headers; the upgrades layer joins it.
                    if let (true, Some(agreed)) = (switched, agreed) {
                        upgrade::restore(&mut parts.headers, agreed);
                    }
                    Ok(Response::from_parts(parts, body))
                }
                Err(e) => {
                    let failure = Failure::classify(&*e);
                    if let Some(held_back) = failures.check(failure, Instant::now()) {
                        tracing::warn!(
                            cause = failure.as_str(),
                            held_back,
                            error = %error_chain(&*e),
                            "upstream request failed (logged once a minute per cause)"
                        );
                    }
                    Err(ProxyError::Unavailable(e))
                }
            }
        })
    }
}

/// A request through hyper-util's client.
fn client_request(
    client: &Client<Connector, ProxyBody>,
    req: Request<ProxyBody>,
) -> BoxFuture<Result<Response<UpstreamBody>, BoxError>> {
    let sent = client.request(req);
    Box::pin(async move {
        let resp = sent.await?;
        Ok(resp.map(UpstreamBody::Client))
    })
}

// === impl UpstreamBody ===

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            UpstreamBody::Pooled(b) => Pin::new(b).poll_frame(cx),
            UpstreamBody::Client(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Pooled(b) => b.is_end_stream(),
            UpstreamBody::Client(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Pooled(b) => b.size_hint(),
            UpstreamBody::Client(b) => b.size_hint(),
        }
    }
}

/// The upstream's origin and base path, then the client's path and query.
fn upstream_uri(target: &Target, uri: &Uri) -> Result<Uri, http::Error> {
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    let origin = &target.origin;
    let mut b = Uri::builder();
    if let Some(s) = origin.scheme() {
        b = b.scheme(s.clone());
    }
    if let Some(a) = origin.authority() {
        b = b.authority(a.clone());
    }
    b.path_and_query(format!("{}{}", target.base_path, pq))
        .build()
}

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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderValue;

    use super::*;
    use crate::tls::client::UpstreamTls;

    /// The upstream of settings built directly: `http://10.0.0.7:8000` with the path prefix
    /// `/base`, HTTP/2 or not.
    fn upstream(http2: bool) -> Upstream {
        let target = Target {
            origin: Uri::from_static("http://10.0.0.7:8000/"),
            base_path: "/base".to_string(),
        };
        let settings = Settings {
            upstream_http2: http2,
            ..Settings::new(target)
        };
        let tls = UpstreamTls::default().load(false).expect("tls");
        Upstream::new(&settings, &tls)
    }

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

    #[tokio::test]
    async fn the_head_is_rewritten_for_the_upstream() {
        for (http2, version) in [
            (false, http::Version::HTTP_11),
            (true, http::Version::HTTP_2),
        ] {
            let up = upstream(http2);
            let req = Request::post("http://proxy.local/v1/chat/completions?x=1")
                .version(http::Version::HTTP_2)
                .header(header::HOST, "proxy.local")
                .header(header::TE, "trailers")
                .header(header::AUTHORIZATION, "Bearer k")
                .body(super::super::full(Bytes::new()))
                .expect("request");
            let out = up.0.rewrite(req, None).expect("rewritten");
            // As `Shared::send` sends it: in the version the settings fixed.
            let out = match up.0.version.get().await.expect("fixed") {
                (UpstreamVersion::Http1, _) => out,
                (UpstreamVersion::Http2, _) => in_http2(out),
            };
            assert_eq!(
                out.uri(),
                "http://10.0.0.7:8000/base/v1/chat/completions?x=1"
            );
            assert_eq!(out.version(), version);
            let mut names: Vec<&str> = out.headers().keys().map(|k| k.as_str()).collect();
            names.sort();
            assert_eq!(names, ["authorization"]);
        }
    }
}
