//! A small certificate authority for the test control plane and the servers
//! tests start beside it (webhooks). ECDSA P-256 throughout, valid for a week.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The CA of one test control plane.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// A CA given as PEM that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the CA key is not a PKCS#8 key rcgen can read")]
    Key(#[source] rcgen::Error),
    #[error("the CA certificate cannot issue with that key")]
    Certificate(#[source] rcgen::Error),
}

impl TestCa {
    pub fn new(common_name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A CA given as PEM (a cluster's own Kubernetes CA): its key as PKCS#8
    /// (`PRIVATE KEY`).
    pub fn from_pem(cert_pem: &str, key_pkcs8_pem: &str) -> Result<TestCa, CaError> {
        let key = KeyPair::from_pem(key_pkcs8_pem).map_err(CaError::Key)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(CaError::Certificate)?;
        Ok(TestCa {
            issuer,
            cert_pem: cert_pem.to_string(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// A serving certificate; each name that parses as an IP becomes an IP SAN.
    pub fn issue_server(&self, common_name: &str, names: &[&str]) -> IssuedCert {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[]);
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("DNS name")),
            })
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.issue(params)
    }

    /// A client certificate; Kubernetes reads the user from CN and the groups from O.
    pub fn issue_client(&self, common_name: &str, organizations: &[&str]) -> IssuedCert {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, organizations);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.issue(params)
    }

    fn issue(&self, mut params: CertificateParams) -> IssuedCert {
        validity(&mut params);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

fn dn(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn validity(params: &mut CertificateParams) {
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(7 * 24 * 3600)).into();
}
