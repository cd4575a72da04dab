//! The metrics listener: `/metrics`, `/healthz` and `/readyz`, and the page ([`crate::ui`]:
//! `/`, `/api/summary`) unless `--no-ui`.
//!
//! It is a separate listener from the proxy so that scraping and probing never compete with
//! (or get forwarded as) inference traffic, and so it can be kept off the public network.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::drain::Connections;
use crate::metrics::Metrics;
use crate::overload::Limiter;
use crate::ui::Ui;

/// Whether the proxy should get new traffic: not while it drains, nor while it is at its
/// in-flight cap (until it is back to the low-water mark, [`crate::overload`]), nor while its
/// open connections are near `--max-connections` ([`Connections::is_crowded`]).
#[derive(Debug, Default)]
pub struct Readiness {
    draining: AtomicBool,
    limiter: Option<Arc<Limiter>>,
    connections: Option<Arc<Connections>>,
}

impl Readiness {
    /// Readiness that also reports the limiter's overload.
    pub fn with_limiter(limiter: Arc<Limiter>) -> Self {
        Readiness {
            limiter: Some(limiter),
            ..Readiness::default()
        }
    }

    /// And the crowding of the proxy listener's connections.
    pub fn with_connections(self, connections: Arc<Connections>) -> Self {
        Readiness {
            connections: Some(connections),
            ..self
        }
    }

    /// At the in-flight cap, and not yet back to the low-water mark.
    pub fn is_overloaded(&self) -> bool {
        self.limiter.as_ref().is_some_and(|l| l.is_overloaded())
    }

    /// Open connections near `--max-connections`, and not yet back to 90% of it.
    pub fn is_crowded(&self) -> bool {
        self.connections.as_ref().is_some_and(|c| c.is_crowded())
    }

    /// From now on `/readyz` answers 503.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// Answers one admin request (without the page).
pub fn handle<B>(
    req: &Request<B>,
    metrics: &Metrics,
    ready: &Arc<Readiness>,
) -> Response<Full<Bytes>> {
    handle_with_ui(req, metrics, ready, None)
}

/// Answers one admin request; `ui` serves the page's paths when it is on.
pub fn handle_with_ui<B>(
    req: &Request<B>,
    metrics: &Metrics,
    ready: &Arc<Readiness>,
    ui: Option<&Ui>,
) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let path = req.uri().path();
    if let Some(page) = ui.and_then(|ui| ui.respond(path)) {
        return page;
    }
    match path {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready.is_draining() => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" if ready.is_overloaded() => text(StatusCode::SERVICE_UNAVAILABLE, "overloaded\n"),
        "/readyz" if ready.is_crowded() => {
            text(StatusCode::SERVICE_UNAVAILABLE, "near --max-connections\n")
        }
        "/readyz" => text(StatusCode::OK, "ready\n"),
        _ if ui.is_some() => text(
            StatusCode::NOT_FOUND,
            "not found: try /, /api/summary, /metrics, /healthz or /readyz\n",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}
