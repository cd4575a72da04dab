//! The limit on silence between a response's body frames (`--idle-timeout`), as a body wrapper
//! of its own.
//!
//! An [`IdleBody`] yields its inner body's frames unchanged, in the same poll. When no frame
//! comes for the limit while the body is being read, it yields one [`IdleTimeout`] error and
//! then nothing. The timer starts at the first poll that finds nothing ready and is reset by
//! every frame: a client that reads slowly holds the body back and is not an idle upstream.
//! The tap above it ([`crate::tap`]) sees that error as it sees any other, and only names the
//! way the request ended (`timeout`): enforcing the limit is this wrapper's alone.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use tokio::time::Sleep;

use crate::error::BoxError;

/// No frame came from the upstream for longer than `--idle-timeout`.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(pub Duration);

/// A body cut off after `limit` of silence; `None`: no limit, the inner body as it is.
#[pin_project]
pub struct IdleBody<B> {
    #[pin]
    inner: B,
    limit: Option<Duration>,
    /// Armed at the first wait, reset by every frame.
    timer: Option<Pin<Box<Sleep>>>,
    /// The limit passed: the body has ended with its error.
    expired: bool,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, limit: Option<Duration>) -> Self {
        IdleBody {
            inner,
            limit,
            timer: None,
            expired: false,
        }
    }

    /// The body it wraps.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.project();
        if *this.expired {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(timer), Some(limit)) = (this.timer.as_mut(), *this.limit) {
                    timer.as_mut().reset(tokio::time::Instant::now() + limit);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let Some(limit) = *this.limit else {
                    return Poll::Pending;
                };
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if timer.as_mut().poll(cx).is_ready() {
                    *this.expired = true;
                    return Poll::Ready(Some(Err(Box::new(IdleTimeout(limit)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
