//! Upgrades (WebSocket), joined in a layer of their own, just below metering.
//!
//! A request that asks to upgrade ([`upgrade::requested`]) has its client's half taken here on
//! the way down (hyper resolves it once the `101` is written to the client); the layers below
//! forward it like any other request, and the upstream layer sends it with its two headers
//! over an HTTP/1.1 connection of its own. When the upstream agrees (`101` with `Upgrade`), the
//! upstream's half is taken from its response here, the meter leaves the in-flight gauges, and
//! a task joins the two connections ([`upgrade::join`]) while holding a place in the drain's
//! count; it finishes the meter with outcome `upgraded` when they close (or at the drain's
//! deadline). The metering layer gets the `101`'s head ([`Reply::Joined`]). Any other answer,
//! an upgrade the upstream refused included, goes up unchanged ([`Reply::Answer`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header;
use http::{Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use pin_project::pin_project;
use tower::{Layer, Service};

use super::metering::{Answer, Metered, Reply};
use super::{full, ProxyBody};
use crate::drain::Drain;
use crate::meter::Meter;
use crate::record::Outcome;
use crate::upgrade::{self, UpgradeError};

/// Builds [`Upgrades`] services.
#[derive(Clone, Copy, Default)]
pub struct UpgradesLayer;

/// Joins the connections of the upgrades the upstream agreed to.
#[derive(Clone)]
pub struct Upgrades<S> {
    inner: S,
}

impl<S> Layer<S> for UpgradesLayer {
    type Service = Upgrades<S>;

    fn layer(&self, inner: S) -> Upgrades<S> {
        Upgrades { inner }
    }
}

// === impl Upgrades ===

impl<S, R, B> Service<Metered<Request<R>>> for Upgrades<S>
where
    S: Service<Metered<Request<R>>, Response = Answer<B>, Error = Infallible>,
{
    type Response = Reply<B>;
    type Error = Infallible;
    type Future = Joining<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Metered<Request<R>>) -> Self::Future {
        let client =
            upgrade::requested(req.inner.headers()).map(|_| hyper::upgrade::on(&mut req.inner));
        // Only an upgrade outlives its response: no other request needs the drain's handle.
        let drain = client
            .as_ref()
            .and_then(|_| req.inner.extensions().get::<Drain>().cloned());
        Joining {
            inner: self.inner.call(req),
            client,
            drain,
        }
    }
}

/// The answer from below, joined when it is an upgrade's `101`. A future of its own rather
/// than a boxed one: every request passes this layer, and most are no upgrade.
#[pin_project]
pub struct Joining<F> {
    #[pin]
    inner: F,
    /// The client's half, when the request asked to upgrade.
    client: Option<OnUpgrade>,
    drain: Option<Drain>,
}

impl<F, B> Future for Joining<F>
where
    F: Future<Output = Result<Answer<B>, Infallible>>,
{
    type Output = Result<Reply<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(answer) = ready!(this.inner.poll(cx));
        let reply = match (this.client.take(), answer) {
            (
                Some(client),
                Metered {
                    meter,
                    inner: Ok(mut resp),
                },
            ) if agreed(&resp) => {
                let upstream = hyper::upgrade::on(&mut resp);
                Reply::Joined(join(resp, meter, (client, upstream), this.drain.take()))
            }
            (_, answer) => Reply::Answer(answer),
        };
        Poll::Ready(Ok(reply))
    }
}

/// The upstream switched protocols, and said to which.
fn agreed<B>(resp: &Response<B>) -> bool {
    resp.status() == StatusCode::SWITCHING_PROTOCOLS && resp.headers().contains_key(header::UPGRADE)
}

/// Joins an upgraded connection in a task of its own and answers the client's 101.
fn join<B>(
    resp: Response<B>,
    mut meter: Meter,
    (client, upstream): (OnUpgrade, OnUpgrade),
    drain: Option<Drain>,
) -> Response<ProxyBody> {
    meter.upgraded(Instant::now());
    // Counted as an open connection while joined: the drain waits for it.
    let held = drain.as_ref().map(Drain::hold);
    tokio::spawn(async move {
        let _held = held;
        let deadline = async move {
            match drain {
                Some(d) => d.deadline().await,
                None => std::future::pending().await,
            }
        };
        let outcome = match upgrade::join(client, upstream, deadline).await {
            Ok(bytes) => {
                tracing::debug!(
                    from_client = bytes.from_client,
                    from_upstream = bytes.from_upstream,
                    "upgraded connection closed"
                );
                Outcome::Upgraded
            }
            // Joined, then ended by a reset or the drain's deadline: it was an upgrade.
            Err(e @ (UpgradeError::Io(_) | UpgradeError::Stopped)) => {
                tracing::debug!(error = %e, "upgraded connection ended");
                Outcome::Upgraded
            }
            Err(e @ UpgradeError::Client(_)) => {
                tracing::debug!(error = %e, "client gone before the upgrade");
                Outcome::ClientDisconnect
            }
            Err(e @ UpgradeError::Upstream(_)) => {
                tracing::debug!(error = %e, "upstream gone before the upgrade");
                Outcome::UpstreamError
            }
        };
        meter.finish(outcome);
    });
    // A 101 has no body; what follows it is the joined connection.
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, full(Bytes::new()))
}
