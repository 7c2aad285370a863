//! Render and drift on real Talos configs, both shapes.

use crate::common::*;
use ichor_api::{CniPreset, DriftClass, KubeProxyMode, MachineRole};
use ichor_render::{ConfigPath, INLINE_CNI_NAME, compare};
use pretty_assertions::assert_eq;
use serde_yaml_ng::{Mapping, Value};

/// The CNI-relevant paths of R1.6, in both shapes.
const CNI_PATHS: &[&str] = &[
    "cluster.network.cni",
    "cluster.proxy",
    "cluster.inlineManifests",
    "machine.features.kubePrism",
    "KubeFlannelCNIConfig",
    "KubeProxyConfig",
    "KubePrismConfig",
    "KubeInlineManifestConfig",
    "KubeExternalManifestConfig",
];

/// The YAML bytes of one CNI path (a key path in the v1alpha1 document, or
/// every document of a kind), for byte comparison.
fn cni_path_bytes(cfg: &ichor_talos::config::MachineConfig, path: &str) -> String {
    let docs = cfg.to_mappings().expect("mappings");
    let mut out = String::new();
    if path.starts_with(|c: char| c.is_ascii_uppercase()) {
        for d in docs
            .iter()
            .filter(|d| d.get("kind").and_then(Value::as_str) == Some(path))
        {
            out.push_str(&serde_yaml_ng::to_string(d).expect("yaml"));
            out.push_str("---\n");
        }
        return out;
    }
    let v1: Option<&Mapping> = docs.iter().find(|d| !d.contains_key("kind"));
    let mut cur = v1.map(|m| Value::Mapping(m.clone()));
    for k in path.split('.') {
        cur = cur.and_then(|v| v.as_mapping().and_then(|m| m.get(k)).cloned());
    }
    cur.map(|v| serde_yaml_ng::to_string(&v).expect("yaml"))
        .unwrap_or_else(|| "<absent>".into())
}

fn cni_none_cases() -> Vec<(&'static str, KubeProxyMode, String)> {
    let mut cases = Vec::new();
    for f in [
        "v1.12-cni-none-controlplane.yaml",
        "v1.12-cni-none-worker.yaml",
        "v1.14-cni-none-controlplane.yaml",
        "v1.14-cni-none-worker.yaml",
    ] {
        let text = fixtures::cni_none(f);
        cases.push((f, KubeProxyMode::Enabled, text.clone()));
        // The same node with kube-proxy disabled (what `replaced` records).
        let replaced = if f.starts_with("v1.12") {
            text.replacen("    proxy:\n", "    proxy:\n        disabled: true\n", 1)
        } else {
            text.replacen(
                "kind: KubeProxyConfig\n",
                "kind: KubeProxyConfig\nenabled: false\n",
                1,
            )
        };
        if replaced != text || f.ends_with("worker.yaml") {
            cases.push((f, KubeProxyMode::Replaced, replaced));
        }
    }
    cases
}

/// R1.6: with the cilium preset and CNIHandover=True, the render of a
/// `cni.name: none` live config equals it byte for byte on every
/// CNI-relevant path (and everywhere else), for both shapes and both
/// kube-proxy modes; drift is empty.
/// Covers: R1.6
#[test]
fn cni_none_renders_byte_equal_on_cni_paths() {
    for (file, mode, text) in cni_none_cases() {
        let live = parse(&text);
        let spec = cluster(CniPreset::Cilium, mode);
        let m = machine(role_of(file), &[]);
        let desired = render(&spec, &m, &live, true, None);
        for path in CNI_PATHS {
            assert_eq!(
                cni_path_bytes(&desired.config, path),
                cni_path_bytes(&live, path),
                "{file} ({mode:?}): path {path} differs"
            );
        }
        assert_eq!(
            desired.yaml().expect("yaml"),
            live.to_yaml().expect("yaml"),
            "{file} ({mode:?})"
        );
        let drift = compare(&live, &desired.config).expect("drift");
        assert!(
            drift.entries.is_empty(),
            "{file} ({mode:?}): {:#?}",
            drift.entries
        );
    }
}

