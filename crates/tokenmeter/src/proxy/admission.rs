//! Admission, the layer under upgrades (metering, then upgrades, then this): a request is
//! proxied only with a place under `--max-in-flight` ([`crate::overload`]).
//!
//! The place is taken when the request head arrives and kept in the response body
//! ([`Admitted`]), so a stream counts until its body ends, fails or is dropped, not merely until
//! its head is sent. At the cap the request is shed here, before its body is read: tokenmeter
//! answers itself, at once, `503` with `Retry-After` and an OpenAI-shaped JSON error of type
//! `overloaded`; nothing reaches the upstream. The refusal goes back up as an error, like any
//! other, and the metering layer records it as outcome `shed`. Requests already admitted are
//! untouched.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use tower::{Layer, Service};

use super::metering::{Answer, Metered};
use super::ProxyError;
use crate::error::BoxError;
use crate::overload::{Limiter, Permit};
use crate::ratelog::{RateLimited, LOG_PERIOD};

/// Builds [`Admission`] services.
#[derive(Clone)]
pub struct AdmissionLayer {
    limiter: Arc<Limiter>,
    retry_after: u32,
    shedding: Arc<RateLimited<()>>,
}

/// Admits a request under the cap, or sheds it.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    limiter: Arc<Limiter>,
    retry_after: u32,
    /// One warning a minute while requests are shed, not one per request.
    shedding: Arc<RateLimited<()>>,
}

// === impl AdmissionLayer ===

impl AdmissionLayer {
    /// `retry_after` is `--retry-after`, in seconds.
    pub fn new(limiter: Arc<Limiter>, retry_after: u32) -> Self {
        AdmissionLayer {
            limiter,
            retry_after,
            shedding: Arc::new(RateLimited::new(LOG_PERIOD)),
        }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission {
            inner,
            limiter: Arc::clone(&self.limiter),
            retry_after: self.retry_after,
            shedding: Arc::clone(&self.shedding),
        }
    }
}

// === impl Admission ===

impl<S, B, R> Service<Metered<Request<B>>> for Admission<S>
where
    S: Service<Metered<Request<B>>, Response = Answer<R>>,
    R: Body,
{
    type Response = Answer<Admitted<R>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Metered<Request<B>>) -> Self::Future {
        match self.limiter.try_acquire() {
            Some(permit) => ResponseFuture::Admitted {
                inner: self.inner.call(req),
                permit: Some(permit),
            },
            None => {
                if let Some(held_back) = self.shedding.check((), Instant::now()) {
                    tracing::warn!(
                        max_in_flight = self.limiter.cap(),
                        shed_since_last_line = held_back,
                        "at --max-in-flight: new requests are shed (503)"
                    );
                }
                // The body is never read: hyper discards it, or closes the connection. So the
                // model stays `unknown`: reading the body for it would cost every shed request
                // what shedding saves (up to `--max-request-body`, and a wait on the client).
                let err = ProxyError::Overloaded {
                    retry_after: self.retry_after,
                };
                ResponseFuture::Shed {
                    refused: Some(Box::new(Metered {
                        meter: req.meter,
                        inner: err,
                    })),
                }
            }
        }
    }
}

/// The answer of an admitted request (its permit goes into the body), or a shed one's.
#[pin_project(project = ResponseFutureProj)]
pub enum ResponseFuture<F> {
    Admitted {
        #[pin]
        inner: F,
        permit: Option<Permit>,
    },
    /// Boxed: a meter is large, and only a shed request pays for the allocation.
    Shed {
        refused: Option<Box<Metered<ProxyError>>>,
    },
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Answer<R>, E>>,
    R: Body,
{
    type Output = Result<Answer<Admitted<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ResponseFutureProj::Admitted { inner, permit } => {
                let Metered { meter, inner } = ready!(inner.poll(cx))?;
                // An error gives the place back now; a response, when its body is done.
                let permit = permit.take();
                let inner = inner.map(|resp| resp.map(|body| Admitted::new(body, permit)));
                Poll::Ready(Ok(Metered { meter, inner }))
            }
            ResponseFutureProj::Shed { refused } => match refused.take().map(|r| *r) {
                Some(Metered { meter, inner: err }) => Poll::Ready(Ok(Metered {
                    meter,
                    inner: Err(err),
                })),
                None => Poll::Pending,
            },
        }
    }
}

/// A response body holding its request's place under the cap: given back when the body ends
/// (its last frame, `None`, or an error) or is dropped, whichever comes first. Frames pass
/// unchanged, in the same poll.
#[pin_project]
pub struct Admitted<B> {
    #[pin]
    inner: B,
    permit: Option<Permit>,
}

