//! A test PKI made at run time (a CA and certificates it signs, with rcgen), TLS configs for
//! test upstreams, and TLS clients for talking to tokenmeter's listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A directory for the test's PEM files, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("tokenmeter-it-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("mkdir");
        Dir(p)
    }

    pub fn write(&self, name: &str, data: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, data).expect("write pem");
        p
    }

    /// `path` as a `&str` flag value.
    pub fn arg(p: &Path) -> &str {
        p.to_str().expect("utf-8 temp path")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A certificate and its key, as PEM and as rustls types.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Leaf {
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![self.der.clone()]
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        use rustls::pki_types::pem::PemObject;
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key pem")
    }
}

/// How a leaf certificate is made.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    Now,
    /// Valid from 2020 to 2021.
    Expired,
}

/// A certificate authority of the test's own.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("ca");
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    /// A leaf for `names` (DNS names or IP addresses), signed by this CA.
    pub fn leaf(&self, names: &[&str], validity: Validity) -> Leaf {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A root store holding this CA.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("root");
        roots
    }
}

/// A server config for a test upstream: `alpn` offered (e.g. `[b"h2", b"http/1.1"]`, or none),
/// and client certificates required when `client_ca` is given.
pub fn server_config(leaf: &Leaf, alpn: &[&[u8]], client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.roots()),
                provider(),
            )
            .build()
            .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(leaf.chain(), leaf.key())
        .expect("server cert");
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// An acceptor from [`server_config`].
pub fn acceptor(leaf: &Leaf, alpn: &[&[u8]], client_ca: Option<&Ca>) -> TlsAcceptor {
    TlsAcceptor::from(server_config(leaf, alpn, client_ca))
}

/// A client config trusting `ca`, offering `alpn`.
pub fn client_config(ca: &Ca, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// Opens a TLS connection to `addr` for `name`: the stream, and the certificate the server
/// showed.
pub async fn connect(
    addr: SocketAddr,
    name: &str,
    cfg: Arc<ClientConfig>,
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
)> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(name.to_string()).expect("server name");
    let tls = TlsConnector::from(cfg).connect(name, tcp).await?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .ok_or_else(|| std::io::Error::other("no peer certificate"))?;
    Ok((tls, cert))
}

/// A hyper client speaking HTTPS (h2 or HTTP/1.1 by ALPN) to a listener signed by `ca`.
pub fn https_client(
    ca: &Ca,
    http2: bool,
) -> Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<Bytes>,
> {
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only();
    let conn = if http2 {
        b.enable_http2().build()
    } else {
        b.enable_http1().build()
    };
    Client::builder(TokioExecutor::new()).build(conn)
}

/// One GET over a fresh TLS connection with HTTP/1.1: (status, body).
pub async fn get_over_tls(addr: SocketAddr, name: &str, ca: &Ca, path: &str) -> (u16, Bytes) {
    let (tls, _) = connect(addr, name, client_config(ca, &[b"http/1.1"]))
        .await
        .expect("tls connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", name)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, body)
}
