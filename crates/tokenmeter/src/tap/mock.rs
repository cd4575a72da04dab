//! A scripted body for the tap's unit tests: it yields data, trailers, errors and `Pending`
//! (waking its task, as a real body does when it has more) in the order given, then ends the way
//! the script says: with `None`, by reporting `is_end_stream` after its last frame (a body of
//! known length), or never. Polls and frames are counted so a test can see what the tap asked.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};

/// One step of a [`MockBody`]'s script.
#[derive(Debug, Clone)]
pub enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    /// Returns `Pending` once and wakes the task at once.
    Pending,
    Error(&'static str),
}

/// How a [`MockBody`] ends once its script is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Returns `Ready(None)` (a chunked body's terminator).
    None,
    /// Reports `is_end_stream` as soon as its last frame was taken (a `Content-Length` body).
    Known,
    /// `Pending` forever, without a wake (an upstream that stalls).
    Never,
}

/// An error a [`MockBody`] yields.
#[derive(Debug, thiserror::Error)]
#[error("mock body error: {0}")]
pub struct MockError(pub &'static str);

#[derive(Debug)]
pub struct MockBody {
    steps: VecDeque<Step>,
    end: End,
    /// Times `poll_frame` was called.
    pub polls: usize,
}

impl MockBody {
    pub fn new(steps: impl IntoIterator<Item = Step>, end: End) -> Self {
        MockBody {
            steps: steps.into_iter().collect(),
            end,
            polls: 0,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = MockError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, MockError>>> {
        let this = self.get_mut();
        this.polls += 1;
        match this.steps.pop_front() {
            Some(Step::Data(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Some(Step::Trailers(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Some(Step::Error(e)) => Poll::Ready(Some(Err(MockError(e)))),
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            None => match this.end {
                End::None | End::Known => Poll::Ready(None),
                End::Never => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end == End::Known && self.steps.is_empty()
    }
}