/// R1.6: before the hand-over the inline cni entry is rendered (class B
/// drift on a control-plane node); from the hand-over on, it is gone.
/// Covers: R1.6, R1.5e
#[test]
fn inline_cni_entry_only_until_handover() {
    for file in [
        "v1.12-cni-none-controlplane.yaml",
        "v1.14-cni-none-controlplane.yaml",
    ] {
        let live = parse(&fixtures::cni_none(file));
        let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
        let m = machine(MachineRole::Controlplane, &[]);
        let before = render(
            &spec,
            &m,
            &live,
            false,
            Some("apiVersion: v1\nkind: List\n"),
        );
        let drift = compare(&live, &before.config).expect("drift");
        assert_eq!(drift.entries.len(), 1, "{file}: {:#?}", drift.entries);
        let e = &drift.entries[0];
        assert!(
            e.path.contains(&format!("[{INLINE_CNI_NAME}]")),
            "{file}: {}",
            e.path
        );
        assert_eq!(e.class, DriftClass::B);

        // After the hand-over, a node that still has the entry loses it.
        let after = render(
            &spec,
            &m,
            &before.config,
            true,
            Some("apiVersion: v1\nkind: List\n"),
        );
        assert_eq!(
            after.yaml().expect("yaml"),
            live.to_yaml().expect("yaml"),
            "{file}"
        );
        let drift = compare(&before.config, &after.config).expect("drift");
        assert_eq!(drift.entries.len(), 1);
        assert_eq!(drift.entries[0].class, DriftClass::B);
        assert!(drift.entries[0].desired.is_none());

        // Without a manifest from the caller, the node's entry is kept before the hand-over.
        let kept = render(&spec, &m, &before.config, false, None);
        assert_eq!(kept.config, before.config);
    }
}

/// A worker never gets the inline entry (inline manifests live on control-plane nodes).
#[test]
fn workers_get_no_inline_entry() {
    let live = parse(&fixtures::cni_none("v1.12-cni-none-worker.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Worker, &[]),
        &live,
        false,
        Some("x: y\n"),
    );
    assert_eq!(out.config, live);
}

/// The cilium preset on a flannel node: the CNI change is class C (Ichor
/// never switches a running cluster's CNI on its own), in both shapes.
/// Covers: R1.6
#[test]
fn cilium_preset_on_flannel_is_class_c() {
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let cases = [
        (
            "stability-v1.12/base-controlplane.yaml",
            "cluster.network.cni",
        ),
        (
            "stability-v1.14/base-controlplane.yaml",
            "KubeFlannelCNIConfig",
        ),
    ];
    for (file, path) in cases {
        let live = parse(&fixtures::talos(file));
        let desired = render(
            &spec,
            &machine(MachineRole::Controlplane, &[]),
            &live,
            true,
            None,
        );
        let drift = compare(&live, &desired.config).expect("drift");
        let paths: Vec<(&str, DriftClass)> = drift
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.class))
            .collect();
        assert_eq!(paths, vec![(path, DriftClass::C)], "{file}");
        assert!(!drift.is_applicable());
        assert_eq!(drift.max_class(), Some(DriftClass::C));
    }
}

