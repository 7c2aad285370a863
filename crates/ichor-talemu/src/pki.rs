//! The emulator's certificates: an Ed25519 OS CA (`O=talos`, like Talos's),
//! server certificates for emulated nodes, and client certificates for tests
//! (Ed25519, `O=<roles>`, EKU ClientAuth only, as `talosctl gen config` makes).
//!
//! PEM goes through `ichor_talos::pem`, Ichor's one PEM place (the `pem`
//! crate's framing, Talos's labels and key forms).

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::EmuError;

/// Talos's PEM label for Ed25519 PKCS#8 keys.
pub const ED25519_KEY_LABEL: &str = ichor_talos::pem::ED25519_PEM_LABEL;

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

/// A key's PEM as Talos writes it: PKCS#8 under Talos's Ed25519 label.
fn talos_key_pem(key: &KeyPair) -> String {
    ichor_talos::pem::encode(ED25519_KEY_LABEL, &key.serialize_der())
}

/// A key from PEM as Talos writes them: PKCS#8 under any label (rcgen
/// reads the body, not the label), or a P-256 SEC1 `EC PRIVATE KEY` (its
/// Kubernetes CA keys), wrapped as PKCS#8 first. Text that is no PEM block
/// goes to rcgen as it is, which says why it cannot read it.
fn key_pair_from_pem(pem: &str) -> Result<KeyPair, EmuError> {
    let pkcs8 = ichor_talos::pem::p256_sec1_to_pkcs8(pem);
    Ok(KeyPair::from_pem(pkcs8.as_deref().unwrap_or(pem))?)
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
            ca_key_pem: talos_key_pem(&ca_key),
            issuer: Issuer::new(params, ca_key),
        })
    }

    /// A CA given as PEM (for example `certs.os` of a secrets bundle); the key
    /// may use Talos's `ED25519 PRIVATE KEY` label.
    pub fn from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, EmuError> {
        let ca_key = key_pair_from_pem(ca_key_pem)?;
        let ca_key_pem = talos_key_pem(&ca_key);
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
            key_pem: talos_key_pem(&key),
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
            key_pem: talos_key_pem(&key),
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
            key_pem: talos_key_pem(&key),
        })
    }
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
    use ichor_talos::pem::b64;
    let ca_key = key_pair_from_pem(ca_key_pem)?;
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
    let user = format!("admin@{cluster_name}");
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n    - name: {cluster_name}\n      cluster:\n        server: {endpoint}\n        certificate-authority-data: {ca}\nusers:\n    - name: {user}\n      user:\n        client-certificate-data: {crt}\n        client-key-data: {key}\ncontexts:\n    - context:\n        cluster: {cluster_name}\n        namespace: default\n        user: {user}\n      name: {user}\ncurrent-context: {user}\n",
        ca = b64(ca_cert_pem),
        crt = b64(&cert.pem()),
        key = b64(&key.serialize_pem()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_under_talos_label_and_read_back() {
        let pki = Pki::generate().unwrap();
        let key = pki.ca_key_pem();
        assert!(
            key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n"),
            "{key}"
        );
        assert!(
            key.ends_with("-----END ED25519 PRIVATE KEY-----\n"),
            "{key}"
        );
        // The same key as rcgen writes it, but for the label.
        let rcgen_pem = KeyPair::from_pem(key).unwrap().serialize_pem();
        assert_eq!(rcgen_pem.replace("PRIVATE KEY", ED25519_KEY_LABEL), key);
        let again = Pki::from_pem(pki.ca_pem(), key).unwrap();
        assert_eq!(again.ca_key_pem(), key);
        assert!(Pki::from_pem(pki.ca_pem(), "not a key").is_err());
    }
}
