//! Generating a new bundle, as `talosctl gen secrets` does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::{SecureRandom, SystemRandom};

use super::{
    BundleCerts, ClusterIdentity, ClusterSecrets, SecretsBundle, SecretsError, TrustdInfo,
};
use crate::config::Extra;
use crate::config::v1alpha1::Base64CertAndKey;
use crate::pem::{ED25519_PEM_LABEL, b64, encode};

/// CA lifetime Talos uses (87600 h, ten years).
pub const CA_VALIDITY: Duration = Duration::from_secs(87_600 * 60 * 60);

fn rng_fill(buf: &mut [u8]) -> Result<(), SecretsError> {
    SystemRandom::new()
        .fill(buf)
        .map_err(|_| SecretsError::Generate("the system random number generator failed".into()))
}

fn random_b64_32() -> Result<String, SecretsError> {
    use base64::Engine;
    let mut b = [0u8; 32];
    rng_fill(&mut b)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(b))
}

/// A token `<6>.<16>` of lower-case letters and digits (bootstrap and trustd tokens).
fn random_token() -> Result<String, SecretsError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(23);
    while out.len() < 23 {
        if out.len() == 6 {
            out.push('.');
            continue;
        }
        let mut b = [0u8; 1];
        rng_fill(&mut b)?;
        // rejection sampling keeps the distribution uniform (252 = 7 * 36)
        if b[0] < 252 {
            out.push(ALPHABET[usize::from(b[0] % 36)] as char);
        }
    }
    Ok(out)
}

/// SEC1 `EC PRIVATE KEY` DER (with the P-256 curve OID, as Go writes it)
/// from ring's P-256 PKCS#8 document.
fn p256_pkcs8_to_sec1(der: &[u8]) -> Option<Vec<u8>> {
    const PREFIX: [u8; 36] = [
        0x30, 0x81, 0x87, 0x02, 0x01, 0x00, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d,
        0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x04, 0x6d, 0x30,
        0x6b, 0x02, 0x01, 0x01, 0x04, 0x20,
    ];
    const PUB_HEADER: [u8; 5] = [0xa1, 0x44, 0x03, 0x42, 0x00];
    if der.len() != 138 || der[..36] != PREFIX || der[68..73] != PUB_HEADER {
        return None;
    }
    let private = &der[36..68];
    let public = &der[73..138];
    let mut out = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    out.extend_from_slice(private);
    // [0] namedCurve prime256v1
    out.extend_from_slice(&[
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ]);
    out.extend_from_slice(&PUB_HEADER);
    out.extend_from_slice(public);
    Some(out)
}

fn bug(what: &str, e: impl std::fmt::Display) -> SecretsError {
    SecretsError::Generate(format!("{what}: {e}"))
}

/// Key kinds of the bundle's CAs.
#[derive(Clone, Copy)]
enum KeyKind {
    Ed25519,
    P256,
}

fn key_pem(kind: KeyKind, key: &rcgen::KeyPair) -> Result<String, SecretsError> {
    match kind {
        KeyKind::Ed25519 => crate::pem::ed25519_pkcs8_v1(key.serialized_der())
            .map(|d| encode(ED25519_PEM_LABEL, &d))
            .ok_or_else(|| bug("Ed25519 key", "unexpected PKCS#8 layout")),
        KeyKind::P256 => p256_pkcs8_to_sec1(key.serialized_der())
            .map(|d| encode("EC PRIVATE KEY", &d))
            .ok_or_else(|| bug("P-256 key", "unexpected PKCS#8 layout")),
    }
}

fn new_key(kind: KeyKind) -> Result<rcgen::KeyPair, SecretsError> {
    let alg = match kind {
        KeyKind::Ed25519 => &rcgen::PKCS_ED25519,
        KeyKind::P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
    };
    rcgen::KeyPair::generate_for(alg).map_err(|e| bug("key generation", e))
}

/// A self-signed CA as Talos makes them: key usage DigitalSignature and
/// CertSign, extended key usage ServerAuth and ClientAuth, `O=<organization>`.
fn new_ca(kind: KeyKind, organization: Option<&str>) -> Result<Base64CertAndKey, SecretsError> {
    let key = new_key(kind)?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    if let Some(o) = organization {
        dn.push(rcgen::DnType::OrganizationName, o);
    }
    params.distinguished_name = dn;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyCertSign,
    ];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + now;
    params.not_after = epoch + now + CA_VALIDITY;
    let mut serial = [0u8; 16];
    rng_fill(&mut serial)?;
    serial[0] = (serial[0] & 0x7f) | 0x01;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    let cert = params
        .self_signed(&key)
        .map_err(|e| bug("CA certificate", e))?;
    Ok(Base64CertAndKey {
        crt: Some(b64(&cert.pem())),
        key: Some(b64(&key_pem(kind, &key)?)),
        extra: Extra::new(),
    })
}