/// `replaced` disables kube-proxy (legacy `cluster.proxy.disabled`, v1.14
/// `KubeProxyConfig.enabled: false`) — class C on a node that runs it.
#[test]
fn replaced_disables_kube_proxy_as_class_c() {
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Replaced);
    for (file, path) in [
        ("v1.12-cni-none-controlplane.yaml", "cluster.proxy.disabled"),
        (
            "v1.14-cni-none-controlplane.yaml",
            "KubeProxyConfig.enabled",
        ),
    ] {
        let live = parse(&fixtures::cni_none(file));
        let desired = render(
            &spec,
            &machine(MachineRole::Controlplane, &[]),
            &live,
            true,
            None,
        );
        let drift = compare(&live, &desired.config).expect("drift");
        assert_eq!(drift.entries.len(), 1, "{file}: {:#?}", drift.entries);
        assert_eq!(drift.entries[0].path, path);
        assert_eq!(drift.entries[0].class, DriftClass::C);
        assert_eq!(
            drift.entries[0].desired.as_deref(),
            Some(if path.ends_with("disabled") {
                "true"
            } else {
                "false"
            })
        );
    }
}

/// KubePrism is turned on by the cilium preset, class B, in both shapes.
#[test]
fn kubeprism_is_turned_on_as_class_b() {
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let v12 = fixtures::cni_none("v1.12-cni-none-controlplane.yaml").replacen(
        "        kubePrism:\n            enabled: true\n            port: 7445\n",
        "",
        1,
    );
    let v14 = fixtures::cni_none("v1.14-cni-none-controlplane.yaml").replacen(
        "---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7445\n",
        "",
        1,
    );
    for (name, text, path) in [
        ("v1.12", v12, "machine.features.kubePrism"),
        ("v1.14", v14, "KubePrismConfig"),
    ] {
        let live = parse(&text);
        let desired = render(
            &spec,
            &machine(MachineRole::Controlplane, &[]),
            &live,
            true,
            None,
        );
        let drift = compare(&live, &desired.config).expect("drift");
        let paths: Vec<(&str, DriftClass)> = drift
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.class))
            .collect();
        assert_eq!(paths, vec![(path, DriftClass::B)], "{name}");
        assert!(drift.is_applicable());
    }
}

/// Unmanaged: the CNI paths stay as the node has them (flannel, custom), so
/// nothing drifts, and every other path is kept as it is.
#[test]
fn unmanaged_keeps_cni_paths() {
    for file in [
        "stability-v1.12/base-controlplane.yaml",
        "stability-v1.12/base-worker.yaml",
        "stability-v1.14/base-controlplane.yaml",
        "stability-v1.14/base-worker.yaml",
    ] {
        let live = parse(&fixtures::talos(file));
        let spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
        let out = render(&spec, &machine(role_of(file), &[]), &live, false, None);
        assert_eq!(
            out.yaml().expect("yaml"),
            live.to_yaml().expect("yaml"),
            "{file}"
        );
    }
}

/// Paths Ichor does not own are kept byte for byte, even on a node with a
/// custom CNI, another DNS domain and API port (the overrides fixtures):
/// only the Ichor-owned paths that differ from the spec show up.
#[test]
fn paths_ichor_does_not_own_are_kept() {
    let live = parse(&fixtures::talos(
        "stability-v1.12/overrides-controlplane.yaml",
    ));
    let spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        false,
        None,
    );
    let drift = compare(&live, &out.config).expect("drift");
    for e in &drift.entries {
        assert!(
            [
                "cluster.controlPlane.endpoint",
                "machine.kubelet.image",
                "cluster.apiServer.image"
            ]
            .iter()
            .any(|p| e.path.starts_with(p))
                || e.path.ends_with(".image"),
            "unexpected drift at {}",
            e.path
        );
    }
    let live_docs = live.to_mappings().expect("mappings");
    let out_docs = out.config.to_mappings().expect("mappings");
    assert_eq!(
        live_docs[1..],
        out_docs[1..],
        "documents other than v1alpha1 are untouched"
    );
}

