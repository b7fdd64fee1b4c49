//! The per-run certificate authority for phantom credentials: generated at
//! start in this process's memory (its key is never written anywhere and
//! is gone with the process), name-constrained to the declared hosts, and
//! issuing one leaf per host on demand. Also the TLS configurations: the
//! sandbox side (offers h2 and http/1.1) and the upstream side (verifies
//! the real server against the host's trust store).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the per-run certificate authority: {0}")]
    Ca(String),
    #[error("the host's trust store: {0}")]
    Roots(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The CA: its certificate (PEM, for the sandbox's trust) and the issuer
/// (key in memory only).
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    hosts: Vec<String>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("hosts", &self.hosts).finish()
    }
}

impl Ca {
    /// A new CA that may only sign `hosts` (name constraints).
    pub fn new(hosts: &[String]) -> Result<Ca, TlsError> {
        let e = |x: rcgen::Error| TlsError::Ca(x.to_string());
        let key = KeyPair::generate().map_err(e)?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.distinguished_name.push(
            DnType::CommonName,
            "sbx-net per-run CA (phantom credentials)",
        );
        p.distinguished_name.push(DnType::OrganizationName, "sbx");
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts
                .iter()
                .map(|h| GeneralSubtree::DnsName(h.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::days(1);
        p.not_after = now + time::Duration::days(30);
        let issuer = CertifiedIssuer::self_signed(p, key).map_err(e)?;
        Ok(Ca {
            issuer,
            hosts: hosts.to_vec(),
            leaves: Mutex::new(HashMap::new()),
            provider: provider(),
        })
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The leaf for `host` (one of the declared hosts), made once.
    pub fn leaf(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if !self.hosts.contains(&host) {
            return None;
        }
        let mut g = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = g.get(&host) {
            return Some(k.clone());
        }
        let made = (|| -> Result<Arc<CertifiedKey>, String> {
            let key = KeyPair::generate().map_err(|e| e.to_string())?;
            let mut p = CertificateParams::new(vec![host.clone()]).map_err(|e| e.to_string())?;
            p.distinguished_name.push(DnType::CommonName, host.clone());
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            let now = time::OffsetDateTime::now_utc();
            p.not_before = now - time::Duration::days(1);
            p.not_after = now + time::Duration::days(7);
            let cert = p.signed_by(&key, &self.issuer).map_err(|e| e.to_string())?;
            let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
            let signing = self
                .provider
                .key_provider
                .load_private_key(der)
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(CertifiedKey::new(
                vec![cert.der().clone()],
                signing,
            )))
        })();
        match made {
            Ok(k) => {
                g.insert(host, k.clone());
                Some(k)
            }
            Err(e) => {
                tracing::error!("issuing a certificate for {host}: {e}");
                None
            }
        }
    }
}

#[derive(Debug)]
struct Resolver(Arc<Ca>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.leaf(hello.server_name()?)
    }
}

/// The sandbox side: a leaf for the SNI (declared hosts only), ALPN h2 and
/// http/1.1.
pub fn server_config(ca: Arc<Ca>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(ca)));
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// The upstream side: the host's trust store (rustls-native-certs, which
/// honours sbx-net's own SSL_CERT_FILE and SSL_CERT_DIR); one offering h2
/// and http/1.1 (for a sandbox that speaks h2), one http/1.1 only.
pub fn client_configs() -> Result<(Arc<rustls::ClientConfig>, Arc<rustls::ClientConfig>), TlsError>
{
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no certificate found".into());
        return Err(TlsError::Roots(why));
    }
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut h1 = c.clone();
    h1.alpn_protocols = vec![b"http/1.1".to_vec()];
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(c), Arc::new(h1)))
}

/// Where the system's CA bundle is on the common distributions (the first
/// that exists is the one the sandbox's copy is bound over).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The sandbox's bundle: what sbx-net itself trusts (its SSL_CERT_FILE,
/// else the system bundle) followed by the CA certificate; and the system
/// path it is bound over inside.
pub fn bundle(ca: &Ca) -> Result<(Vec<u8>, &'static str), TlsError> {
    let target = SYSTEM_BUNDLES
        .iter()
        .copied()
        .find(|p| std::path::Path::new(p).is_file())
        .ok_or_else(|| {
            TlsError::Roots(format!(
                "no system CA bundle found (looked for {})",
                SYSTEM_BUNDLES.join(", ")
            ))
        })?;
    let base = std::env::var_os("SSL_CERT_FILE")
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| target.into());
    let mut b = std::fs::read(&base)
        .map_err(|e| TlsError::Roots(format!("reading {}: {e}", base.display())))?;
    if !b.ends_with(b"\n") && !b.is_empty() {
        b.push(b'\n');
    }
    b.extend_from_slice(ca.cert_pem().as_bytes());
    Ok((b, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_only_for_declared_hosts() {
        let ca = Arc::new(Ca::new(&["api.example.test".into()]).unwrap());
        assert!(ca.leaf("API.example.test.").is_some());
        assert!(ca.leaf("other.test").is_none());
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        // The same leaf twice.
        assert!(Arc::ptr_eq(
            &ca.leaf("api.example.test").unwrap(),
            &ca.leaf("api.example.test").unwrap()
        ));
        server_config(ca).unwrap();
    }
}