impl<B: Body> Admitted<B> {
    fn new(inner: B, permit: Option<Permit>) -> Self {
        let mut permit = permit;
        // A body with nothing to send (a 101, a 204) may never be polled.
        if inner.is_end_stream() {
            permit = None;
        }
        Admitted { inner, permit }
    }
}

impl<B> Body for Admitted<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => inner.is_end_stream(),
        };
        if ended {
            *this.permit = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{header, Response};
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    use super::*;
    use crate::proxy::metering::MeteringLayer;
    use crate::proxy::testing::{assert_has, recorder, scrape};
    use crate::proxy::upgrades::UpgradesLayer;
    use crate::proxy::ProxyBody;

    /// A body fed frame by frame from the test.
    struct Channel(mpsc::UnboundedReceiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    /// An answer of `body` with the request's meter, as the layers below give it.
    fn answer(req: Metered<Request<ProxyBody>>, body: ProxyBody) -> Answer<ProxyBody> {
        Metered {
            meter: req.meter,
            inner: Ok(Response::new(body)),
        }
    }

    #[tokio::test]
    async fn a_place_is_held_until_the_body_ends_and_the_next_request_is_shed() {
        let (metrics, rec) = recorder();
        let limiter = Arc::new(Limiter::new(1));
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
        let called = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stub = {
            let called = Arc::clone(&called);
            service_fn(move |req: Metered<Request<ProxyBody>>| {
                called.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let rx = rx.lock().expect("lock").take().expect("called once");
                async move { Ok::<_, Infallible>(answer(req, BodyExt::boxed(Channel(rx)))) }
            })
        };
        let svc = ServiceBuilder::new()
            .layer(MeteringLayer::new(rec, None))
            .layer(UpgradesLayer)
            .layer(AdmissionLayer::new(Arc::clone(&limiter), 7))
            .service(stub);
        let req = || Request::post("/v1/chat/completions").body(super::super::full(Bytes::new()));
        let resp = svc.clone().oneshot(req().expect("req")).await.expect("ok");
        // Headers sent, body streaming: still in flight.
        assert_eq!(limiter.in_flight(), 1);
        let shed = svc.clone().oneshot(req().expect("req")).await.expect("ok");
        assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(shed.status(), 503);
        assert_eq!(shed.headers()[header::RETRY_AFTER], "7");
        assert_eq!(shed.headers()[header::CONTENT_TYPE], "application/json");
        let body = shed.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["error"]["type"], "overloaded");
        assert_eq!(v["error"]["code"], 503);
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert_has(
            &scrape(&metrics),
            r#"tokenmeter_requests_total{api="unknown",code="503",model="unknown",outcome="shed"} 1"#,
        );
        // The stream goes on; its place is given back at its end, not before.
        let mut body = resp.into_body();
        tx.send(Bytes::from_static(b"data: x\n\n")).expect("send");
        let frame = body.frame().await.expect("frame").expect("ok");
        assert_eq!(frame.into_data().expect("data"), "data: x\n\n");
        assert_eq!(limiter.in_flight(), 1);
        drop(tx);
        assert!(body.frame().await.is_none());
        assert_eq!(limiter.in_flight(), 0);
        drop(body);
        assert_eq!(limiter.in_flight(), 0, "given back once");
    }

    #[tokio::test]
    async fn a_dropped_body_or_request_gives_its_place_back() {
        let (_, rec) = recorder();
        let limiter = Arc::new(Limiter::new(2));
        let stub = service_fn(|req: Metered<Request<ProxyBody>>| async {
            let body = super::super::full(Bytes::from_static(b"x"));
            Ok::<_, Infallible>(answer(req, body))
        });
        let svc = ServiceBuilder::new()
            .layer(MeteringLayer::new(rec, None))
            .layer(UpgradesLayer)
            .layer(AdmissionLayer::new(Arc::clone(&limiter), 1))
            .service(stub);
        let req = || {
            Request::get("/v1/models")
                .body(super::super::full(Bytes::new()))
                .expect("req")
        };
        let resp = svc.clone().oneshot(req()).await.expect("ok");
        assert_eq!(limiter.in_flight(), 1);
        drop(resp);
        assert_eq!(limiter.in_flight(), 0);
        // A client gone before the response head: the future is dropped with the permit.
        let mut s = svc.clone();
        let fut = s.call(req());
        assert_eq!(limiter.in_flight(), 1);
        drop(fut);
        assert_eq!(limiter.in_flight(), 0);
    }
}
