//! Which HTTP a client connection speaks, decided before hyper's connection is built.
//!
//! hyper-util's `auto` connection finds out by reading the first 24 bytes itself (the length of
//! the HTTP/2 preface) and handing them back in front of the socket. That costs every open
//! stream memory: the 24 bytes sit at the start of hyper's read buffer, whose first 8 KiB
//! reserve then no longer fits and doubles to 16 KiB, and the `auto` future carries the states
//! of both protocols. The loopback benchmark's hold scenario measured 40.5 KiB per open idle
//! stream with `auto` and 27.6 KiB with this module's choice (docs/bench.md).
//!
//! So the version is decided here, without consuming a byte: over TLS by what ALPN settled, in
//! plain TCP by peeking at the first bytes until they tell (a request line's `P`, or part of
//! the preface, does not yet), within the head's budget. Only a TLS client that offered no
//! ALPN is left to the `auto` connection, which reads the version itself.

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// What a client connection speaks, as far as can be told before reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientVersion {
    Http1,
    Http2,
    /// Not known yet: the `auto` connection reads the preface itself.
    Unknown,
}

/// The client connection preface of HTTP/2 with prior knowledge (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection's first bytes say: HTTP/1 as soon as they leave the preface (a request
/// line does by its second byte, by its third for WebDAV's `PROPFIND` and `PROPPATCH`), HTTP/2
/// once the whole preface is there, unknown while they are a shorter part of it.
pub fn from_prefix(bytes: &[u8]) -> ClientVersion {
    let n = bytes.len().min(PREFACE.len());
    if bytes[..n] != PREFACE[..n] {
        ClientVersion::Http1
    } else if n == PREFACE.len() {
        ClientVersion::Http2
    } else {
        ClientVersion::Unknown
    }
}

/// What the TLS handshake settled: the listener offers `h2` and `http/1.1`.
pub fn from_alpn(protocol: Option<&[u8]>) -> ClientVersion {
    match protocol {
        Some(b"h2") => ClientVersion::Http2,
        Some(b"http/1.1") => ClientVersion::Http1,
        _ => ClientVersion::Unknown,
    }
}

/// The first wait before peeking again at bytes that do not tell the version yet, and the
/// longest. Only a client whose first bytes are a prefix of the preface waits (a real client
/// sends its request line or the whole preface in one write), a few milliseconds at first.
const PEEK_AGAIN: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(100));

/// Peeks at a plain connection's first bytes until they tell the version, waiting at most
/// until `deadline` (the header read timeout's: a client that sends nothing, or trickles a
/// prefix of the preface, is cut like one that sends its head too slowly; hyper-util's `auto`
/// connection, which would read the version itself, has no timeout of its own). `None` when
/// the client closed, failed or did not tell in time.
pub async fn sniff(tcp: &TcpStream, deadline: Instant) -> Option<ClientVersion> {
    let mut first = [0u8; PREFACE.len()];
    let mut wait = PEEK_AGAIN.0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let version = match tokio::time::timeout(left, tcp.peek(&mut first)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => from_prefix(&first[..n]),
        };
        if version != ClientVersion::Unknown {
            return Some(version);
        }
        // A peek returns at once while bytes wait: sleep before the next, within the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        tokio::time::sleep(wait.min(left)).await;
        wait = (wait * 2).min(PEEK_AGAIN.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_is_http2_only_once_whole() {
        for n in 0..PREFACE.len() {
            assert_eq!(
                from_prefix(&PREFACE[..n]),
                ClientVersion::Unknown,
                "{n} bytes"
            );
        }
        assert_eq!(from_prefix(PREFACE), ClientVersion::Http2);
        let mut more = PREFACE.to_vec();
        more.extend_from_slice(b"\x00\x00\x12\x04");
        assert_eq!(from_prefix(&more), ClientVersion::Http2);
    }

    #[test]
    fn a_request_line_is_http1_from_its_second_byte_at_every_split() {
        let requests: &[&[u8]] = &[
            b"POST /v1/chat/completions HTTP/1.1\r\n",
            b"GET /v1/models HTTP/1.1\r\n",
            b"PUT /x HTTP/1.1\r\n",
            b"PATCH /x HTTP/1.1\r\n",
            b"PROPFIND /x HTTP/1.1\r\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"HEAD / HTTP/1.0\r\n",
            b"DELETE /x HTTP/1.1\r\n",
        ];
        for req in requests {
            // A first byte that is not `P` already decides.
            let first = if req[0] == b'P' {
                ClientVersion::Unknown
            } else {
                ClientVersion::Http1
            };
            assert_eq!(from_prefix(&req[..1]), first, "{:?}", req[0] as char);
            let decided = if req.starts_with(b"PR") { 3 } else { 2 };
            for n in decided..=req.len() {
                assert_eq!(
                    from_prefix(&req[..n]),
                    ClientVersion::Http1,
                    "{:?}",
                    String::from_utf8_lossy(&req[..n])
                );
            }
        }
        // TLS bytes on a plain port, or any garbage: HTTP/1, whose parser answers it.
        assert_eq!(from_prefix(b"\x16\x03\x01\x02\x00"), ClientVersion::Http1);
    }

    #[test]
    fn alpn_decides_when_it_settled_a_protocol() {
        assert_eq!(from_alpn(Some(b"h2")), ClientVersion::Http2);
        assert_eq!(from_alpn(Some(b"http/1.1")), ClientVersion::Http1);
        assert_eq!(from_alpn(None), ClientVersion::Unknown);
        assert_eq!(from_alpn(Some(b"spdy/3")), ClientVersion::Unknown);
    }
}
