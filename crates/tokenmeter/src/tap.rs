//! The body wrapper that lets the meter watch a response go by.
//!
//! **Invariant:** a [`TapBody`] yields exactly the frames its inner body produces, in order, the
//! same bytes, as soon as the inner body produces them. It never holds a frame back to parse it:
//! the meter looks at each data frame by reference (an O(bytes) scan, no I/O, no await) and the
//! frame is returned in the same poll. `is_end_stream` and `size_hint` are delegated, so hyper
//! frames the response exactly as it would without the tap.
//!
//! The tap holds the request's [`Meter`] as an `Option` and one function, `end`, takes it and
//! finishes it, so a request is recorded exactly once by construction. `end` is called from
//! exactly three places: the end of the stream (the inner body returned `None`, or yielded its
//! last frame and reports `is_end_stream`, or was empty from the start), an error, and `Drop`
//! when the client went away first. After it the tap yields nothing more. The tap only
//! observes: the idle timeout is the [`crate::idle`] wrapper's, beneath it, whose error the tap
//! names `timeout`.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::{pin_project, pinned_drop};

use crate::error::BoxError;
use crate::idle::IdleTimeout;
use crate::meter::Meter;
use crate::record::Outcome;

/// A response body that shows every data frame to a [`Meter`] on its way through.
#[pin_project(PinnedDrop)]
pub struct TapBody<B> {
    #[pin]
    inner: B,
    /// `None` once the request has ended (and was recorded).
    meter: Option<Meter>,
}

/// Ends the request, once: later calls find no meter.
fn end(meter: &mut Option<Meter>, outcome: Outcome) {
    if let Some(m) = meter.take() {
        m.finish(outcome);
    }
}

impl<B: Body> TapBody<B> {
    pub fn new(inner: B, meter: Meter) -> Self {
        let mut meter = Some(meter);
        // hyper never polls a body it knows is empty (HEAD, 204, Content-Length: 0): that
        // response is complete now, and must not be taken for a client that went away.
        if inner.is_end_stream() {
            end(&mut meter, Outcome::Complete);
        }
        TapBody { inner, meter }
    }
}

impl<B> Body for TapBody<B>
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
        let Some(meter) = this.meter.as_mut() else {
            return Poll::Ready(None);
        };
        let mut inner = this.inner;
        match inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    meter.on_data(data, Instant::now());
                }
                if inner.is_end_stream() {
                    // hyper stops polling a body once it says it has ended (a Content-Length
                    // body read in full), so this frame is the end: the response is complete.
                    end(this.meter, Outcome::Complete);
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                let outcome = if e.is::<IdleTimeout>() {
                    Outcome::Timeout
                } else {
                    Outcome::UpstreamError
                };
                end(this.meter, outcome);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                end(this.meter, Outcome::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.meter.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[pinned_drop]
impl<B> PinnedDrop for TapBody<B> {
    fn drop(self: Pin<&mut Self>) {
        // A body dropped before its end: the client went away.
        end(self.project().meter, Outcome::ClientDisconnect);
    }
}

#[cfg(test)]
mod mock;
#[cfg(test)]
mod tests;