/// A Kubernetes version change in the spec renders new image tags: class C
/// (an upgrade goes through a TalosOperation).
#[test]
fn kubernetes_version_change_is_class_c() {
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
    let drift = compare(&live, &out.config).expect("drift");
    let paths: Vec<&str> = drift.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "KubeAPIServerConfig.image",
            "KubeControllerManagerConfig.image",
            "KubeProxyConfig.image",
            "KubeSchedulerConfig.image",
            "KubeletConfig.image",
        ]
    );
    assert!(drift.entries.iter().all(|e| e.class == DriftClass::C));
    assert!(drift.entries.iter().any(|e| {
        e.reason
            .as_deref()
            .is_some_and(|r| r.contains("kubernetes-upgrade"))
    }));
}

/// Patches apply after Ichor's paths; a label is class B, an unknown path C,
/// and a secret's value never shows in drift.
#[test]
fn patches_are_classified_and_secrets_redacted() {
    let live = parse(&fixtures::cni_none("v1.12-cni-none-controlplane.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let m = machine(
        MachineRole::Controlplane,
        &[
            ("labels", "machine:\n  nodeLabels:\n    zone: a\n"),
            ("secret", "cluster:\n  secret: c2VjcmV0\n"),
            ("unknown", "machine:\n  somethingNew: 1\n"),
        ],
    );
    let out = render(&spec, &m, &live, true, None);
    let drift = compare(&live, &out.config).expect("drift");
    let got: Vec<(&str, DriftClass)> = drift
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.class))
        .collect();
    assert_eq!(
        got,
        vec![
            ("cluster.secret", DriftClass::C),
            ("machine.nodeLabels.zone", DriftClass::B),
            ("machine.somethingNew", DriftClass::C),
        ]
    );
    let secret = &drift.entries[0];
    assert_eq!(
        secret.desired.as_deref(),
        Some(ichor_render::redact::digest("c2VjcmV0").as_str())
    );
    let live_secret = secret.live.as_deref().unwrap_or_default();
    assert!(live_secret.starts_with("sha256:"), "{live_secret}");
    assert_ne!(secret.live, secret.desired, "a change stays visible");
    assert_eq!(drift.entries[1].desired.as_deref(), Some("a"));
}

/// A patch that cannot be applied is an error naming the machine and the patch.
#[test]
fn bad_patch_names_machine_and_patch() {
    let live = parse(&fixtures::cni_none("v1.14-cni-none-controlplane.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let m = machine(
        MachineRole::Controlplane,
        &[("json", "- op: remove\n  path: /machine/nothing\n")],
    );
    let err = ichor_render::render(&ichor_render::RenderInput {
        machine_name: "cp-1",
        cluster: &spec,
        cni_handover: true,
        machine: &m,
        live: &live,
        inline_cni: None,
        taken_over_inline: None,
    })
    .expect_err("a JSON patch on a multi-document config fails");
    let msg = err.to_string();
    assert!(
        msg.contains("TalosMachine cp-1")
            && msg.contains("\"json\"")
            && msg.contains("spec.patches"),
        "{msg}"
    );
}

/// Drift paths read the way people write configs.
#[test]
fn drift_paths_display() {
    let p = ConfigPath::default()
        .key("KubeInlineManifestConfig")
        .item("cilium")
        .key("manifest");
    assert_eq!(p.to_string(), "KubeInlineManifestConfig[cilium].manifest");
}

/// The Drifted condition says which class C paths block the apply and why.
/// Covers: R1.6
#[test]
fn drifted_condition_explains_class_c() {
    use ichor_api::conditions::reasons;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"));
    let live = parse(&fixtures::talos("stability-v1.12/base-controlplane.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        true,
        None,
    );
    let drift = compare(&live, &out.config).expect("drift");
    let c = drift.condition(Some(3), now.clone());
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("Drifted", "True", reasons::UNSAFE_DRIFT)
    );
    assert!(
        c.message.contains("cluster.network.cni (changing the CNI"),
        "{}",
        c.message
    );
    assert!(c.message.contains("nothing is applied"), "{}", c.message);
    let clean = compare(&live, &live)
        .expect("drift")
        .condition(Some(3), now);
    assert_eq!(
        (clean.status.as_str(), clean.reason.as_str()),
        ("False", reasons::NO_DRIFT)
    );
}

/// The hand-over is read from the TalosCluster's CNIHandover condition.
/// Covers: R1.5e
#[test]
fn handover_comes_from_the_cluster_condition() {
    use ichor_api::conditions::{self, Status, reasons, types};
    use ichor_api::{TalosCluster, TalosClusterStatus, TalosMachine};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"));
    let live = parse(&fixtures::cni_none("v1.12-cni-none-controlplane.yaml"));
    let mut c = TalosCluster::new("base", cluster(CniPreset::Cilium, KubeProxyMode::Enabled));
    let m = TalosMachine::new("cp-1", machine(MachineRole::Controlplane, &[]));
    assert!(!ichor_render::RenderInput::from_objects(&c, &m, &live).cni_handover);
    let mut status = TalosClusterStatus::default();
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::CNI_HANDOVER,
            Status::True,
            reasons::HANDED_OVER,
            "",
            Some(1),
            now,
        ),
    );
    c.status = Some(status);
    let input = ichor_render::RenderInput::from_objects(&c, &m, &live);
    assert!(input.cni_handover);
    assert_eq!(input.machine_name, "cp-1");
    assert_eq!(ichor_render::render(&input).expect("render").config, live);
}

