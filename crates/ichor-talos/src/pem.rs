//! PEM and base64 helpers (Talos stores PEM, often base64 again). The PEM
//! framing is the `pem` crate's; this module only adds Talos's labels and
//! key forms, so every PEM Ichor reads goes through one parser.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// PEM label Talos uses for Ed25519 PKCS#8 keys (not the standard `PRIVATE KEY`).
pub const ED25519_PEM_LABEL: &str = "ED25519 PRIVATE KEY";

/// Encodes DER bytes as PEM with the given label (64-character lines, `\n`
/// line ends, trailing newline: the form Talos writes).
pub fn encode(label: &str, der: &[u8]) -> String {
    let config = ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF);
    ::pem::encode_config(&::pem::Pem::new(label, der), config)
}

/// Decodes the first PEM block: returns (label, DER bytes), or `None` when
/// the text holds no well-framed block (any input, never a panic).
pub fn decode(pem: &str) -> Option<(String, Vec<u8>)> {
    let block = ::pem::parse(pem).ok()?;
    Some((block.tag().to_owned(), block.into_contents()))
}

/// Rewrites a PEM block's label (Talos's `ED25519 PRIVATE KEY` ↔ `PRIVATE KEY`).
pub fn relabel(pem: &str, label: &str) -> Option<String> {
    decode(pem).map(|(_, der)| encode(label, &der))
}

/// Standard base64 of text (how Talos stores PEM in `v1alpha1`, bundles and talosconfig).
pub fn b64(text: &str) -> String {
    STANDARD.encode(text.as_bytes())
}

/// Decodes standard base64 into UTF-8 text.
pub fn unb64(text: &str) -> Option<String> {
    let bytes = STANDARD.decode(text.trim()).ok()?;
    String::from_utf8(bytes).ok()
}

/// PKCS#8 v1 prefix of an Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// PKCS#8 v1 DER (the form Talos writes) from an Ed25519 PKCS#8 v1 or v2 DER.
pub fn ed25519_pkcs8_v1(der: &[u8]) -> Option<Vec<u8>> {
    // v1 and v2 share the algorithm identifier and the seed position; only the
    // outer length and version byte differ.
    if der.len() < 48 || der[5..16] != ED25519_PKCS8_V1_PREFIX[5..16] {
        return None;
    }
    let mut out = ED25519_PKCS8_V1_PREFIX.to_vec();
    out.extend_from_slice(&der[16..48]);
    Some(out)
}

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

/// A P-256 `EC PRIVATE KEY` (SEC1, as Talos writes its Kubernetes CA keys)
/// as a PKCS#8 `PRIVATE KEY` PEM; other PEM is returned as it is.
pub fn p256_sec1_to_pkcs8(pem: &str) -> Option<String> {
    let (label, der) = decode(pem)?;
    if label != "EC PRIVATE KEY" {
        return Some(pem.to_string());
    }
    // AlgorithmIdentifier: id-ecPublicKey, prime256v1.
    const ALGORITHM: &[u8] = &[
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(ALGORITHM);
    body.push(0x04);
    body.extend(der_len(der.len()));
    body.extend_from_slice(&der);
    let mut out = vec![0x30];
    out.extend(der_len(body.len()));
    out.extend(body);
    Some(encode("PRIVATE KEY", &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trip_and_relabel() {
        let der: Vec<u8> = (0u8..=200).collect();
        let p = encode("CERTIFICATE", &der);
        assert_eq!(decode(&p), Some(("CERTIFICATE".to_string(), der.clone())));
        let r = relabel(&p, "X").unwrap();
        assert!(r.starts_with("-----BEGIN X-----\n"));
        assert_eq!(unb64(&b64(&p)).as_deref(), Some(p.as_str()));
    }

    /// Covers: R18.1
    #[test]
    fn an_end_marker_inside_the_begin_line_is_no_block() {
        // The shape that once sliced backwards (END found before the body
        // starts) and took the controller down.
        for text in [
            "-----BEGIN X-----END X-----",
            "-----BEGIN X-----END X-----\nAAAA\n",
            "-----BEGIN -----END -----",
            "-----BEGIN CERTIFICATE-----END CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        ] {
            assert_eq!(decode(text), None, "{text:?}");
        }
    }

    /// Covers: R18.1
    #[test]
    fn cut_and_mislabelled_blocks_are_no_block() {
        let whole = encode("CERTIFICATE", &[1, 2, 3, 4, 5, 6]);
        // Every cut before the END marker's last dash; the trailing newline
        // alone may go.
        for cut in 0..whole.trim_end().len() {
            let prefix = &whole[..cut];
            assert_eq!(decode(prefix), None, "{prefix:?}");
        }
        let other = whole.replace("END CERTIFICATE", "END PRIVATE KEY");
        assert_eq!(decode(&other), None);
        assert_eq!(
            decode(&whole).map(|(l, d)| (l, d.len())),
            Some(("CERTIFICATE".into(), 6))
        );
    }

    #[test]
    fn a_talos_p256_key_becomes_pkcs8_that_signs() {
        let sec1 = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIEYlYh75SQ6zUBEMFzzniS6nUX7CeqCMwKy4E6GTEE0coAoGCCqGSM49\nAwEHoUQDQgAEyxoR/IbISguv4m5k668RSK4zX4cHqh2RG5TB0G3ztmnu4kSGECV/\n6rhBw7GlOJ+kcOsDwBMXcFggQVpaAs41aw==\n-----END EC PRIVATE KEY-----\n";
        let pkcs8 = p256_sec1_to_pkcs8(sec1).unwrap();
        assert!(pkcs8.starts_with("-----BEGIN PRIVATE KEY-----"));
        let key = rcgen::KeyPair::from_pem(&pkcs8).unwrap();
        assert!(key.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256));
        // Anything else passes through.
        let other = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let other = other.as_str();
        assert_eq!(p256_sec1_to_pkcs8(other).as_deref(), Some(other));
    }
}
