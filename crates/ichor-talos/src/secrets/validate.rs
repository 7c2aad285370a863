//! A bundle checked as Talos checks it before using it (`talosctl gen config
//! --with-secrets` refuses what this refuses): every required field present,
//! exactly one etcd encryption secret, every certificate and key parses and
//! has a key type its PEM label promises. Every problem is reported, each
//! naming its field; no value is ever quoted.

use super::SecretsBundle;
use crate::config::v1alpha1::Base64CertAndKey;

/// One problem of a bundle: the field (the bundle's own dotted key) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleProblem {
    /// The field, for example `certs.k8saggregator` or `cluster.secret`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for BundleProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

/// What is wrong with a certificate or key of a bundle: a
/// [`BundleProblem`]'s words after its field (no value is quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum PemProblem {
    #[error("is not base64 of PEM text")]
    NotBase64,
    #[error("holds no PEM block that parses")]
    NoPemBlock,
    #[error("is not an X.509 certificate that parses")]
    NotCertificate,
    #[error("is labelled {label} but is not {what}")]
    NotAsLabelled { label: String, what: &'static str },
    #[error(
        "is labelled {label} but holds a key of another type; Talos expects an Ed25519 key here"
    )]
    NotEd25519 { label: String },
    #[error("holds a PKCS#8 key of a type Talos does not read")]
    Pkcs8KeyType,
    #[error(
        "has the PEM label {label}, which is no private key type Talos reads (EC, ED25519, RSA or PKCS#8 PRIVATE KEY)"
    )]
    UnknownLabel { label: String },
}

fn problem(out: &mut Vec<BundleProblem>, field: &str, what: impl ToString) {
    out.push(BundleProblem {
        field: field.to_string(),
        problem: what.to_string(),
    });
}

/// Every problem Talos's bundle validation would find, in the order Talos
/// reports them; empty when the bundle is usable.
pub fn bundle_problems(b: &SecretsBundle) -> Vec<BundleProblem> {
    let mut out = Vec::new();
    if b.cluster.id.is_empty() {
        problem(&mut out, "cluster.id", "is required");
    }
    if b.cluster.secret.is_empty() {
        problem(&mut out, "cluster.secret", "is required");
    }
    if b.secrets.bootstraptoken.is_empty() {
        problem(&mut out, "secrets.bootstraptoken", "is required");
    }
    let set = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    match (
        set(&b.secrets.secretboxencryptionsecret),
        set(&b.secrets.aescbcencryptionsecret),
    ) {
        (false, false) => problem(
            &mut out,
            "secrets.secretboxencryptionsecret",
            "is required (or, for clusters from before Talos 1.3, secrets.aescbcencryptionsecret)",
        ),
        (true, true) => problem(
            &mut out,
            "secrets.aescbcencryptionsecret",
            "is set together with secrets.secretboxencryptionsecret; only one of them is allowed",
        ),
        _ => {}
    }
    if b.trustdinfo.token.is_empty() {
        problem(&mut out, "trustdinfo.token", "is required");
    }
    for (field, ck) in [
        ("certs.etcd", &b.certs.etcd),
        ("certs.k8s", &b.certs.k8s),
        ("certs.k8saggregator", &b.certs.k8saggregator),
        ("certs.os", &b.certs.os),
    ] {
        check_cert_and_key(&mut out, field, ck);
    }
    match b.certs.k8sserviceaccount.key.as_deref() {
        None | Some("") => problem(&mut out, "certs.k8sserviceaccount.key", "is required"),
        Some(key) => {
            if let Err(why) = check_key(key) {
                problem(&mut out, "certs.k8sserviceaccount.key", why);
            }
        }
    }
    out
}

fn check_cert_and_key(out: &mut Vec<BundleProblem>, field: &str, ck: &Base64CertAndKey) {
    let crt = ck.crt.as_deref().filter(|s| !s.is_empty());
    let key = ck.key.as_deref().filter(|s| !s.is_empty());
    if crt.is_none() && key.is_none() {
        problem(out, field, "is required (crt and key)");
        return;
    }
    match key {
        None => problem(out, &format!("{field}.key"), "is required"),
        Some(key) => {
            if let Err(why) = check_key(key) {
                problem(out, &format!("{field}.key"), why);
            }
        }
    }
    match crt {
        None => problem(out, &format!("{field}.crt"), "is required"),
        Some(crt) => {
            if let Err(why) = check_cert(crt) {
                problem(out, &format!("{field}.crt"), why);
            }
        }
    }
}

/// The PEM block inside a base64 bundle value: (label, DER).
fn pem_block(b64: &str) -> Result<(String, Vec<u8>), PemProblem> {
    let text = crate::pem::unb64(b64).ok_or(PemProblem::NotBase64)?;
    crate::pem::decode(&text).ok_or(PemProblem::NoPemBlock)
}

fn check_cert(b64: &str) -> Result<(), PemProblem> {
    let (_, der) = pem_block(b64)?;
    x509_parser::parse_x509_certificate(&der)
        .map(|_| ())
        .map_err(|_| PemProblem::NotCertificate)
}

const OID_ED25519: &str = "1.3.101.112";
const OID_X25519: &str = "1.3.101.110";
const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const OID_RSA: &str = "1.2.840.113549.1.1.1";
/// The named curves Go's x509 package reads (P-224, P-256, P-384, P-521).
const EC_CURVES: [&str; 4] = [
    "1.3.132.0.33",
    "1.2.840.10045.3.1.7",
    "1.3.132.0.34",
    "1.3.132.0.35",
];

