//! The listener side: TLS for `--tls-cert/--tls-key` (and `--metrics-tls-cert/-key`), with the
//! certificate reloaded when its files change on disk.
//!
//! [`ReloadingCert`] is the server config's certificate resolver: each handshake takes the
//! current `Arc<CertifiedKey>`, and a reload swaps that `Arc`. Connections already open keep
//! the session they negotiated, so a rotation never touches an open stream; new connections
//! get the new certificate.
//!
//! Change detection polls: every [`POLL_INTERVAL`] it `stat`s both paths, following symlinks,
//! and reloads when the device, inode, size or modification time of either target changed.
//! Kubernetes rotates a mounted Secret by pointing the `..data` symlink at a new directory,
//! which changes the inode the path resolves to while the watched file itself is never written;
//! inotify (the `notify` crate) would have to watch the directory and re-arm on the symlink
//! swap to see that, and it misses changes on some network file systems. Two `stat` calls a
//! second cost nothing measurable and see every kind of replacement the same way. A half-done
//! rotation (a new certificate beside the old key) fails to load: the old certificate stays,
//! and the next change is tried again.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::{provider, KeyPair, TlsError};

/// How often the certificate files are checked. Kubernetes propagates a rotated Secret within
/// a minute or so; a second more is nothing, and two `stat`s a second are free.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies a file's contents without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(m: &Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified: m.modified().ok(),
        }
    }
}

fn stamps(pair: &KeyPair) -> Option<(Stamp, Stamp)> {
    let stat = |p: &Path| std::fs::metadata(p).ok().map(|m| Stamp::of(&m));
    Some((stat(&pair.cert)?, stat(&pair.key)?))
}

// === ReloadingCert ===

/// A certificate resolver whose certificate can be replaced while the server runs.
#[derive(Debug)]
pub struct ReloadingCert {
    pair: KeyPair,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' stamps when `current` was loaded, or when loading them last failed.
    seen: RwLock<Option<(Stamp, Stamp)>>,
}

impl ReloadingCert {
    /// Loads the pair (an error here is a start-up error).
    pub fn load(pair: KeyPair) -> Result<Self, TlsError> {
        let seen = stamps(&pair);
        let key = pair.load()?;
        Ok(ReloadingCert {
            pair,
            current: RwLock::new(Arc::new(key)),
            seen: RwLock::new(seen),
        })
    }

    /// The certificate handshakes get now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        // A poisoned lock still holds a valid Arc.
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reloads if the files changed since the last look. `Ok(true)` when a new certificate
    /// is in use; an error leaves the old one in place (and is not retried until the files
    /// change again).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.pair);
        {
            let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
            if now.is_none() || *seen == now {
                // Absent for a moment (mid-rotation) or unchanged: keep what we have.
                return Ok(false);
            }
            *seen = now;
        }
        let key = self.pair.load()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(true)
    }

    /// Checks the files every [`POLL_INTERVAL`] until the returned task is aborted.
    pub fn watch(self: &Arc<Self>, listener: &'static str) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // Blocking file reads, but two small files once per change: not worth a thread.
                match this.reload_if_changed() {
                    Ok(true) => tracing::info!(
                        listener,
                        cert = %this.pair.cert.display(),
                        "reloaded the TLS certificate; new connections use it"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        listener,
                        error = %e,
                        "the TLS certificate changed on disk but does not load; keeping the old one"
                    ),
                }
            }
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

// === Acceptor ===

/// TLS for one listener: the acceptor, and the resolver it reads its certificate from.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: TlsAcceptor,
    pub cert: Arc<ReloadingCert>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert.pair.cert)
            .finish()
    }
}

impl ServerTls {
    /// Loads the pair and offers HTTP/2 and HTTP/1.1 by ALPN.
    pub fn load(pair: KeyPair) -> Result<Self, TlsError> {
        let cert = Arc::new(ReloadingCert::load(pair)?);
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesServerCert>);
        // The connection builder detects HTTP/2 by its preface; ALPN is for the client, which
        // speaks HTTP/2 over TLS only when the server offered it.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert,
        })
    }
}

