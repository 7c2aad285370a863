//! The emulator's certificates: an Ed25519 OS CA (`O=talos`, like Talos's),
//! server certificates for emulated nodes, and client certificates for tests
//! (Ed25519, `O=<roles>`, EKU ClientAuth only, as `talosctl gen config` makes).

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::EmuError;

/// Talos's PEM label for Ed25519 PKCS#8 keys.
pub const ED25519_KEY_LABEL: &str = "ED25519 PRIVATE KEY";

/// A certificate and its key, both PEM (the key under Talos's Ed25519 label).
#[derive(Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifiedKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a client certificate should look like. The default is Talos's admin
/// certificate: `O=os:admin`, EKU ClientAuth only, valid for a long time.
#[derive(Debug, Clone)]
pub struct ClientCertSpec {
    /// Roles, written as the subject's Organization values (`os:admin`, `os:reader`, …).
    pub roles: Vec<String>,
    /// Extended key usages (Talos requires exactly `[ClientAuth]`).
    pub ext_key_usages: Vec<ExtendedKeyUsagePurpose>,
    /// Validity window as (year, month, day) in UTC; `None` keeps rcgen's
    /// long default (1975 to 4096).
    pub not_before: Option<(i32, u8, u8)>,
    pub not_after: Option<(i32, u8, u8)>,
}

impl ClientCertSpec {
    /// A certificate carrying these roles, EKU ClientAuth only.
    pub fn with_roles<S: Into<String>>(roles: impl IntoIterator<Item = S>) -> Self {
        Self {
            roles: roles.into_iter().map(Into::into).collect(),
            ext_key_usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            not_before: None,
            not_after: None,
        }
    }

    /// Talos's admin certificate.
    pub fn admin() -> Self {
        Self::with_roles(["os:admin"])
    }
}

/// The emulator's certificate authority.
pub struct Pki {
    ca_cert_pem: String,
    ca_key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn relabel_to_pkcs8(pem: &str) -> String {
    pem.replace(ED25519_KEY_LABEL, "PRIVATE KEY")
}

fn relabel_to_talos(pem: &str) -> String {
    pem.replace("PRIVATE KEY", ED25519_KEY_LABEL)
}

impl Pki {
    /// A fresh Ed25519 CA with `O=talos`.
    pub fn generate() -> Result<Self, EmuError> {
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "talos");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.self_signed(&ca_key)?;
        Ok(Self {
            ca_cert_pem: cert.pem(),
            ca_key_pem: relabel_to_talos(&ca_key.serialize_pem()),
            issuer: Issuer::new(params, ca_key),
        })
    }

    /// A CA given as PEM (for example `certs.os` of a secrets bundle); the key
    /// may use Talos's `ED25519 PRIVATE KEY` label.
    pub fn from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, EmuError> {
        let ca_key = KeyPair::from_pem(&relabel_to_pkcs8(ca_key_pem))?;
        let ca_key_pem = relabel_to_talos(&ca_key.serialize_pem());
        let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
        Ok(Self {
            ca_cert_pem: ca_cert_pem.to_string(),
            ca_key_pem,
            issuer,
        })
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The CA key (PEM, Talos's `ED25519 PRIVATE KEY` label), to reuse the CA later.
    pub fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// A server certificate for an emulated node: EKU ServerAuth, CN = hostname,
    /// SANs = the hostname, the node's IPs and 127.0.0.1 (as apid's).
    pub fn server_cert(&self, hostname: &str, ips: &[IpAddr]) -> Result<CertifiedKey, EmuError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, hostname);
        let mut sans = vec![SanType::DnsName(hostname.try_into()?)];
        let mut all_ips: Vec<IpAddr> = ips.to_vec();
        let loopback: IpAddr = [127, 0, 0, 1].into();
        if !all_ips.contains(&loopback) {
            all_ips.push(loopback);
        }
        sans.extend(all_ips.into_iter().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, self.issuer())?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: relabel_to_talos(&key.serialize_pem()),
        })
    }

    /// A client certificate signed by this CA.
    pub fn client_cert(&self, spec: &ClientCertSpec) -> Result<CertifiedKey, EmuError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        for role in &spec.roles {
            params
                .distinguished_name
                .push(DnType::OrganizationName, role.as_str());
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = spec.ext_key_usages.clone();
        if let Some((y, m, d)) = spec.not_before {
            params.not_before = rcgen::date_time_ymd(y, m, d);
        }
        if let Some((y, m, d)) = spec.not_after {
            params.not_after = rcgen::date_time_ymd(y, m, d);
        }
        let cert = params.signed_by(&key, self.issuer())?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: relabel_to_talos(&key.serialize_pem()),
        })
    }

    /// A self-signed server certificate, as a node in maintenance mode serves.
    pub fn self_signed_server_cert(
        hostname: &str,
        ips: &[IpAddr],
    ) -> Result<CertifiedKey, EmuError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, hostname);
        let mut sans = vec![SanType::DnsName(hostname.try_into()?)];
        sans.extend(ips.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.self_signed(&key)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: relabel_to_talos(&key.serialize_pem()),
        })
    }
}

