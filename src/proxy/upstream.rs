//! The bottom of the stack: the pooled client that talks to the upstream.
//!
//! A request is rewritten for the upstream: the upstream's origin and base path before the
//! client's path and query, the HTTP version the upstream speaks (a client may speak HTTP/2 to
//! us and the upstream HTTP/1.1, or the other way round), hop-by-hop headers and `Host` dropped
//! (the client sets `Host` from the URI). The response's hop-by-hop headers are dropped too;
//! everything else passes both ways as it is. A URI that cannot be rewritten is
//! [`ProxyError::BadUri`] (400); a connection that fails before the response head is
//! [`ProxyError::Unavailable`] (502).

use std::task::{Context, Poll};

use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::Service;

use super::{BoxFuture, ProxyBody, ProxyError};
use crate::config::{Config, Upstream as Target};

/// Sends requests to the one upstream over a shared connection pool.
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, ProxyBody>,
    target: Target,
    http2: bool,
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
    pub fn new(cfg: &Config) -> Self {
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
        Upstream {
            client,
            target: cfg.upstream.clone(),
            http2: cfg.upstream_http2,
        }
    }

    /// The client's request as the upstream gets it.
    fn rewrite(&self, req: Request<ProxyBody>) -> Result<Request<ProxyBody>, ProxyError> {
        let (mut parts, body) = req.into_parts();
        parts.uri = upstream_uri(&self.target, &parts.uri).map_err(ProxyError::BadUri)?;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        parts.version = if self.http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        Ok(Request::from_parts(parts, body))
    }
}

impl Service<Request<ProxyBody>> for Upstream {
    type Response = Response<Incoming>;
    type Error = ProxyError;
    type Future = BoxFuture<Result<Response<Incoming>, ProxyError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        // The pool queues for a connection inside the request future, never here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ProxyBody>) -> Self::Future {
        let req = match self.rewrite(req) {
            Ok(req) => req,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let sent = self.client.request(req);
        Box::pin(async move {
            match sent.await {
                Ok(resp) => {
                    let (mut parts, body) = resp.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    Ok(Response::from_parts(parts, body))
                }
                Err(e) => {
                    let err = ProxyError::Unavailable(e);
                    tracing::warn!(error = %err, "upstream request failed");
                    Err(err)
                }
            }
        })
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
    use clap::Parser;
    use http::HeaderValue;

    use super::*;
    use crate::config::ProxyArgs;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        proxy: ProxyArgs,
    }

    fn upstream(flags: &[&str]) -> Upstream {
        let mut argv = vec!["tokenmeter"];
        argv.extend_from_slice(flags);
        let cfg = Args::try_parse_from(argv)
            .expect("flags parse")
            .proxy
            .validate()
            .expect("valid config");
        Upstream::new(&cfg)
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
        for (flags, version) in [
            (
                &["--upstream", "http://10.0.0.7:8000/base/"][..],
                http::Version::HTTP_11,
            ),
            (
                &[
                    "--upstream",
                    "http://10.0.0.7:8000/base",
                    "--upstream-http2",
                ][..],
                http::Version::HTTP_2,
            ),
        ] {
            let up = upstream(flags);
            let req = Request::post("http://proxy.local/v1/chat/completions?x=1")
                .version(http::Version::HTTP_2)
                .header(header::HOST, "proxy.local")
                .header(header::TE, "trailers")
                .header(header::AUTHORIZATION, "Bearer k")
                .body(super::super::full(Bytes::new()))
                .expect("request");
            let out = up.rewrite(req).expect("rewritten");
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