impl SecretsBundle {
    /// Generates a new bundle, as `talosctl gen secrets` does for current
    /// Talos versions: Ed25519 OS CA (`O=talos`), ECDSA P-256 etcd
    /// (`O=etcd`), Kubernetes (`O=kubernetes`) and aggregator CAs, an ECDSA
    /// service-account key, secretbox encryption, random tokens and a
    /// standard-base64 cluster ID and secret.
    pub fn generate() -> Result<Self, SecretsError> {
        let sa_key = new_key(KeyKind::P256)?;
        Ok(Self {
            cluster: ClusterIdentity {
                id: random_b64_32()?,
                secret: random_b64_32()?,
                extra: Extra::new(),
            },
            secrets: ClusterSecrets {
                bootstraptoken: random_token()?,
                secretboxencryptionsecret: Some(random_b64_32()?),
                aescbcencryptionsecret: None,
                extra: Extra::new(),
            },
            trustdinfo: TrustdInfo {
                token: random_token()?,
                extra: Extra::new(),
            },
            certs: BundleCerts {
                etcd: new_ca(KeyKind::P256, Some("etcd"))?,
                k8s: new_ca(KeyKind::P256, Some("kubernetes"))?,
                k8saggregator: new_ca(KeyKind::P256, None)?,
                k8sserviceaccount: Base64CertAndKey {
                    crt: None,
                    key: Some(b64(&key_pem(KeyKind::P256, &sa_key)?)),
                    extra: Extra::new(),
                },
                os: new_ca(KeyKind::Ed25519, Some("talos"))?,
                extra: Extra::new(),
            },
            extra: Extra::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pem::{decode, unb64};
    use x509_parser::prelude::*;

    fn pem_of(v: &Option<String>) -> String {
        unb64(v.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn tokens_have_talos_shape() {
        for _ in 0..50 {
            let t = random_token().unwrap();
            let (a, b) = t.split_once('.').unwrap();
            assert_eq!((a.len(), b.len()), (6, 16), "{t}");
            assert!(
                t.chars()
                    .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit())
            );
        }
    }

    #[test]
    fn generated_bundle_has_talos_shaped_cas_and_keys() {
        let b = SecretsBundle::generate().unwrap();
        let text = b.to_yaml().unwrap();
        assert_eq!(SecretsBundle::parse(&text, "gen").unwrap(), b);
        for (ca, org, key_label) in [
            (&b.certs.os, Some("talos"), "ED25519 PRIVATE KEY"),
            (&b.certs.etcd, Some("etcd"), "EC PRIVATE KEY"),
            (&b.certs.k8s, Some("kubernetes"), "EC PRIVATE KEY"),
            (&b.certs.k8saggregator, None, "EC PRIVATE KEY"),
        ] {
            let (_, der) = decode(&pem_of(&ca.crt)).unwrap();
            let (_, cert) = X509Certificate::from_der(&der).unwrap();
            assert!(cert.is_ca());
            let orgs: Vec<_> = cert
                .subject()
                .iter_organization()
                .map(|o| o.as_str().unwrap().to_string())
                .collect();
            assert_eq!(
                orgs,
                org.map(str::to_string).into_iter().collect::<Vec<_>>()
            );
            let ku = cert.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature() && ku.key_cert_sign());
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.server_auth && eku.client_auth);
            let days = (cert.validity().not_after.timestamp()
                - cert.validity().not_before.timestamp())
                / 86400;
            assert_eq!(days, 3650);
            let (label, kder) = decode(&pem_of(&ca.key)).unwrap();
            assert_eq!(label, key_label);
            let spki = &cert.public_key().subject_public_key.data;
            // the public key inside the key file matches the certificate
            if label.starts_with("EC") {
                assert!(kder.ends_with(spki));
            } else {
                use ring::signature::KeyPair as _;
                let kp =
                    ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&kder).unwrap();
                assert_eq!(kp.public_key().as_ref(), &spki[..]);
            }
        }
        let (label, sa) = decode(&pem_of(&b.certs.k8sserviceaccount.key)).unwrap();
        assert_eq!((label.as_str(), sa.len()), ("EC PRIVATE KEY", 121));
        assert_ne!(b.cluster.id, SecretsBundle::generate().unwrap().cluster.id);
        if let Ok(dir) = std::env::var("ICHOR_TALOS_DUMP_BUNDLE") {
            b.write_file(&std::path::Path::new(&dir).join("secrets.yaml"))
                .unwrap();
        }
    }

    /// Covers: R6.2 (a talosconfig minted from a freshly generated bundle)
    #[test]
    fn generated_bundle_can_mint_an_admin_talosconfig() {
        let b = SecretsBundle::generate().unwrap();
        let tc = crate::talosconfig::Talosconfig::generate(
            &b,
            "new",
            &["10.0.0.1".into()],
            &[],
            crate::talosconfig::Role::Admin,
            crate::talosconfig::DEFAULT_CERT_VALIDITY,
        )
        .unwrap();
        assert_eq!(tc.context.as_deref(), Some("new"));
    }
}