/// A private key parses as its PEM label says, for the labels Talos reads:
/// `EC PRIVATE KEY` (SEC1), `ED25519 PRIVATE KEY` (PKCS#8 holding an Ed25519
/// key), `RSA PRIVATE KEY` (PKCS#1) and `PRIVATE KEY` (PKCS#8 of any of them).
fn check_key(b64: &str) -> Result<(), PemProblem> {
    let (label, der) = pem_block(b64)?;
    let bad = |what: &'static str| PemProblem::NotAsLabelled {
        label: label.clone(),
        what,
    };
    match label.as_str() {
        "EC PRIVATE KEY" => sec1_ok(&der)
            .then_some(())
            .ok_or_else(|| bad("a SEC1 EC private key")),
        "RSA PRIVATE KEY" => pkcs1_ok(&der)
            .then_some(())
            .ok_or_else(|| bad("a PKCS#1 RSA private key")),
        "ED25519 PRIVATE KEY" => match pkcs8_algorithm(&der) {
            Some(alg) if alg == OID_ED25519 => Ok(()),
            Some(_) => Err(PemProblem::NotEd25519 { label }),
            None => Err(bad("a PKCS#8 private key")),
        },
        "PRIVATE KEY" => match pkcs8_algorithm(&der) {
            Some(alg)
                if [OID_ED25519, OID_X25519, OID_EC_PUBLIC_KEY, OID_RSA]
                    .contains(&alg.as_str()) =>
            {
                Ok(())
            }
            Some(_) => Err(PemProblem::Pkcs8KeyType),
            None => Err(bad("a PKCS#8 private key")),
        },
        _ => Err(PemProblem::UnknownLabel { label }),
    }
}

/// One DER element: (tag byte, contents, what follows).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The elements of a DER SEQUENCE that fills `der` exactly.
fn sequence(der: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let (tag, mut contents, rest) = tlv(der)?;
    if tag != 0x30 || !rest.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    while !contents.is_empty() {
        let (t, c, r) = tlv(contents)?;
        out.push((t, c));
        contents = r;
    }
    Some(out)
}

/// Dotted text of a DER OBJECT IDENTIFIER's contents.
fn oid_text(c: &[u8]) -> Option<String> {
    let (&first, rest) = c.split_first()?;
    let mut parts = vec![u64::from(first / 40), u64::from(first % 40)];
    let mut acc = 0u64;
    for b in rest {
        acc = (acc << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            parts.push(acc);
            acc = 0;
        }
    }
    Some(
        parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// SEC1 ECPrivateKey: version 1, the key, and a named curve Go knows.
fn sec1_ok(der: &[u8]) -> bool {
    let Some(items) = sequence(der) else {
        return false;
    };
    let version_ok = items.first() == Some(&(0x02, &[1u8][..]));
    let key_ok = items
        .get(1)
        .is_some_and(|(t, c)| *t == 0x04 && (1..=66).contains(&c.len()));
    let curve_ok = items.iter().any(|(t, c)| {
        *t == 0xa0
            && tlv(c).is_some_and(|(t, oid, _)| {
                t == 0x06 && oid_text(oid).is_some_and(|o| EC_CURVES.contains(&o.as_str()))
            })
    });
    version_ok && key_ok && curve_ok
}

/// PKCS#1 RSAPrivateKey: version 0 and eight integers.
fn pkcs1_ok(der: &[u8]) -> bool {
    sequence(der).is_some_and(|items| {
        items.len() >= 9
            && items.first() == Some(&(0x02, &[0u8][..]))
            && items[..9].iter().all(|(t, _)| *t == 0x02)
    })
}

/// The algorithm of a PKCS#8 PrivateKeyInfo, when it is one (for Ed25519,
/// also that the key is 32 bytes, as Go checks).
fn pkcs8_algorithm(der: &[u8]) -> Option<String> {
    let items = sequence(der)?;
    let version_ok = matches!(items.first(), Some((0x02, [0] | [1])));
    let (alg_tag, alg) = items.get(1)?;
    let (key_tag, key) = items.get(2)?;
    if !version_ok || *alg_tag != 0x30 || *key_tag != 0x04 {
        return None;
    }
    let (oid_tag, oid, _) = tlv(alg)?;
    if oid_tag != 0x06 {
        return None;
    }
    let oid = oid_text(oid)?;
    if oid == OID_ED25519 {
        let (t, seed, rest) = tlv(key)?;
        if t != 0x04 || seed.len() != 32 || !rest.is_empty() {
            return None;
        }
    }
    Some(oid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixture;

    #[test]
    fn the_fixture_bundle_and_a_generated_one_have_no_problems() {
        let b: SecretsBundle = serde_yaml_ng::from_str(&fixture("stability-secrets.yaml")).unwrap();
        assert_eq!(bundle_problems(&b), vec![]);
        assert_eq!(bundle_problems(&SecretsBundle::generate().unwrap()), vec![]);
    }

    #[test]
    fn oids_read_as_dotted_text() {
        assert_eq!(oid_text(&[0x2b, 0x65, 0x70]).as_deref(), Some(OID_ED25519));
        assert_eq!(
            oid_text(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]).as_deref(),
            Some("1.2.840.10045.3.1.7")
        );
    }
}
