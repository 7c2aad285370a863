//! No secret leaves the machine config through render and drift.
//!
//! Every secret-bearing field of both config shapes (the stability fixtures'
//! own secrets, and the fields Talos's config reference marks as credentials:
//! registry auth, WireGuard keys, disk-encryption passphrases, inline-manifest
//! contents, extra manifest headers, environment, file contents, static pods,
//! URLs with credentials or query tokens, plus a field and a document Talos
//! does not have yet), and ordinary-looking fields of document kinds Ichor
//! does not model or fields a modelled kind does not name, is seeded with a
//! unique marker on the node's side and another one in the machine's patches;
//! render and drift run as the controller runs them, and nothing they produce
//! (entries, summary, the Drifted condition, a patch error) may carry a marker.

use crate::common::*;
use ichor_api::{CniPreset, KubeProxyMode, MachineRole};
use ichor_render::drift::{Drift, compare_redacted};
use ichor_render::redact::{PUBLIC_PATHS, Redactor, SECRET_KEYS};
use ichor_testenv::leak::{multidoc_secrets, v1alpha1_secrets};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const LIVE: &str = "LIVEMARK";
const DESIRED: &str = "WANTMARK";

/// Every place a marker must not reach: each entry's path, values and
/// reason, the summary and the condition.
fn leaks(drift: &Drift) -> Vec<String> {
    let condition = drift.condition(Some(1), Time(Default::default()));
    let mut texts = vec![drift.summary(), condition.message, condition.reason];
    for e in &drift.entries {
        texts.push(e.path.clone());
        texts.extend(e.live.clone());
        texts.extend(e.desired.clone());
        texts.extend(e.reason.clone());
    }
    texts
        .into_iter()
        .filter(|t| t.contains(LIVE) || t.contains(DESIRED))
        .collect()
}

/// The node runs `fixture` with LIVE markers; the machine's patch asks for
/// DESIRED markers on the same fields. Drift must see every change and show
/// none of the values.
fn drift_of(fixture: &str, secrets: fn(&str) -> String, redactor: &Redactor<'_>) -> Drift {
    let base = parse(&fixtures::talos(fixture));
    let seeded = ichor_talos::patch::ConfigPatch::parse(&secrets(LIVE), "seed")
        .expect("the live seed parses")
        .apply(&base, "seed")
        .expect("the live seed applies");
    let spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
    let m = machine(MachineRole::Controlplane, &[("secrets", &secrets(DESIRED))]);
    let out = render(&spec, &m, &seeded, true, None);
    let yaml = out.yaml().expect("desired yaml");
    assert!(
        yaml.contains(&format!("{DESIRED}-1")),
        "the patch reached the desired config (else the test proves nothing)"
    );
    compare_redacted(&seeded, &out.config, redactor).expect("drift")
}

/// Covers: R8.1 (redaction by default; the leak test over both shapes)
#[test]
fn no_secret_of_either_shape_reaches_drift() {
    for (fixture, secrets, seeds) in [
        (
            "stability-v1.12/base-controlplane.yaml",
            v1alpha1_secrets as fn(&str) -> String,
            29,
        ),
        (
            "stability-v1.14/base-controlplane.yaml",
            multidoc_secrets,
            17,
        ),
    ] {
        let drift = drift_of(fixture, secrets, &Redactor::default());
        assert!(
            drift.entries.len() >= seeds / 3,
            "{fixture}: drift saw too few of the {seeds} changed secrets: {:#?}",
            drift.entries
        );
        let leaked = leaks(&drift);
        assert!(
            leaked.is_empty(),
            "{fixture}: secrets leaked into drift: {leaked:#?}"
        );
        // Every changed secret is still visible as a change: a digest pair.
        for e in &drift.entries {
            if e.live.is_some() && e.desired.is_some() {
                assert_ne!(e.live, e.desired, "{fixture}: {} shows no change", e.path);
            }
        }
    }
}

/// Covers: R8.1 (the leak test can fail: with one secret path wrongly put
/// on the allow-list, the marker is found)
#[test]
fn the_leak_test_finds_a_secret_wrongly_listed_as_public() {
    let mut widened: Vec<&str> = PUBLIC_PATHS.to_vec();
    widened.push("cluster.secretboxEncryptionSecret");
    let redactor = Redactor {
        public_paths: &widened,
        ..Redactor::default()
    };
    let drift = drift_of(
        "stability-v1.12/base-controlplane.yaml",
        v1alpha1_secrets,
        &redactor,
    );
    let leaked = leaks(&drift);
    assert!(
        leaked.iter().any(|t| t.contains(&format!("{DESIRED}-21"))),
        "the widened allow-list should leak cluster.secretboxEncryptionSecret: {leaked:#?}"
    );
}

