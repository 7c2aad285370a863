//! Property-based fuzzing of the Helm record codec (R8.4): a
//! record Secret's `data.release` comes from whoever can write Secrets in
//! the storage namespace, so decoding must turn anything into a release or
//! an error that names the record, never a panic. `PROPTEST_CASES` sets the
//! number of cases (256 by default, what CI runs); `make fuzz FUZZ_CASES=N`
//! runs them longer. Also the bad-input cases of item 6 for record Secrets.

use std::io::Write as _;

use base64::Engine as _;
use ichor_helm::record::{self, decode_release, encode_release};
use ichor_helm::{Info, Release, Status};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use proptest::prelude::*;

fn b64(bytes: &[u8]) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .into_bytes()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("in memory");
    gz.finish().expect("in memory")
}

fn sample() -> Release {
    Release {
        name: "cilium".into(),
        info: Some(Info {
            status: Status::Deployed,
            ..Info::default()
        }),
        manifest: "---\napiVersion: v1\nkind: ConfigMap\n".into(),
        version: 3,
        namespace: "kube-system".into(),
        ..Release::default()
    }
}

fn record_secret(data: Vec<u8>) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some("sh.helm.release.v1.cilium.v3".into());
    s.metadata.namespace = Some("ichor-system".into());
    s.data = Some([("release".to_owned(), ByteString(data))].into());
    s
}

/// JSON texts near a release: the sample's JSON with bytes flipped, cut or
/// spliced, or a JSON value of the wrong shape.
fn json_near_a_release() -> impl Strategy<Value = Vec<u8>> {
    let json = serde_json::to_vec(&sample()).expect("serialises");
    let len = json.len();
    prop_oneof![
        prop::collection::vec((0..len, any::<u8>()), 1..6).prop_map({
            let json = json.clone();
            move |flips| {
                let mut j = json.clone();
                for (i, b) in flips {
                    j[i] = b;
                }
                j
            }
        }),
        (0..len).prop_map({
            let json = json.clone();
            move |cut| json[..cut].to_vec()
        }),
        prop_oneof![
            Just(r#"{"version": -1}"#),
            Just(r#"{"version": 4294967296}"#),
            Just(r#"{"info": {"status": "nope"}}"#),
            Just(r#"{"info": {"last_deployed": "yesterday"}}"#),
            Just(r#"{"config": []}"#),
            Just(r#"[]"#),
            Just(r#"null"#),
            Just(r#"{"name": "\ud800"}"#),
        ]
        .prop_map(|s| s.as_bytes().to_vec()),
    ]
}

proptest! {
    /// Covers: R8.4 (fuzzing: Helm record decode, arbitrary bytes)
    #[test]
    fn decode_never_panics_on_bytes(data in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_release(&data, "fuzz");
        let _ = decode_release(&b64(&data), "fuzz");
        let _ = decode_release(&b64(&gzip(&data)), "fuzz");
    }

    /// Covers: R8.4 (fuzzing: Helm record decode, near-valid JSON, gzip and base64)
    #[test]
    fn decode_never_panics_near_a_valid_record(
        json in json_near_a_release(),
        gz_cut in any::<usize>(),
        b64_flip in prop::option::of((any::<usize>(), any::<u8>())),
    ) {
        // Plain JSON under the base64 (Helm reads those too), gzip, and a
        // cut gzip stream.
        let _ = decode_release(&b64(&json), "fuzz");
        let gz = gzip(&json);
        let _ = decode_release(&b64(&gz), "fuzz");
        let _ = decode_release(&b64(&gz[..gz_cut % (gz.len() + 1)]), "fuzz");
        let mut text = b64(&gz);
        if let Some((i, b)) = b64_flip {
            let n = text.len();
            text[i % n] = b;
        }
        if let Ok(r) = decode_release(&text, "fuzz") {
            // Whatever decodes encodes again and decodes to the same release.
            let again = encode_release(&r).expect("a decoded release encodes");
            prop_assert_eq!(decode_release(again.as_bytes(), "fuzz").expect("decodes"), r);
        }
    }
}

/// The codec is the identity on a real record.
#[test]
fn a_valid_record_round_trips() {
    let text = encode_release(&sample()).unwrap();
    assert_eq!(decode_release(text.as_bytes(), "r").unwrap(), sample());
}

/// Bad input at an entry point: a record Secret whose
/// `data.release` is not base64, not gzip, not JSON, or missing; each error
/// names the Secret and says what is wrong and what to do.
/// Covers: bad input (record Secret with garbage — not base64, cut gzip, not JSON, no data.release)
#[test]
fn record_secret_with_garbage_not_base64_cut_gzip_not_json_no_data_is_one_clear_error() {
    let name = "ichor-system/sh.helm.release.v1.cilium.v3";
    let gz = gzip(&serde_json::to_vec(&sample()).unwrap());
    let cases: Vec<(&str, Secret, &str)> = vec![
        (
            "not base64",
            record_secret(b"%%% not base64 %%%".to_vec()),
            "not valid base64",
        ),
        (
            "cut gzip",
            record_secret(b64(&gz[..gz.len() / 2])),
            "not valid gzip",
        ),
        (
            "not JSON",
            record_secret(b64(&gzip(b"{\"name\": "))),
            "does not parse",
        ),
        (
            "no data.release",
            {
                let mut s = record_secret(Vec::new());
                s.data = None;
                s
            },
            "no data.release",
        ),
    ];
    for (case, secret, what) in cases {
        let err = record::from_secret(&secret).expect_err(case).to_string();
        assert!(err.contains(name), "{case}: {err}");
        assert!(err.contains(what), "{case}: {err}");
        assert!(err.contains("delete it"), "{case}: {err}");
    }
}
