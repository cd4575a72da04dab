//! The upstream side: connecting to `http://` and `https://` upstreams, and naming why a
//! connection failed.
//!
//! [`Connector`] is `hyper-rustls`'s connector over hyper-util's `HttpConnector`, wrapped in a
//! timeout over the whole connect (name lookup, TCP and the TLS handshake): a black-holed
//! upstream, whose SYNs are never answered, fails after `--connect-timeout` instead of holding
//! the request until `--upstream-timeout`. `hyper-rustls` rather than a connector of our own
//! because it is the rustls project's own glue for hyper: SNI from the URI's host, ALPN, and
//! reporting a negotiated `h2` to hyper-util's pool are exactly what we would write, and it is
//! kept in step with both crates.
//!
//! Trust: the system's CA bundle, read with `rustls-native-certs` (`/etc/ssl/certs`, or
//! `SSL_CERT_FILE`/`SSL_CERT_DIR`), not `webpki-roots`. In a container the CA bundle is a file
//! of the image that users update with their base image and extend with their company's CA;
//! `webpki-roots` would compile Mozilla's list into the binary, so it would ignore both and only
//! change with a new tokenmeter release. The price: an image without a bundle (`scratch`) trusts
//! nothing, which is logged at start; `--upstream-ca FILE` then names the CAs to trust (and
//! replaces the system bundle, as curl's `--cacert` does, so a private endpoint trusts only its
//! own CA).
//!
//! [`Failure::classify`] turns a connection error into a closed set of causes: the label of a
//! log line that [`crate::ratelog`] lets through once a minute per cause, and the `cause` of the
//! 502's JSON body.

use std::error::Error as StdError;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tower::Service;

use super::{load_certs, provider, KeyPair, TlsError};

use crate::error::BoxError;

/// How the upstream's certificate is checked and what the proxy presents (from the flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// `--upstream-ca`: trust these CAs instead of the system bundle.
    pub ca: Option<PathBuf>,
    /// `--upstream-client-cert` and `--upstream-client-key`, for mutual TLS.
    pub client: Option<KeyPair>,
}

/// The application protocols offered by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` and `http/1.1`: HTTP/2 when the upstream offers it.
    Negotiate,
    /// `http/1.1` only: for upgrades (a WebSocket needs an HTTP/1.1 connection of its own).
    Http1,
    /// `h2` only (`--upstream-http2`).
    Http2,
}

/// The loaded client configuration, without ALPN (each [`Connector`] sets its own).
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: ClientConfig,
}

impl UpstreamTls {
    /// Reads the CA file (or the system bundle) and the client certificate. For a plain
    /// `http://` upstream (`https` false) no file is read and no root loaded.
    pub fn load(&self, https: bool) -> Result<ClientTls, TlsError> {
        let roots = match (&self.ca, https) {
            (_, false) => RootCertStore::empty(),
            (Some(path), true) => {
                let mut roots = RootCertStore::empty();
                for cert in load_certs("upstream-ca", path)? {
                    roots.add(cert).map_err(|e| TlsError::Rejected {
                        flag: "upstream-ca",
                        path: path.clone(),
                        why: e.to_string(),
                    })?;
                }
                roots
            }
            (None, true) => system_roots(),
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .with_root_certificates(roots);
        let config = match (&self.client, https) {
            (Some(pair), true) => {
                // Checked here: a key that does not match is a start-up error, not a
                // handshake failure at the first request.
                pair.load()?;
                let (certs, key) = pair.load_parts()?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| TlsError::BadKey {
                        flag: pair.key_flag,
                        path: pair.key.clone(),
                        why: e.to_string(),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(ClientTls { config })
    }
}

/// The system's CA bundle; an empty store (with a warning) when there is none.
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system CA certificates");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if ignored > 0 {
        tracing::debug!(ignored, "system CA certificates rustls cannot use");
    }
    if added == 0 {
        tracing::warn!(
            "no system CA certificates found: every https upstream will be refused as \
             untrusted (install ca-certificates, set SSL_CERT_FILE, or pass --upstream-ca)"
        );
    }
    roots
}

impl ClientTls {
    /// A connector offering `alpn`, failing a connect that takes longer than `timeout`.
    pub fn connector(&self, alpn: Alpn, timeout: Option<Duration>) -> Connector {
        let mut http = HttpConnector::new();
        // Off by default in hyper-util: Nagle would hold back small SSE writes.
        http.set_nodelay(true);
        // The TLS layer above handles https:// URIs.
        http.enforce_http(false);
        let builder = HttpsConnectorBuilder::new()
            .with_tls_config(self.config.clone())
            .https_or_http();
        let inner = match alpn {
            Alpn::Negotiate => builder.enable_http1().enable_http2().wrap_connector(http),
            Alpn::Http1 => builder.enable_http1().wrap_connector(http),
            Alpn::Http2 => builder.enable_http2().wrap_connector(http),
        };
        Connector { inner, timeout }
    }
}

// === Connector ===

/// Connects to `http://` and `https://` URIs within a time limit.
#[derive(Clone, Debug)]
pub struct Connector {
    inner: HttpsConnector<HttpConnector>,
    timeout: Option<Duration>,
}

/// The connection a [`Connector`] makes.
pub type Conn = MaybeHttpsStream<TokioIo<TcpStream>>;

/// The connect took longer than `--connect-timeout`.
#[derive(Debug, thiserror::Error)]
#[error("no connection within the connect timeout ({0:?})")]
pub struct ConnectTimeout(pub Duration);

impl Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.inner.call(dst);
        let Some(limit) = self.timeout else {
            return connecting;
        };
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(r) => r,
                Err(_) => Err(Box::new(ConnectTimeout(limit)) as BoxError),
            }
        })
    }
}