/// The leak test fails when the rules are widened back to what they were:
/// `env` secret only as a last key, and URLs shown as they are.
/// Covers: R8.1
#[test]
fn the_leak_test_finds_env_and_url_credentials_when_the_rules_are_widened() {
    let without_env: Vec<&str> = SECRET_KEYS
        .iter()
        .copied()
        .filter(|k| *k != "env")
        .collect();
    let redactor = Redactor {
        secret_keys: &without_env,
        ..Redactor::default()
    };
    let drift = drift_of(
        "stability-v1.12/base-controlplane.yaml",
        v1alpha1_secrets,
        &redactor,
    );
    let leaked = leaks(&drift);
    for (marker, what) in [
        (25, "the apiServer proxy password"),
        (
            28,
            "a credential provider's env value, deep under machine.kubelet",
        ),
    ] {
        assert!(
            leaked
                .iter()
                .any(|t| t.contains(&format!("{DESIRED}-{marker}"))),
            "without env as a secret key, {what} should leak: {leaked:#?}"
        );
    }
    // The URL rule alone keeps these tokens and passwords out: they are on
    // public paths.
    let drift = drift_of(
        "stability-v1.12/base-controlplane.yaml",
        v1alpha1_secrets,
        &Redactor::default(),
    );
    for public in [
        "cluster.extraManifests",
        "cluster.discovery.registries.service.endpoint",
        "machine.logging.destinations",
    ] {
        assert!(
            drift.entries.iter().any(|e| e.path.starts_with(public)),
            "the seeded URL under {public} changed, so drift must show it (else this proves nothing): {:#?}",
            drift.entries
        );
    }
}

/// The leak test fails when the allow-list is widened back to whole
/// document kinds: each kind (or field) listed public again lets its
/// marker through, so every marker of the multi-document shape is one drift
/// really carries.
/// Covers: R8.1
#[test]
fn the_leak_test_finds_each_document_kind_listed_whole_again() {
    for (widen, marker) in [
        ("KubeAPIServerConfig", 10),
        ("KubeAPIServerConfig.env", 11),
        ("EventSinkConfig", 12),
        ("KubeCredentialProviderConfig", 13),
        ("HostnameConfig", 14),
        ("KubePrismConfig", 15),
        ("KubeletConfig", 16),
    ] {
        let mut widened: Vec<&str> = PUBLIC_PATHS.to_vec();
        widened.push(widen);
        // `env` stays a secret key unless the case is about it.
        let secret_keys: Vec<&str> = SECRET_KEYS
            .iter()
            .copied()
            .filter(|k| !(widen.ends_with(".env") && *k == "env"))
            .collect();
        let redactor = Redactor {
            public_paths: &widened,
            secret_keys: &secret_keys,
        };
        let drift = drift_of(
            "stability-v1.14/base-controlplane.yaml",
            multidoc_secrets,
            &redactor,
        );
        let leaked = leaks(&drift);
        assert!(
            leaked
                .iter()
                .any(|t| t.contains(&format!("{DESIRED}-{marker}"))),
            "listing {widen} public should leak marker {marker}: {leaked:#?}"
        );
    }
    // The manifest URL's token (marker 17) stays out by the URL rule on a
    // public path; drift must carry the change, else that proves nothing.
    let drift = drift_of(
        "stability-v1.14/base-controlplane.yaml",
        multidoc_secrets,
        &Redactor::default(),
    );
    assert!(
        drift
            .entries
            .iter()
            .any(|e| e.path == "KubeExternalManifestConfig[monitoring].url"),
        "{:#?}",
        drift.entries
    );
}

/// Narrowing the allow-list to typed kinds keeps what drift must read: the
/// images a Kubernetes upgrade writes, in typed and untyped kinds alike,
/// are shown as they are.
/// Covers: R8.1
#[test]
fn the_images_a_kubernetes_upgrade_writes_are_still_shown() {
    let live = parse(&fixtures::cni_none("v1.14-cni-none-controlplane.yaml"));
    let mut spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    spec.kubernetes_version = "v1.29.1".into();
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        true,
        None,
    );
    let drift = ichor_render::drift::compare(&live, &out.config).expect("drift");
    assert_eq!(drift.entries.len(), 5, "{:#?}", drift.entries);
    for e in &drift.entries {
        let desired = e.desired.as_deref().unwrap_or_default();
        assert!(
            e.path.ends_with(".image") && desired.ends_with(":v1.29.1"),
            "{}: {desired}",
            e.path
        );
    }
}

/// Covers: R8.1 (an error about a patch carries no value of it)
#[test]
fn a_patch_error_does_not_quote_the_secret_in_it() {
    let base = parse(&fixtures::talos("stability-v1.12/base-controlplane.yaml"));
    let spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
    for bad in [
        format!("cluster:\n  secret: [{DESIRED}-1\n"),
        format!("machine:\n  - {DESIRED}-2\n"),
        format!("cluster:\n  network: {DESIRED}-3\n"),
    ] {
        let m = machine(MachineRole::Controlplane, &[("bad", &bad)]);
        let err = ichor_render::render(&ichor_render::RenderInput {
            machine_name: "m1",
            cluster: &spec,
            cni_handover: true,
            machine: &m,
            live: &base,
            inline_cni: None,
            taken_over_inline: None,
        })
        .err()
        .unwrap_or_else(|| panic!("the patch {bad:?} should be refused"));
        let text = format!("{} {err:?}", ichor_api::error_text::chain(&err));
        assert!(
            !text.contains(DESIRED),
            "the error quotes the patch: {text}"
        );
    }
}