/// DER length octets.
fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        vec![u8::try_from(len).unwrap_or(0)]
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        let mut out = vec![0x80 | u8::try_from(bytes.len()).unwrap_or(0)];
        out.extend(bytes);
        out
    }
}

fn der(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_len(body.len()));
    out.extend_from_slice(body);
    out
}

/// A P-256 SEC1 key (`EC PRIVATE KEY`, as Talos writes its Kubernetes CA
/// key) wrapped as PKCS#8, which rcgen reads.
fn p256_sec1_to_pkcs8(sec1: &[u8]) -> Vec<u8> {
    // id-ecPublicKey, prime256v1
    const ALGORITHM: &[u8] = &[
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(ALGORITHM);
    body.extend(der(0x04, sec1));
    der(0x30, &body)
}

/// A key PEM rcgen can read: PKCS#8 as is, Talos's labels relabelled, SEC1 wrapped.
fn key_pair_from_any_pem(pem: &str) -> Result<KeyPair, EmuError> {
    use base64::Engine as _;
    if pem.contains("BEGIN EC PRIVATE KEY") {
        let body: String = pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<Vec<_>>()
            .concat();
        let sec1 = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(EmuError::Key)?;
        let pkcs8 = p256_sec1_to_pkcs8(&sec1);
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(pkcs8);
        return KeyPair::try_from(&key).map_err(EmuError::from);
    }
    Ok(KeyPair::from_pem(&relabel_to_pkcs8(pem))?)
}

/// The admin kubeconfig a control plane hands out (`MachineService/Kubeconfig`),
/// shaped as Talos generates it: cluster `<name>`, user and context
/// `admin@<name>`, namespace `default`, a client certificate with
/// `O=system:masters` signed by the cluster's Kubernetes CA.
pub fn admin_kubeconfig(
    cluster_name: &str,
    endpoint: &str,
    ca_cert_pem: &str,
    ca_key_pem: &str,
) -> Result<String, EmuError> {
    use base64::Engine as _;
    let ca_key = key_pair_from_any_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.distinguished_name.push(DnType::CommonName, "admin");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let user = format!("admin@{cluster_name}");
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n    - name: {cluster_name}\n      cluster:\n        server: {endpoint}\n        certificate-authority-data: {ca}\nusers:\n    - name: {user}\n      user:\n        client-certificate-data: {crt}\n        client-key-data: {key}\ncontexts:\n    - context:\n        cluster: {cluster_name}\n        namespace: default\n        user: {user}\n      name: {user}\ncurrent-context: {user}\n",
        ca = b64(ca_cert_pem),
        crt = b64(&cert.pem()),
        key = b64(&key.serialize_pem()),
    ))
}
