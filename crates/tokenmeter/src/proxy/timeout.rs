//! `--upstream-timeout`: the longest wait for the upstream's response head.
//!
//! Only the head is timed: a stream may then run as long as it keeps sending (the tap's
//! `--idle-timeout` limits the silence between body frames). When the time is up the request
//! below is dropped, which cancels it upstream, and [`ProxyError::UpstreamTimeout`] goes up: a
//! 504 `upstream_timeout`, outcome `timeout`.

use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use super::{BoxFuture, ProxyError};

/// Builds [`Timeout`] services.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    limit: Option<Duration>,
}

/// Fails a request whose response head takes longer than the limit (`None`: no limit).
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Option<Duration>,
}

// === impl TimeoutLayer ===

impl TimeoutLayer {
    pub fn new(limit: Option<Duration>) -> Self {
        TimeoutLayer { limit }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            limit: self.limit,
        }
    }
}

// === impl Timeout ===

impl<S, R> Service<R> for Timeout<S>
where
    S: Service<R, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = ProxyError;
    type Future = BoxFuture<Result<S::Response, ProxyError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let sent = self.inner.call(req);
        let Some(limit) = self.limit else {
            return Box::pin(sent);
        };
        Box::pin(async move {
            match tokio::time::timeout(limit, sent).await {
                Ok(result) => result,
                Err(_) => Err(ProxyError::UpstreamTimeout(limit)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use tower::{service_fn, ServiceExt};

    use super::*;

    /// A stub upstream that answers its request's number of seconds later.
    fn after_secs(
    ) -> impl Service<u64, Response = &'static str, Error = ProxyError, Future: Send + 'static> + Clone
    {
        service_fn(|secs: u64| async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok::<_, ProxyError>("head")
        })
    }

    // The clock is paused: tokio advances it to the next timer, so these take no real time.
    #[tokio::test(start_paused = true)]
    async fn a_head_in_time_passes_and_a_late_one_is_a_timeout() {
        let svc = TimeoutLayer::new(Some(Duration::from_secs(10))).layer(after_secs());
        assert_eq!(svc.clone().oneshot(9).await.expect("in time"), "head");
        let err = svc.oneshot(11).await.expect_err("late");
        assert!(matches!(err, ProxyError::UpstreamTimeout(d) if d == Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_waits_as_long_as_it_takes() {
        let svc = TimeoutLayer::new(None).layer(after_secs());
        assert_eq!(svc.oneshot(100_000).await.expect("no limit"), "head");
    }
}