// === Stream ===

/// An accepted connection: plain TCP, or TLS over it. One type, so one serve function.
#[pin_project::pin_project(project = StreamProj)]
pub enum Stream {
    Plain(#[pin] TcpStream),
    Tls(#[pin] Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ServerTls {
    /// Completes the handshake within `limit` (a client that stalls it is cut like one that
    /// stalls its headers).
    pub async fn accept(&self, tcp: TcpStream, limit: Duration) -> std::io::Result<Stream> {
        match tokio::time::timeout(limit, self.acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => Ok(Stream::Tls(Box::new(tls))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake not completed in time",
            )),
        }
    }
}

impl Stream {
    /// The protocol ALPN settled on a TLS connection (`None` in plain TCP, or if none was).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.project() {
            StreamProj::Plain(s) => s.poll_read(cx, buf),
            StreamProj::Tls(s) => s.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.project() {
            StreamProj::Plain(s) => s.poll_write(cx, buf),
            StreamProj::Tls(s) => s.poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.project() {
            StreamProj::Plain(s) => s.poll_write_vectored(cx, bufs),
            StreamProj::Tls(s) => s.poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.project() {
            StreamProj::Plain(s) => s.poll_flush(cx),
            StreamProj::Tls(s) => s.poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.project() {
            StreamProj::Plain(s) => s.poll_shutdown(cx),
            StreamProj::Tls(s) => s.poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{self_signed, TempDir};
    use super::*;

    fn serial_of(k: &CertifiedKey) -> Vec<u8> {
        k.cert[0].as_ref().to_vec()
    }

    #[test]
    fn a_replaced_symlink_target_is_reloaded_and_a_broken_one_is_not() {
        // The layout a Kubernetes Secret volume has: tls.crt -> ..data/tls.crt, and ..data a
        // symlink to a timestamped directory that a rotation replaces.
        let dir = TempDir::new("reload");
        let write_version = |name: &str, (c, k): &(String, String)| {
            let v = dir.0.join(name);
            std::fs::create_dir_all(&v).expect("mkdir");
            std::fs::write(v.join("tls.crt"), c).expect("write");
            std::fs::write(v.join("tls.key"), k).expect("write");
        };
        let swap_data = |name: &str| {
            let tmp = dir.0.join("..data_tmp");
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(name, &tmp).expect("symlink");
            std::fs::rename(&tmp, dir.0.join("..data")).expect("rename");
        };
        let (one, two) = (self_signed("one.test"), self_signed("two.test"));
        write_version("v1", &one);
        swap_data("v1");
        std::os::unix::fs::symlink("..data/tls.crt", dir.0.join("tls.crt")).expect("symlink");
        std::os::unix::fs::symlink("..data/tls.key", dir.0.join("tls.key")).expect("symlink");
        let pair = KeyPair {
            cert: dir.0.join("tls.crt"),
            key: dir.0.join("tls.key"),
            cert_flag: "tls-cert",
            key_flag: "tls-key",
        };
        let r = ReloadingCert::load(pair).expect("loads");
        let first = serial_of(&r.current());
        assert!(!r.reload_if_changed().expect("no change"));

        write_version("v2", &two);
        swap_data("v2");
        assert!(r.reload_if_changed().expect("reloads"));
        let second = serial_of(&r.current());
        assert_ne!(first, second);
        assert!(!r.reload_if_changed().expect("no change"));

        // A rotation caught halfway: a certificate without its key. The old one stays.
        let three = self_signed("three.test");
        write_version("v3", &(three.0.clone(), two.1.clone()));
        swap_data("v3");
        assert!(r.reload_if_changed().is_err());
        assert_eq!(serial_of(&r.current()), second);
        // Not retried until something changes again; then it loads.
        assert!(!r.reload_if_changed().expect("unchanged"));
        std::fs::write(dir.0.join("v3/tls.key"), &three.1).expect("write");
        assert!(r.reload_if_changed().expect("reloads"));
        assert_ne!(serial_of(&r.current()), second);
    }
}