// === Failure ===

/// Why a request could not reach the upstream: a closed set (a log key and a JSON field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// No TCP connection and handshake within `--connect-timeout`.
    ConnectTimeout,
    /// The upstream's certificate has expired.
    CertificateExpired,
    /// The upstream's certificate is not valid yet (often a wrong clock).
    CertificateNotYetValid,
    /// The upstream's certificate is not signed by a trusted CA.
    CertificateUntrusted,
    /// The upstream's certificate does not name the upstream's host.
    CertificateWrongName,
    /// The upstream's certificate has been revoked.
    CertificateRevoked,
    /// The upstream's certificate is unusable for another reason.
    CertificateInvalid,
    /// The upstream refused tokenmeter's client certificate, or wanted one and got none.
    ClientCertificateRejected,
    /// The TLS handshake failed for another reason (no common version or cipher, a bad alert).
    Handshake,
    /// Anything else: refused, reset, unresolvable, closed before the response.
    Unavailable,
}

impl Failure {
    /// Every cause, for tests and documentation.
    pub const ALL: [Failure; 10] = [
        Failure::ConnectTimeout,
        Failure::CertificateExpired,
        Failure::CertificateNotYetValid,
        Failure::CertificateUntrusted,
        Failure::CertificateWrongName,
        Failure::CertificateRevoked,
        Failure::CertificateInvalid,
        Failure::ClientCertificateRejected,
        Failure::Handshake,
        Failure::Unavailable,
    ];

    /// The `cause` field of the error body.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::ConnectTimeout => "connect_timeout",
            Failure::CertificateExpired => "certificate_expired",
            Failure::CertificateNotYetValid => "certificate_not_yet_valid",
            Failure::CertificateUntrusted => "certificate_untrusted",
            Failure::CertificateWrongName => "certificate_wrong_name",
            Failure::CertificateRevoked => "certificate_revoked",
            Failure::CertificateInvalid => "certificate_invalid",
            Failure::ClientCertificateRejected => "client_certificate_rejected",
            Failure::Handshake => "tls_handshake",
            Failure::Unavailable => "unavailable",
        }
    }

    /// The `type` field of the error body: what kind of problem, for an SDK to show.
    pub fn kind(self) -> &'static str {
        match self {
            Failure::ConnectTimeout => "upstream_connect_timeout",
            Failure::Unavailable => "upstream_unavailable",
            _ => "upstream_tls",
        }
    }

    /// One sentence for the error body and the log.
    pub fn describe(self) -> &'static str {
        match self {
            Failure::ConnectTimeout => "the upstream did not accept a connection in time",
            Failure::CertificateExpired => "the upstream's TLS certificate has expired",
            Failure::CertificateNotYetValid => {
                "the upstream's TLS certificate is not valid yet (check the clocks)"
            }
            Failure::CertificateUntrusted => {
                "the upstream's TLS certificate is not signed by a trusted CA \
                 (--upstream-ca names a private CA)"
            }
            Failure::CertificateWrongName => {
                "the upstream's TLS certificate is not valid for the upstream's host name"
            }
            Failure::CertificateRevoked => "the upstream's TLS certificate has been revoked",
            Failure::CertificateInvalid => "the upstream's TLS certificate is unusable",
            Failure::ClientCertificateRejected => {
                "the upstream refused the client certificate, or wanted one \
                 (--upstream-client-cert)"
            }
            Failure::Handshake => "the TLS handshake with the upstream failed",
            Failure::Unavailable => "the upstream is unavailable",
        }
    }

    /// The cause of a connector or client error, found anywhere in its chain of sources.
    pub fn classify(e: &(dyn StdError + 'static)) -> Failure {
        let mut found = Failure::Unavailable;
        visit(e, &mut |e| {
            if e.downcast_ref::<ConnectTimeout>().is_some() {
                found = Failure::ConnectTimeout;
                return true;
            }
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                found = Failure::from_rustls(tls);
                return true;
            }
            // The h2 crate keeps an I/O error's kind and text, not the error: an alert that
            // arrives after the handshake (TLS 1.3 servers judge a client certificate then) is
            // only text by the time it reaches us. Compare with rustls's own rendering of it.
            let text = e.to_string();
            if let Some(&alert) = CLIENT_CERT_ALERTS
                .iter()
                .find(|a| text == rustls::Error::AlertReceived(**a).to_string())
            {
                found = Failure::from_rustls(&rustls::Error::AlertReceived(alert));
                return true;
            }
            false
        });
        found
    }

    fn from_rustls(e: &rustls::Error) -> Failure {
        use CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::Expired | C::ExpiredContext { .. } => Failure::CertificateExpired,
                C::NotValidYet | C::NotValidYetContext { .. } => Failure::CertificateNotYetValid,
                C::UnknownIssuer | C::BadSignature => Failure::CertificateUntrusted,
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    Failure::CertificateWrongName
                }
                C::Revoked => Failure::CertificateRevoked,
                _ => Failure::CertificateInvalid,
            },
            // An alert about a certificate that the client receives is about its own.
            rustls::Error::AlertReceived(a) if CLIENT_CERT_ALERTS.contains(a) => {
                Failure::ClientCertificateRejected
            }
            _ => Failure::Handshake,
        }
    }
}

