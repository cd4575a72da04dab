//! The upstream TLS connector against real TLS upstreams on loopback, with certificates made at
//! run time: ALPN, trust, certificate failures named by cause, mutual TLS, the connect timeout.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokenmeter::tls::client::{Alpn, Connector, Failure, UpstreamTls};
use tokenmeter::tls::KeyPair;

use crate::support::tls::{acceptor, Ca, Dir, Validity};
use crate::support::upstream::{self, Reply, Upstream};

const H2_H1: &[&[u8]] = &[b"h2", b"http/1.1"];

fn client(conn: Connector) -> Client<Connector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(conn)
}

fn connector(tls: &UpstreamTls, alpn: Alpn) -> Connector {
    tls.load(true)
        .expect("tls loads")
        .connector(alpn, Some(Duration::from_secs(5)))
}

fn trusting(dir: &Dir, ca: &Ca) -> UpstreamTls {
    UpstreamTls {
        ca: Some(dir.write("ca.pem", &ca.pem)),
        client: None,
    }
}

async fn ok_upstream(tls: tokio_rustls::TlsAcceptor) -> Upstream {
    upstream::spawn_tls(tls, |_| Reply::json(200, r#"{"ok":true}"#)).await
}

/// GET / through `conn`: the body, or the failure's cause.
async fn get(conn: Connector, url: &str) -> Result<Bytes, Failure> {
    let req = http::Request::get(url).body(Empty::new()).expect("request");
    match client(conn).request(req).await {
        Ok(resp) => Ok(resp.into_body().collect().await.expect("body").to_bytes()),
        Err(e) => Err(Failure::classify(&e)),
    }
}

#[tokio::test]
async fn alpn_picks_http2_when_offered_and_http1_otherwise() {
    let dir = Dir::new("alpn");
    let ca = Ca::new("test ca");
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let tls = trusting(&dir, &ca);
    let cases: [(&[&[u8]], Alpn, &str); 5] = [
        (H2_H1, Alpn::Negotiate, "HTTP/2.0"),
        // --upstream-http2 asks for h2 alone.
        (H2_H1, Alpn::Http2, "HTTP/2.0"),
        (&[b"http/1.1"], Alpn::Negotiate, "HTTP/1.1"),
        // An upstream that does no ALPN at all speaks HTTP/1.1.
        (&[], Alpn::Negotiate, "HTTP/1.1"),
        // Upgrades ask for HTTP/1.1 even where h2 is offered.
        (H2_H1, Alpn::Http1, "HTTP/1.1"),
    ];
    for (offered, alpn, want) in cases {
        let up = ok_upstream(acceptor(&leaf, offered, None)).await;
        let body = get(connector(&tls, alpn), &up.https_url()).await;
        assert_eq!(body.as_deref(), Ok(&br#"{"ok":true}"#[..]));
        let got = up.received.lock().expect("lock")[0].version.clone();
        assert_eq!(got, want, "offered {offered:?}, asked {alpn:?}");
    }
}

#[tokio::test]
async fn certificate_failures_are_named_by_cause() {
    let dir = Dir::new("causes");
    let ca = Ca::new("test ca");
    let other_ca = Ca::new("someone else's ca");
    let tls = trusting(&dir, &ca);
    let good = ca.leaf(&["127.0.0.1"], Validity::Now);
    let cases = [
        // The system bundle does not know the test CA.
        (UpstreamTls::default(), good, Failure::CertificateUntrusted),
        (
            tls.clone(),
            other_ca.leaf(&["127.0.0.1"], Validity::Now),
            Failure::CertificateUntrusted,
        ),
        (
            tls.clone(),
            ca.leaf(&["127.0.0.1"], Validity::Expired),
            Failure::CertificateExpired,
        ),
        (
            tls.clone(),
            ca.leaf(&["upstream.test"], Validity::Now),
            Failure::CertificateWrongName,
        ),
    ];
    for (tls, leaf, want) in cases {
        let up = ok_upstream(acceptor(&leaf, H2_H1, None)).await;
        let got = get(connector(&tls, Alpn::Negotiate), &up.https_url()).await;
        assert_eq!(got, Err(want));
        assert!(up.received.lock().expect("lock").is_empty());
    }
}

#[tokio::test]
async fn mutual_tls_works_with_the_right_client_certificate_only() {
    let dir = Dir::new("mtls");
    let ca = Ca::new("server ca");
    let client_ca = Ca::new("client ca");
    let leaf = ca.leaf(&["127.0.0.1"], Validity::Now);
    let up = ok_upstream(acceptor(&leaf, H2_H1, Some(&client_ca))).await;
    let mine = client_ca.leaf(&["tokenmeter.client"], Validity::Now);
    let stranger = ca.leaf(&["tokenmeter.client"], Validity::Now);
    let with = |l: &crate::support::tls::Leaf, tag: &str| UpstreamTls {
        client: Some(KeyPair {
            cert: dir.write(&format!("{tag}.crt"), &l.cert_pem),
            key: dir.write(&format!("{tag}.key"), &l.key_pem),
            cert_flag: "upstream-client-cert",
            key_flag: "upstream-client-key",
        }),
        ..trusting(&dir, &ca)
    };
    for alpn in [Alpn::Negotiate, Alpn::Http1] {
        let ok = get(connector(&with(&mine, "mine"), alpn), &up.https_url()).await;
        assert_eq!(ok.as_deref(), Ok(&br#"{"ok":true}"#[..]), "{alpn:?}");
        let none = get(connector(&trusting(&dir, &ca), alpn), &up.https_url()).await;
        assert_eq!(none, Err(Failure::ClientCertificateRejected), "{alpn:?}");
        let wrong = get(
            connector(&with(&stranger, "stranger"), alpn),
            &up.https_url(),
        )
        .await;
        assert_eq!(wrong, Err(Failure::ClientCertificateRejected), "{alpn:?}");
    }
    assert_eq!(up.received.lock().expect("lock").len(), 2);
}

#[tokio::test]
async fn a_black_holed_upstream_fails_within_the_connect_timeout() {
    let hole = upstream::black_hole().await;
    let limit = Duration::from_millis(500);
    for scheme in ["http", "https"] {
        let conn = UpstreamTls::default()
            .load(scheme == "https")
            .expect("tls")
            .connector(Alpn::Negotiate, Some(limit));
        let start = Instant::now();
        let got = get(conn, &format!("{scheme}://{}/", hole.addr)).await;
        let took = start.elapsed();
        assert_eq!(got, Err(Failure::ConnectTimeout), "{scheme}");
        // Generous above (a loaded machine), and never early.
        assert!(
            took >= limit && took < limit + Duration::from_secs(1),
            "{scheme}: {took:?}"
        );
    }
}