/// A node's own empty inline manifest list is kept at the hand-over.
#[test]
fn own_empty_inline_list_is_kept() {
    let text = fixtures::cni_none("v1.12-cni-none-controlplane.yaml").replacen(
        "cluster:\n",
        "cluster:\n    inlineManifests: []\n",
        1,
    );
    let live = parse(&text);
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        true,
        None,
    );
    assert_eq!(out.config, live);
}

/// A TalosMachine whose role is not the node's type shows class C drift on
/// `machine.type` (a role never changes in place).
#[test]
fn role_mismatch_is_class_c() {
    let live = parse(&fixtures::cni_none("v1.14-cni-none-worker.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        true,
        None,
    );
    let drift = compare(&live, &out.config).expect("drift");
    let got: Vec<(&str, DriftClass)> = drift
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.class))
        .collect();
    assert_eq!(got, vec![("machine.type", DriftClass::C)]);
}

/// Subnets adopted from the node into spec.network render equal: no drift
/// on the network paths (class A by construction), for every fixture.
/// Covers: R1.3d
#[test]
fn adopted_subnets_render_equal() {
    for file in [
        "stability-v1.12/base-controlplane.yaml",
        "stability-v1.12/overrides-controlplane.yaml",
        "stability-v1.14/base-controlplane.yaml",
        "stability-v1.14/overrides-worker.yaml",
    ] {
        let live = parse(&fixtures::talos(file));
        let facts = live.facts();
        let mut spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
        spec.network.pod_subnets = facts.pod_subnets.clone();
        spec.network.service_subnets = facts.service_subnets.clone();
        let out = render(&spec, &machine(role_of(file), &[]), &live, false, None);
        let drift = compare(&live, &out.config).expect("drift");
        assert!(
            drift.entries.iter().all(|e| !e.path.contains("Subnets")),
            "{file}: {:#?}",
            drift.entries
        );
    }
}

/// KubePrism already on without a port is left alone (no A-only rewrite).
#[test]
fn kubeprism_on_without_port_is_kept() {
    let text = fixtures::cni_none("v1.12-cni-none-controlplane.yaml").replacen(
        "        kubePrism:\n            enabled: true\n            port: 7445\n",
        "        kubePrism:\n            enabled: true\n",
        1,
    );
    let live = parse(&text);
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let out = render(
        &spec,
        &machine(MachineRole::Controlplane, &[]),
        &live,
        true,
        None,
    );
    assert_eq!(out.config, live);
}

