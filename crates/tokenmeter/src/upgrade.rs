//! Protocol upgrades (WebSocket): forwarding the request's intent, and joining the two
//! connections once the upstream agrees.
//!
//! `Connection` and `Upgrade` are hop-by-hop headers, so the proxy strips them, which makes a
//! WebSocket handshake impossible through it. For a request that asks to upgrade
//! ([`requested`]), the proxy forwards `Connection: upgrade` and the `Upgrade` value after
//! stripping ([`restore`]), over an HTTP/1.1 connection of its own (HTTP/2 has no `Upgrade`).
//! When the upstream answers `101 Switching Protocols`, [`join`] waits for both sides to hand
//! over their connections (hyper's upgrade API: the client's once the 101 is written to it,
//! the upstream's once the 101 is read) and copies bytes both ways, untouched, until either side
//! closes or `stop` fires (the drain's deadline). When one side closes, its close is passed on
//! and the other direction gets [`CLOSE_GRACE`] to deliver what is already under way. Nothing
//! is parsed: reading tokens out of WebSocket frames is not done here.

use std::future::Future;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// After one side closed, how long the other direction may go on delivering. A WebSocket peer
/// closes right after the close handshake, so this only ever runs out for a peer that keeps a
/// dead connection open: without a limit it would hold its place in the drain forever.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Why a joined connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("the client's connection did not upgrade: {0}")]
    Client(hyper::Error),
    #[error("the upstream's connection did not upgrade: {0}")]
    Upstream(hyper::Error),
    #[error("copying between the upgraded connections: {0}")]
    Io(#[from] std::io::Error),
    #[error("cut by the drain timeout")]
    Stopped,
}

/// Bytes copied each way over a joined connection (`None`: that direction was still open when
/// the join ended).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Joined {
    pub from_client: Option<u64>,
    pub from_upstream: Option<u64>,
}

/// The `Upgrade` value of a request that asks to switch protocols: `Connection` lists the
/// `upgrade` token (it is a comma-separated, case-insensitive list) and `Upgrade` is present.
pub fn requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !asks {
        return None;
    }
    headers.get(header::UPGRADE).cloned()
}

/// Puts the upgrade request (or a 101's answer) back after hop-by-hop headers were stripped.
pub fn restore(headers: &mut HeaderMap, upgrade: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, upgrade);
}

/// Joins the client's and the upstream's upgraded connections until either side closes (and
/// [`CLOSE_GRACE`] has let the other direction finish), or until `stop` completes.
pub async fn join(
    client: OnUpgrade,
    upstream: OnUpgrade,
    stop: impl Future<Output = ()>,
) -> Result<Joined, UpgradeError> {
    let work = async {
        // The upstream's connection is ready first (its 101 is already read); the client's
        // when hyper has written our 101 to it.
        let upstream = upstream.await.map_err(UpgradeError::Upstream)?;
        let client = client.await.map_err(UpgradeError::Client)?;
        pipe(TokioIo::new(client), TokioIo::new(upstream), CLOSE_GRACE).await
    };
    tokio::select! {
        r = work => r,
        _ = stop => Err(UpgradeError::Stopped),
    }
}

/// Copies both ways; see [`join`].
async fn pipe<C, U>(client: C, upstream: U, grace: Duration) -> Result<Joined, UpgradeError>
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    // tokio's copy flushes whenever its reader has nothing more for now, so a message is
    // never held back waiting for the next one.
    let up = async {
        let n = tokio::io::copy(&mut cr, &mut uw).await;
        // Pass the close on (a FIN; for TLS, close_notify first).
        let _ = uw.shutdown().await;
        n
    };
    let down = async {
        let n = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
        n
    };
    tokio::pin!(up, down);
    let (from_client, from_upstream) = tokio::select! {
        n = &mut up => {
            let n = n?;
            (Some(n), tokio::time::timeout(grace, &mut down).await.ok().transpose()?)
        }
        n = &mut down => {
            let n = n?;
            (tokio::time::timeout(grace, &mut up).await.ok().transpose()?, Some(n))
        }
    };
    Ok(Joined {
        from_client,
        from_upstream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn an_upgrade_needs_both_headers_and_the_token() {
        let ws = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert_eq!(requested(&ws), Some(HeaderValue::from_static("websocket")));
        let listed = headers(&[
            ("connection", "keep-alive, UPGRADE"),
            ("upgrade", "websocket"),
        ]);
        assert!(requested(&listed).is_some());
        let two_lines = headers(&[
            ("connection", "keep-alive"),
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert!(requested(&two_lines).is_some());
        assert!(requested(&headers(&[("upgrade", "websocket")])).is_none());
        assert!(requested(&headers(&[("connection", "upgrade")])).is_none());
        let lookalike = headers(&[("connection", "upgraded"), ("upgrade", "websocket")]);
        assert!(requested(&lookalike).is_none());
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_one_close_ends_the_join() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let joined = tokio::spawn(pipe(client, upstream, Duration::from_secs(30)));
        use tokio::io::AsyncReadExt;
        client_peer.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        upstream_peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
        upstream_peer.write_all(b"pong!").await.expect("write");
        let mut buf = [0u8; 5];
        client_peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"pong!");
        // The upstream closes; the client sees the close and does the same.
        drop(upstream_peer);
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.expect("eof");
        assert!(rest.is_empty());
        drop(client_peer);
        let j = joined.await.expect("task").expect("joined");
        assert_eq!(j.from_client, Some(4));
        assert_eq!(j.from_upstream, Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_keeps_a_dead_connection_open_is_let_go_after_the_grace() {
        let (client, _client_peer) = tokio::io::duplex(1024);
        let (upstream, upstream_peer) = tokio::io::duplex(1024);
        let joined = tokio::spawn(pipe(client, upstream, Duration::from_secs(1)));
        drop(upstream_peer);
        // _client_peer never closes.
        let j = joined.await.expect("task").expect("joined");
        assert_eq!(j.from_upstream, Some(0));
        assert_eq!(j.from_client, None);
    }

    #[test]
    fn restore_sets_exactly_the_two_headers() {
        let mut h = headers(&[("content-type", "text/plain")]);
        restore(&mut h, HeaderValue::from_static("websocket"));
        assert_eq!(
            h.get("connection").map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
        assert_eq!(
            h.get("upgrade").map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(h.len(), 3);
    }
}