/// The alerts a server sends about the client's certificate.
const CLIENT_CERT_ALERTS: [AlertDescription; 8] = [
    AlertDescription::CertificateRequired,
    AlertDescription::BadCertificate,
    AlertDescription::UnknownCA,
    AlertDescription::CertificateUnknown,
    AlertDescription::CertificateExpired,
    AlertDescription::CertificateRevoked,
    AlertDescription::UnsupportedCertificate,
    AlertDescription::AccessDenied,
];

/// Walks an error's sources depth first, looking inside `io::Error`s too (whose `source()`
/// skips the error they wrap, which is where rustls puts its own), until `f` says stop.
fn visit(e: &(dyn StdError + 'static), f: &mut dyn FnMut(&(dyn StdError + 'static)) -> bool) {
    // Error chains are short; the bound only guards against a cycle a buggy impl could make.
    const MAX_DEPTH: usize = 32;
    let mut next = Some(e);
    for _ in 0..MAX_DEPTH {
        let Some(cur) = next else { return };
        if f(cur) {
            return;
        }
        if let Some(inner) = cur
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            let inner: &(dyn StdError + 'static) = inner;
            next = Some(inner);
            continue;
        }
        next = cur.source();
    }
}

/// The error body's message: the cause's sentence and the error chain on one line.
pub fn message(failure: Failure, e: &(dyn StdError + 'static)) -> String {
    format!("{}: {}", failure.describe(), error_chain(e))
}

/// The error and its sources, on one line (inner `io::Error`s included once).
pub fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    visit(e, &mut |e| {
        let s = e.to_string();
        // An io::Error displays the error it wraps: do not say it twice.
        if parts.last() != Some(&s) {
            parts.push(s);
        }
        false
    });
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(inner: impl StdError + Send + Sync + 'static) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, inner)
    }

    #[test]
    fn causes_are_found_inside_io_errors() {
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        // As hyper-rustls wraps tokio-rustls's error: io::Error(io::Error(rustls::Error)).
        let wrapped = std::io::Error::other(io(expired));
        assert_eq!(Failure::classify(&wrapped), Failure::CertificateExpired);
        let boxed: BoxError = Box::new(ConnectTimeout(Duration::from_secs(5)));
        assert_eq!(Failure::classify(&*boxed), Failure::ConnectTimeout);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(Failure::classify(&refused), Failure::Unavailable);
    }

    #[test]
    fn each_certificate_error_has_its_cause() {
        use CertificateError as C;
        let cases = [
            (C::Expired, Failure::CertificateExpired),
            (C::NotValidYet, Failure::CertificateNotYetValid),
            (C::UnknownIssuer, Failure::CertificateUntrusted),
            (C::BadSignature, Failure::CertificateUntrusted),
            (C::NotValidForName, Failure::CertificateWrongName),
            (C::Revoked, Failure::CertificateRevoked),
            (C::BadEncoding, Failure::CertificateInvalid),
        ];
        for (c, want) in cases {
            let e = io(rustls::Error::InvalidCertificate(c));
            assert_eq!(Failure::classify(&e), want);
        }
        let alert = io(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired,
        ));
        assert_eq!(
            Failure::classify(&alert),
            Failure::ClientCertificateRejected
        );
        // As the h2 crate passes it on: the text only.
        let text = rustls::Error::AlertReceived(AlertDescription::UnknownCA).to_string();
        let as_h2 = std::io::Error::other(text);
        assert_eq!(
            Failure::classify(&as_h2),
            Failure::ClientCertificateRejected
        );
        let other = io(rustls::Error::AlertReceived(
            AlertDescription::HandshakeFailure,
        ));
        assert_eq!(Failure::classify(&other), Failure::Handshake);
    }

    #[test]
    fn causes_are_distinct_snake_case_names() {
        let mut names: Vec<&str> = Failure::ALL.iter().map(|f| f.as_str()).collect();
        assert!(names
            .iter()
            .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Failure::ALL.len());
    }

    #[test]
    fn the_chain_is_one_line_without_repeats() {
        let e = std::io::Error::other(io(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        )));
        let s = error_chain(&e);
        assert_eq!(s, "invalid peer certificate: UnknownIssuer");
    }
}