/// At the hand-over, an inline manifest taken over from the user (named in
/// the TalosCluster's annotation) is removed too; other inline manifests stay.
/// Covers: R1.5e
#[test]
fn taken_over_inline_manifest_is_removed_at_handover() {
    use ichor_api::conditions::{self, Status, reasons, types};
    use ichor_api::{TalosCluster, TalosClusterStatus, TalosMachine};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let text = fixtures::cni_none("v1.12-cni-none-controlplane.yaml").replacen(
        "cluster:\n",
        "cluster:\n    inlineManifests:\n        - name: my-cilium\n          contents: 'kind: List'\n        - name: extra\n          contents: 'kind: List'\n",
        1,
    );
    let live = parse(&text);
    let mut c = TalosCluster::new("base", cluster(CniPreset::Cilium, KubeProxyMode::Enabled));
    c.metadata.annotations = Some(
        [(
            ichor_api::TAKEN_OVER_INLINE_MANIFEST_ANNOTATION.to_owned(),
            "my-cilium".to_owned(),
        )]
        .into(),
    );
    let mut status = TalosClusterStatus::default();
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"));
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::CNI_HANDOVER,
            Status::True,
            reasons::HANDED_OVER,
            "",
            Some(1),
            now,
        ),
    );
    c.status = Some(status);
    let m = TalosMachine::new("cp-1", machine(MachineRole::Controlplane, &[]));
    let out = ichor_render::render(&ichor_render::RenderInput::from_objects(&c, &m, &live))
        .expect("render");
    let drift = compare(&live, &out.config).expect("drift");
    let got: Vec<(&str, DriftClass)> = drift
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.class))
        .collect();
    assert_eq!(
        got,
        vec![("cluster.inlineManifests[my-cilium]", DriftClass::B)]
    );
}

/// Renders `patch` over the fixture, then over that render (the node after
/// the apply), and returns both YAMLs.
fn render_twice(live: &ichor_talos::config::MachineConfig, patch: &str) -> (String, String) {
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let m = machine(MachineRole::Controlplane, &[("appending", patch)]);
    let once = render(&spec, &m, live, true, None);
    let twice = render(&spec, &m, &once.config, true, None);
    (once.yaml().expect("yaml"), twice.yaml().expect("yaml"))
}

/// The value at a dotted path of the v1alpha1 document of a rendered YAML.
fn v1alpha1_at(yaml: &str, keys: &[&str]) -> Value {
    let docs = parse(yaml).to_mappings().expect("mappings");
    let doc = docs
        .iter()
        .find(|d| d.get("kind").is_none())
        .expect("v1alpha1 document");
    let mut v = Value::Mapping(doc.clone());
    for k in keys {
        v = v.get(*k).cloned().unwrap_or(Value::Null);
    }
    v
}

fn strings(items: &[&str]) -> Value {
    Value::Sequence(items.iter().map(|s| Value::String((*s).into())).collect())
}

/// A patch appending NTP servers adds them once: the render over the
/// applied config keeps exactly the servers the patch names, in both shapes.
/// Covers: R9.1, R10.2
#[test]
fn appended_time_servers_render_once() {
    let patch =
        "machine:\n  time:\n    servers:\n      - time.cloudflare.com\n      - pool.ntp.org\n";
    for file in [
        "v1.12-cni-none-controlplane.yaml",
        "v1.14-cni-none-controlplane.yaml",
    ] {
        let live = parse(&fixtures::cni_none(file));
        let (once, twice) = render_twice(&live, patch);
        assert_eq!(
            v1alpha1_at(&once, &["machine", "time", "servers"]),
            strings(&["time.cloudflare.com", "pool.ntp.org"]),
            "{file}"
        );
        assert_eq!(once, twice, "{file}");
    }
}

