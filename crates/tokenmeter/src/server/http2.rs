//! The limits every HTTP/2 client connection is served with, each a number with its reason.
//!
//! hyper's and h2's defaults already stop the known floods (rapid reset, CONTINUATION,
//! SETTINGS and PING: h2 answers one frame at a time and stops reading while the answer is not
//! written), but they are sized for a general web server, and they change between releases.
//! These are tokenmeter's own, for a proxy whose streams are long LLM responses and whose
//! memory is capped ("Overload" in docs/operations.md has the table).

use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;

/// Streams one connection may have open at once. RFC 9113 (section 6.5.2) asks for no fewer
/// than 100, and no client of an inference server needs more on one connection: a gateway
/// that multiplexes more opens another connection. Every stream also takes a place under
/// `--max-in-flight`, so this keeps one connection from holding them all.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// Streams a client may open and reset before the server has accepted them, at once (rapid
/// reset, CVE-2023-44487); past it the connection gets a GOAWAY (`ENHANCE_YOUR_CALM`). 20 is
/// the number h2 chose in its fix for that CVE: a real client cancels a stream only after it
/// has started (each one accepted), so it never has more than a few pending.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset for a client's protocol errors over a connection's life
/// (each such error costs a stream's setup and a `RST_STREAM`; CVE-2025-8671 makes a server
/// reset them on purpose); past it, GOAWAY. A well-behaved client causes none; 256 keeps a
/// long-lived gateway connection that relays a few malformed requests a day open for months,
/// and lets an attacker cost 256 streams' work per connection, each new one a connection under
/// `--max-connections`. (hyper's default is 1,024.)
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;

/// The largest request head (HPACK-decoded, as RFC 9113 counts it) a client may send; a
/// CONTINUATION flood ends here, since h2 caps the frames of one head by this size. 32 KiB is
/// nginx's (four 8 KiB buffers): an API key or a JWT and tracing headers take a few KiB, and
/// each open head costs at most this much while it is read. (hyper's default is 16 KiB.)
pub const MAX_HEADER_LIST_SIZE: u32 = 32 * 1024;

/// Response bytes buffered per stream for a client that does not read them, before the stream
/// stops pulling from the upstream. An SSE stream sends a few KiB a second, so 64 KiB (one
/// default flow-control window) never slows one; hyper's 400 KiB would let a client that opens
/// [`MAX_CONCURRENT_STREAMS`] and reads nothing park 40 MiB per connection, this 6.4 MiB.
pub const MAX_SEND_BUF_SIZE: usize = 64 * 1024;

/// A PING on a connection silent this long. A client gone without a FIN (a node lost, a NAT
/// entry dropped) then stops counting under `--max-connections` and `--max-in-flight` after
/// [`KEEP_ALIVE_INTERVAL`] + [`KEEP_ALIVE_TIMEOUT`] instead of never, and its streams end as
/// `client_disconnect`. 30 s is under every cloud load balancer's idle timeout (AWS ALB's 60 s
/// is the shortest) and one PING frame a half-minute costs nothing.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long the answer to that PING may take before the connection is closed: 10 s, beyond
/// any round trip, and what a slow client's event loop needs under load.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// hyper's HTTP/2 server with these limits.
pub fn builder() -> http2::Builder<TokioExecutor> {
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .max_send_buf_size(MAX_SEND_BUF_SIZE)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
    b
}

/// The same limits on hyper-util's `auto` builder (it takes no hyper builder in).
pub fn configure(b: &mut auto::Builder<TokioExecutor>) {
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .max_send_buf_size(MAX_SEND_BUF_SIZE)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
}

/// Why tokenmeter closed a client's HTTP/2 connection, when one of the limits above (or the
/// protocol's rules) closed it: the reason of the GOAWAY h2 sent, as the label value of
/// `tokenmeter_http2_connections_closed_total`. `None` for every other end (the client closed,
/// the drain, a keep-alive PING unanswered, which h2 ends with `NO_ERROR`).
pub fn closed_by_limit(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            // A GOAWAY the peer sent, or an I/O error, is not a limit of ours.
            if !(h2.is_go_away() && h2.is_library()) {
                return None;
            }
            return h2.reason().and_then(reason_name);
        }
        cause = e.source();
    }
    None
}

/// The label value of an HTTP/2 error code: the fixed set RFC 9113 defines (section 7),
/// lower-cased, and `other` for a code outside it, so the label stays bounded.
fn reason_name(reason: h2::Reason) -> Option<&'static str> {
    Some(match u32::from(reason) {
        0x0 => return None,
        0x1 => "protocol_error",
        0x2 => "internal_error",
        0x3 => "flow_control_error",
        0x4 => "settings_timeout",
        0x5 => "stream_closed",
        0x6 => "frame_size_error",
        0x7 => "refused_stream",
        0x8 => "cancel",
        0x9 => "compression_error",
        0xa => "connect_error",
        0xb => "enhance_your_calm",
        0xc => "inadequate_security",
        0xd => "http_1_1_required",
        _ => "other",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_has_a_bounded_name_and_no_error_is_no_limit() {
        assert_eq!(reason_name(h2::Reason::NO_ERROR), None);
        assert_eq!(
            reason_name(h2::Reason::ENHANCE_YOUR_CALM),
            Some("enhance_your_calm")
        );
        assert_eq!(reason_name(h2::Reason::from(0xff)), Some("other"));
        // An error that is not h2's (an I/O error, a header timeout) is no limit of ours.
        let io = std::io::Error::other("reset");
        assert_eq!(closed_by_limit(&io), None);
        // h2's errors from the peer's side say so: a GOAWAY we received is not ours.
        let remote: h2::Error = h2::Reason::ENHANCE_YOUR_CALM.into();
        assert_eq!(closed_by_limit(&remote), None);
    }
}
