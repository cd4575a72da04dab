//! What a request may be sent again with: its body, when the proxy read it whole.
//!
//! An upstream connection the pool reused can close as the request crosses it on the wire (a
//! server's idle close): the request is lost before any byte of the response, and the right
//! answer is to send it once more on a new connection. That needs the body again, which only
//! exists where the inspect layer read it whole (JSON up to `--max-request-body`, or none). The
//! inspect layer marks such a request ([`Replayable`]); the pool asks for a copy ([`again`]) only
//! where it can be needed. The proxy owns this rule, so neither layer knows the other.

use bytes::Bytes;
use http::Request;

use super::{full, ProxyBody};

/// The request's body, read whole before it was sent: what a request lost on a reused
/// connection is sent again with. A request extension; `Bytes`, so keeping it costs a reference
/// count, not a copy.
#[derive(Clone, Debug)]
pub struct Replayable(pub Bytes);

/// A copy of a request whose body was read whole, to send again on a new connection; `None`
/// for a streamed body, which cannot be sent twice.
pub fn again(req: &Request<ProxyBody>) -> Option<Request<ProxyBody>> {
    let body = req.extensions().get::<Replayable>()?.0.clone();
    let mut again = Request::new(full(body));
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    Some(again)
}