/// Certificate SANs appended to `machine.certSANs` and
/// `cluster.apiServer.certSANs` by strategic merge, and to `machine.certSANs`
/// by JSON 6902 `add`s at the end and at an index, are added once; SANs the node had before
/// are kept, and a SAN the node already has is not added again.
/// Covers: R9.1, R10.2
#[test]
fn appended_cert_sans_render_once() {
    let live = parse(&fixtures::cni_none("v1.12-cni-none-controlplane.yaml"));
    let patch = "machine:\n  certSANs:\n    - api.example.com\ncluster:\n  apiServer:\n    certSANs:\n      - api.example.com\n      - 10.0.0.10\n";
    let (once, twice) = render_twice(&live, patch);
    assert_eq!(once, twice);
    assert_eq!(
        v1alpha1_at(&once, &["machine", "certSANs"]),
        strings(&["api.example.com"])
    );
    let api_sans = v1alpha1_at(&once, &["cluster", "apiServer", "certSANs"]);
    let live_sans = v1alpha1_at(
        &live.to_yaml().expect("yaml"),
        &["cluster", "apiServer", "certSANs"],
    );
    let mut want: Vec<Value> = live_sans.as_sequence().cloned().unwrap_or_default();
    want.extend([
        Value::String("api.example.com".into()),
        Value::String("10.0.0.10".into()),
    ]);
    assert_eq!(api_sans, Value::Sequence(want.clone()));

    // JSON 6902, on the single v1alpha1 document Talos patches that way.
    let docs = live.to_mappings().expect("mappings");
    let single = ichor_talos::config::MachineConfig::from_mappings(
        docs.into_iter()
            .filter(|d| d.get("kind").is_none())
            .collect(),
        "test",
    )
    .expect("v1alpha1");
    let json = r#"[{"op":"add","path":"/machine/certSANs/-","value":"api.example.com"},{"op":"add","path":"/machine/certSANs/0","value":"first.example.com"}]"#;
    let (once, twice) = render_twice(&single, json);
    assert_eq!(once, twice);
    assert_eq!(
        v1alpha1_at(&once, &["machine", "certSANs"]),
        strings(&["first.example.com", "api.example.com"])
    );
}

/// Kubelet extra mounts (a list of mappings) appended by a patch are added
/// once, compared whole.
/// Covers: R9.1, R10.2
#[test]
fn appended_kubelet_extra_mounts_render_once() {
    let live = parse(&fixtures::cni_none("v1.12-cni-none-controlplane.yaml"));
    let patch = "machine:\n  kubelet:\n    extraMounts:\n      - destination: /var/lib/longhorn\n        type: bind\n        source: /var/lib/longhorn\n        options: [bind, rshared, rw]\n";
    let (once, twice) = render_twice(&live, patch);
    assert_eq!(once, twice);
    let mounts = v1alpha1_at(&once, &["machine", "kubelet", "extraMounts"]);
    assert_eq!(mounts.as_sequence().map(Vec::len), Some(1), "{mounts:?}");
}

/// A delete whose item is already gone from the node (the apply of the
/// render removed it) changes nothing on the next render instead of failing.
/// Covers: R9.1, R10.2
#[test]
fn delete_of_an_item_already_gone_renders_the_same() {
    let live = parse(&fixtures::cni_none("v1.12-cni-none-controlplane.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Enabled);
    let mount = "machine:\n  kubelet:\n    extraMounts:\n      - destination: /x\n        type: bind\n        source: /x\n";
    let with_mount = render(
        &spec,
        &machine(MachineRole::Controlplane, &[("mount", mount)]),
        &live,
        true,
        None,
    );
    let delete =
        "machine:\n  kubelet:\n    extraMounts:\n      - destination: /x\n        $patch: delete\n";
    let (once, twice) = render_twice(&with_mount.config, delete);
    assert_eq!(once, twice);
    let mounts = v1alpha1_at(&once, &["machine", "kubelet", "extraMounts"]);
    assert!(mounts.as_sequence().is_none_or(Vec::is_empty), "{mounts:?}");
}
