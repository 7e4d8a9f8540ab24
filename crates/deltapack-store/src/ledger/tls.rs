//! TLS to a PostgreSQL ledger: libpq's `sslmode` and `sslrootcert` in the
//! ledger URL, over rustls with the ring provider. Owns the URL's TLS
//! parameters and the connector; never sends a byte itself.
//!
//! | `sslmode` | encryption | certificate chain | host name |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` (default) | if the server offers it | not checked | not checked |
//! | `require` | required | checked only with `sslrootcert` | not checked |
//! | `verify-ca` | required | checked against `sslrootcert` | not checked |
//! | `verify-full` | required | checked against `sslrootcert` | checked |
//!
//! These are libpq's meanings, so a URL that works with `psql` works here.
//! `sslrootcert=FILE` names a PEM file of trusted CA certificates; without
//! it, `verify-ca`/`verify-full` use `~/.postgresql/root.crt` as libpq does,
//! and fail with an error naming the missing file if there is none. A server
//! that offers no TLS fails `require` and stronger before any query is sent
//! (fail closed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use super::error::LedgerError;
use super::url::LedgerUrl;

/// How the connection to the ledger is secured (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A ledger URL split into what `postgres::Config` parses and the TLS
/// settings it does not know.
#[derive(Debug)]
pub(crate) struct TlsSettings {
    /// The URL for the driver: without `sslrootcert`, with a `verify-*`
    /// mode written as `require` (the driver's strongest; the checks are the
    /// connector's), every parameter as [`LedgerUrl`] decoded it. Holds the
    /// password: never shown.
    pub(crate) driver_url: String,
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

/// The connector a ledger connection uses.
#[derive(Clone)]
pub(crate) enum Connector {
    /// `sslmode=disable`.
    Plain,
    /// Every other mode.
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl TlsSettings {
    /// The TLS settings of `url` (`…?sslmode=…&sslrootcert=…`, names and
    /// values decoded and checked by [`LedgerUrl::parse`], so no encoding or
    /// repetition can hide one), and the URL for the driver without
    /// `sslrootcert`. Environment variables (`PGSSLMODE`, …) are not read:
    /// the URL alone decides, so nothing outside it can weaken `require` or
    /// `verify-*`. Client certificates (`sslcert`, `sslkey`, `sslpassword`)
    /// are refused: not supported.
    pub(crate) fn parse(url: &LedgerUrl) -> Result<Self, LedgerError> {
        let shown = url.redacted();
        let mode = match url.get("sslmode") {
            None => SslMode::Prefer,
            Some(m) => match m {
                "disable" => SslMode::Disable,
                "prefer" | "allow" => SslMode::Prefer,
                "require" => SslMode::Require,
                "verify-ca" => SslMode::VerifyCa,
                "verify-full" => SslMode::VerifyFull,
                other => {
                    return Err(LedgerError::Url(format!(
                        "{shown}: sslmode={other} is not one of disable, prefer, require, \
                         verify-ca, verify-full"
                    )))
                }
            },
        };
        for unsupported in ["sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir"] {
            if url.get(unsupported).is_some() {
                return Err(LedgerError::Url(format!(
                    "{shown}: {unsupported} is not supported (no client certificates or CRLs); \
                     remove it"
                )));
            }
        }
        let root_cert = url.get("sslrootcert").map(PathBuf::from);
        let driver_mode = match mode {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            _ => "require",
        };
        let driver_url = url.driver_url(|name, value| match name {
            "sslrootcert" => None,
            "sslmode" => Some(driver_mode.to_string()),
            _ => Some(value.to_string()),
        });
        Ok(TlsSettings {
            driver_url,
            mode,
            root_cert,
        })
    }

    /// The connector for these settings (reads the CA file now, so a
    /// missing or malformed file is an error at open, not at first query).
    pub(crate) fn connector(&self) -> Result<Connector, LedgerError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(format!("TLS configuration: {e}")))?;
        let ca_file = match (self.mode, &self.root_cert) {
            (SslMode::Disable, _) => return Ok(Connector::Plain),
            (_, Some(f)) => Some(f.clone()),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                let default = std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                    .filter(|p| p.exists());
                match default {
                    Some(p) => Some(p),
                    None => {
                        return Err(tls_error(
                            "sslmode=verify-ca/verify-full needs the CA certificate: add \
                             sslrootcert=/path/ca.pem to the ledger URL (or put it at \
                             ~/.postgresql/root.crt)"
                                .into(),
                        ))
                    }
                }
            }
            (SslMode::Prefer | SslMode::Require, None) => None,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match ca_file {
            None => Arc::new(EncryptOnly(provider)),
            Some(file) => {
                let roots = load_roots(&file)?;
                let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| tls_error(format!("CA file {}: {e}", file.display())))?;
                if self.mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Connector::Tls(
            tokio_postgres_rustls::MakeRustlsConnect::new(config),
        ))
    }
}

fn tls_error(msg: String) -> LedgerError {
    LedgerError::Tls(msg)
}

/// The trusted CA certificates of a PEM file.
fn load_roots(file: &Path) -> Result<RootCertStore, LedgerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
        .map_err(|e| tls_error(format!("CA file {}: {e}", file.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(format!("CA file {}: {e}", file.display())))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "CA file {} holds no PEM certificate",
            file.display()
        )));
    }
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| tls_error(format!("CA file {}: {e}", file.display())))?;
    }
    Ok(roots)
}

/// `prefer`/`require` without a CA file (libpq's meaning): the connection is
/// encrypted, the handshake's signatures are checked, but the certificate is
/// not (anyone on the path could present one).
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA; the certificate's names
/// need not match the host.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<TlsSettings, LedgerError> {
        TlsSettings::parse(&LedgerUrl::parse(url)?)
    }

    #[test]
    fn urls_split_into_driver_and_tls_settings() {
        let s = parse(
            "postgres://u@h:5432/db?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=x",
        )
        .expect("parse");
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(
            s.driver_url,
            "postgres://u@h:5432/db?sslmode=require&application_name=x"
        );
        let plain = parse("postgres://u@h/db").expect("parse");
        assert_eq!(plain.mode, SslMode::Prefer);
        assert_eq!(plain.driver_url, "postgres://u@h/db");
        assert!(matches!(
            parse("postgres://u@h/db?sslmode=bogus"),
            Err(LedgerError::Url(_))
        ));
        let no_ca = parse("postgres://u@h/db?sslmode=verify-ca").expect("parse");
        if std::env::var_os("HOME")
            .map(|h| !PathBuf::from(h).join(".postgresql/root.crt").exists())
            .unwrap_or(true)
        {
            assert!(matches!(no_ca.connector(), Err(LedgerError::Tls(_))));
        }
        let missing = parse("postgres://u@h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem")
            .expect("parse");
        let err = missing.connector().err().expect("missing CA file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        for key in ["sslcert", "sslkey", "sslpassword"] {
            let e = parse(&format!("postgres://u@h/db?{key}=x")).expect_err(key);
            assert!(e.to_string().contains("not supported"), "{e}");
        }
    }
}
