//! TLS on both sides of the proxy, with rustls (no OpenSSL) and the `ring` provider.
//!
//! - [`client`]: the upstream connector for `--upstream https://...`: the system's CA bundle
//!   (plus `--upstream-ca`), client certificates for mutual TLS, SNI from the upstream's host,
//!   HTTP/2 when ALPN offers it, a connect timeout over TCP and handshake, and the
//!   classification of certificate failures into a closed set of causes.
//! - [`listener`]: `--tls-cert/--tls-key` (and the metrics listener's pair): an acceptor whose
//!   certificate is swapped when the files change on disk, for new connections only.
//!
//! Every file is read here, in one place, so that a missing or unreadable one is a
//! [`TlsError`] naming its flag (the binary exits 64 on it). The `ring` provider is passed to
//! every config explicitly instead of being installed process-wide, so nothing depends on the
//! order in which configs are built.

pub mod client;
pub mod listener;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS material could not be loaded. Each names the flag, so the line tells what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--{flag} {path}: cannot read: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--{flag} {path}: no PEM certificate in it")]
    NoCertificate { flag: &'static str, path: PathBuf },
    #[error("--{flag} {path}: not a PEM certificate file: {why}")]
    BadCertificate {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("--{flag} {path}: no usable PEM private key in it ({why})")]
    BadKey {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("--{flag} {path}: the key does not belong to the certificate in --{cert_flag}")]
    Mismatch {
        flag: &'static str,
        path: PathBuf,
        cert_flag: &'static str,
    },
    #[error("tls set-up failed: {0}")]
    Setup(rustls::Error),
    #[error("--{flag} {path}: {why}")]
    Rejected {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
}

/// A certificate file and its key file, with the flags that named them (for error lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_flag: &'static str,
    pub key_flag: &'static str,
}

/// The crypto provider every config is built with.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file, in order (a chain: leaf first).
pub(crate) fn load_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate {
            flag,
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn load_key(
    flag: &'static str,
    path: &Path,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::BadKey {
        flag,
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

impl KeyPair {
    /// Reads both files and checks that the key signs for the certificate.
    pub fn load(&self) -> Result<CertifiedKey, TlsError> {
        let (certs, key) = self.load_parts()?;
        let signer =
            provider()
                .key_provider
                .load_private_key(key)
                .map_err(|e| TlsError::BadKey {
                    flag: self.key_flag,
                    path: self.key.clone(),
                    why: e.to_string(),
                })?;
        let certified = CertifiedKey::new(certs, signer);
        certified.keys_match().map_err(|_| TlsError::Mismatch {
            flag: self.key_flag,
            path: self.key.clone(),
            cert_flag: self.cert_flag,
        })?;
        Ok(certified)
    }

    /// The chain and the key, unchecked (for a client certificate, which rustls checks itself).
    pub(crate) fn load_parts(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        Ok((
            load_certs(self.cert_flag, &self.cert)?,
            load_key(self.key_flag, &self.key)?,
        ))
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Certificates for unit tests, written to a temporary directory.

    use std::path::PathBuf;

    /// A fresh directory under the system's temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let dir = std::env::temp_dir()
                .join(format!("tokenmeter-tls-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            TempDir(dir)
        }

        pub fn write(&self, name: &str, data: &str) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, data).expect("write");
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A self-signed certificate for `name`: (cert PEM, key PEM).
    pub fn self_signed(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("rcgen");
        (c.cert.pem(), c.signing_key.serialize_pem())
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{self_signed, TempDir};
    use super::*;

    fn pair(dir: &TempDir, cert: &str, key: &str) -> KeyPair {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        KeyPair {
            cert: dir.write(&format!("c{n}.pem"), cert),
            key: dir.write(&format!("k{n}.pem"), key),
            cert_flag: "tls-cert",
            key_flag: "tls-key",
        }
    }

    #[test]
    fn a_matching_pair_loads() {
        let dir = TempDir::new("pair");
        let (c, k) = self_signed("localhost");
        let loaded = pair(&dir, &c, &k).load().expect("loads");
        assert_eq!(loaded.cert.len(), 1);
    }

    #[test]
    fn each_failure_names_its_flag() {
        let dir = TempDir::new("fail");
        let (c, k) = self_signed("localhost");
        let (_, other_key) = self_signed("localhost");
        let missing = KeyPair {
            cert: dir.0.join("absent.pem"),
            ..pair(&dir, &c, &k)
        };
        let cases: Vec<(KeyPair, &str)> = vec![
            (missing, "--tls-cert "),
            (pair(&dir, "hello", &k), "--tls-cert "),
            (pair(&dir, &c, "hello"), "--tls-key "),
            (pair(&dir, &c, &other_key), "--tls-key "),
            (pair(&dir, &k, &k), "--tls-cert "),
        ];
        for (p, flag) in cases {
            let e = p.load().expect_err("refused").to_string();
            assert!(e.starts_with(flag), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
