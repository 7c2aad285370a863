//! Bad input at the talosconfig and secrets-bundle entry points: one clear
//! error each — what is wrong, in which file, what to do — and no value of
//! the file quoted in it, and nothing written.

use std::time::Duration;

use ichor_api::error_text::chain;

use ichor_talos::secrets::{SecretsBundle, SecretsError};
use ichor_talos::talosconfig::{Role, Talosconfig, TalosconfigError};

fn read(rel: &str) -> String {
    ichor_testenv::fixtures::talos(rel)
}

/// Every value of a YAML text long enough to be a secret (base64 of keys
/// and certificates, tokens): none may appear in an error.
fn long_values(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(": ").map(|(_, v)| v.trim().to_string()))
        .filter(|v| v.len() >= 16)
        .collect()
}

fn assert_quotes_no_value(said: &str, source: &str) {
    for v in long_values(source) {
        // A long value cut at any point still must not show: look for its
        // first 12 characters.
        assert!(!said.contains(&v[..12]), "the error quotes a value: {said}");
    }
}

/// The talosconfig Ichor's lab writes from the stability bundle.
fn talosconfig_text() -> String {
    let bundle =
        SecretsBundle::parse(&read("stability-secrets.yaml"), "stability-secrets.yaml").unwrap();
    Talosconfig::generate(
        &bundle,
        "lab",
        &["10.5.0.2".to_string()],
        &["10.5.0.3".to_string()],
        Role::Admin,
        Duration::from_secs(3600),
    )
    .unwrap()
    .to_yaml()
    .unwrap()
}

/// What `ichor adopt` does with a talosconfig before it dials a node: the
/// credentials it lacks (which `ichor adopt` names), or the error.
fn read_credentials(text: &str, origin: &str) -> Result<usize, TalosconfigError> {
    let config = Talosconfig::parse(text, origin)?;
    let (name, context) = config.context(None, origin)?;
    context.require_endpoints(name, origin)?;
    let creds = context.credentials(name, origin)?;
    Ok([creds.ca_pem, creds.crt_pem, creds.key_pem]
        .iter()
        .filter(|p| p.is_none())
        .count())
}

/// Covers: bad input (a truncated talosconfig)
///
/// A talosconfig cut anywhere inside its credentials (a cut copy, a full
/// disk) is one error naming the file and the context's field, saying the
/// file may be cut short and how to regenerate it; before this, a cut on a
/// base64 boundary read as valid and failed later inside TLS.
#[test]
fn a_truncated_talosconfig_is_one_error_naming_the_file_and_field() {
    let whole = talosconfig_text();
    let origin = "/home/op/.talos/config";
    assert_eq!(
        read_credentials(&whole, origin).unwrap(),
        0,
        "the whole file reads"
    );
    // Every cut inside a credential's value (a cut between fields leaves a
    // field out, which `ichor adopt` names as missing).
    let mut cuts = 0;
    for field in ["ca: ", "crt: ", "key: "] {
        let start = whole.find(field).expect("the field is there") + field.len();
        let end = start + whole[start..].find('\n').expect("a line");
        for at in (start + 1..end).step_by(3) {
            let cut = &whole[..at];
            let e = match read_credentials(cut, origin) {
                Err(e) => e,
                // Only the PEM's last newline was cut: the value is whole,
                // and the fields after it are missing.
                Ok(missing) => {
                    assert!(missing > 0, "cut at byte {at} read as whole");
                    let value = ichor_talos::pem::unb64(&whole[start..at]).unwrap();
                    assert!(value.trim_end().ends_with("-----"), "cut at {at}");
                    continue;
                }
            };
            let said = chain(&e);
            assert!(said.contains(origin), "{said}");
            assert!(
                matches!(e, TalosconfigError::BadBase64 { .. }),
                "cut at {at}: {said}"
            );
            assert!(
                said.contains("cut short") && said.contains("regenerate the talosconfig"),
                "{said}"
            );
            assert_quotes_no_value(&said, &whole);
            cuts += 1;
        }
    }
    assert!(cuts > 100, "{cuts} cuts tried");
}

/// Covers: bad input (a talosconfig that is not YAML of its shape)
///
/// A talosconfig whose value has the wrong type is refused without the value
/// in the message (serde quotes it by default).
#[test]
fn a_talosconfig_with_a_wrong_type_is_refused_without_quoting_the_value() {
    let text = "context: lab\ncontexts:\n  lab:\n    endpoints: c2VjcmV0LXRva2VuLXRoYXQtbXVzdC1ub3Qtc2hvdw==\n";
    let e = Talosconfig::parse(text, "tc.yaml").unwrap_err();
    let said = chain(&e);
    assert!(
        said.contains("tc.yaml is not a valid talosconfig"),
        "{said}"
    );
    assert_quotes_no_value(&said, text);
}

/// Covers: bad input (a bundle that is a worker config)
///
/// A worker's machine config given as the secrets bundle is one error: the
/// file, that it is a machine config (a worker's), not a bundle, and what to
/// pass instead; no value of the config is quoted.
#[test]
fn a_secrets_bundle_that_is_a_worker_config_is_one_error() {
    for fixture in [
        "stability-v1.12/base-worker.yaml",
        "stability-v1.14/base-worker.yaml",
    ] {
        let text = read(fixture);
        let e = SecretsBundle::parse(&text, "secrets.yaml").unwrap_err();
        assert!(
            matches!(e, SecretsError::MachineConfigNotBundle { .. }),
            "{fixture}: {e}"
        );
        let said = chain(&e);
        assert!(
            said.starts_with(
                "secrets.yaml is a Talos machine config (worker), not a secrets bundle"
            ),
            "{said}"
        );
        assert!(said.contains("talosctl gen secrets"), "{said}");
        assert!(said.contains("workers hold no CA keys"), "{said}");
        assert_quotes_no_value(&said, &text);
    }
    // A control-plane config is not a bundle either; it points at recovery.
    let text = read("stability-v1.14/base-controlplane.yaml");
    let said = chain(&SecretsBundle::parse(&text, "secrets.yaml").unwrap_err());
    assert!(
        said.contains("(controlplane), not a secrets bundle")
            && said.contains("--from-controlplane-config"),
        "{said}"
    );
    assert_quotes_no_value(&said, &text);
}

/// Covers: bad input (a truncated secrets bundle)
///
/// A bundle cut anywhere is an error naming the file, never a panic, and no
/// value of the bundle is quoted.
#[test]
fn a_truncated_secrets_bundle_is_an_error_quoting_no_value() {
    let whole = read("stability-secrets.yaml");
    SecretsBundle::parse(&whole, "secrets.yaml").expect("the whole bundle reads");
    for end in (1..whole.trim_end().len()).step_by(7) {
        let Err(e) = SecretsBundle::parse(&whole[..end], "secrets.yaml") else {
            panic!("a bundle cut at byte {end} was accepted");
        };
        let said = chain(&e);
        assert!(said.contains("secrets.yaml"), "{said}");
        assert_quotes_no_value(&said, &whole);
    }
}
