//! Config patches applied by Ichor and by the real `talosctl machineconfig
//! patch` (tools cache, `tools/testbin.sh`) on the fixtures in `testdata/talos`, in both
//! shapes, with generated strategic-merge and JSON 6902 patches: the results
//! must be equal as Talos reads them.
//!
//! Each case writes a base config and its patch files, runs talosctl once
//! and Ichor once, and compares the two outputs after dropping the zero
//! values Talos's encoder writes for unset fields (`certSANs: []`, `key:
//! ""`, `{}`), both as YAML trees and as Ichor's typed config. When talosctl
//! refuses a patch, Ichor must refuse it too, except for the differences
//! ADR 0009 names ("Talos lines"): Ichor applies the v1.14 rules on every
//! line (several documents for one config document, a config holding no
//! document), and a case talosctl v1.13.9 refuses for those rules is
//! judged by talosctl again, handed the documents one at a time in v1.14's
//! order. Each case ends as a match, a refusal by both, a named difference
//! ([`Named`]) or an unexplained difference, which fails the test; the run
//! prints the counts.
//!
//! The cases come from a fixed seed, so CI runs the same corpus every time:
//! `ICHOR_DIFF_CASES` (default 300) sets how many, `ICHOR_DIFF_SEED` picks
//! another corpus; `make fuzz-patch` runs 5000. Two talosctl processes run
//! at a time.
//!
//! talosctl here is v1.13.9 (the newest the Go module proxy serves), which
//! refuses the v1.14 Kubernetes document kinds (`KubePrismConfig`, ...): with
//! talosctl the v1.14 fixtures take part with the documents it knows (the
//! v1alpha1 document of the v1.14 shape, `HostnameConfig`, `VolumeConfig`,
//! `RegistryMirrorConfig`; its `ResolverConfig` has a v1.14 field) plus the
//! `LinkConfig` and `ExtensionServiceConfig` documents each case adds. The
//! second peer, Talos's own v1.14 config machinery (`machinery-peer patch`,
//! the same `configpatcher` talosctl runs), takes the v1.14 fixtures with
//! every document kind, and patches of the `Kube*` documents besides
//! (`ICHOR_DIFF_MACHINERY_CASES`, default 300).
//!
//! Covers: R9.1, R9.1a, and the null values and empty documents of ADR 0009.

// The test prints how many cases it judged, for the CI log.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ichor_talos::config::MachineConfig;
use ichor_talos::patch::ConfigPatch;
use ichor_testenv::Tool;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

fn fixtures() -> PathBuf {
    ichor_testenv::fixtures::talos_dir()
}

/// The real Talos a case is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// `talosctl machineconfig patch` (v1.13.9): both shapes, the documents it reads.
    Talosctl,
    /// `machinery-peer patch`: Talos's v1.14 machinery, the v1.14 shape whole
    /// (only with the `machinery-peer` feature).
    #[cfg_attr(not(feature = "machinery-peer"), allow(dead_code))]
    Machinery,
}

impl Peer {
    /// The fixture folders this peer is given.
    fn shapes(self) -> &'static [&'static str] {
        match self {
            Peer::Talosctl => &["stability-v1.12", "stability-v1.14"],
            Peer::Machinery => &["stability-v1.14"],
        }
    }

    fn reads(self, kind: &str) -> bool {
        match self {
            Peer::Talosctl => KINDS_TALOSCTL_READS.contains(&kind),
            Peer::Machinery => true,
        }
    }

    /// The command that patches, before its file arguments.
    fn patch_command(self) -> Command {
        match self {
            Peer::Talosctl => {
                let mut c = Command::new(Tool::Talosctl.path());
                c.args(["machineconfig", "patch"]);
                c
            }
            Peer::Machinery => {
                let mut c = Command::new(Tool::MachineryPeer.path());
                c.arg("patch");
                c
            }
        }
    }
}

/// Document kinds talosctl v1.13.9 reads; the v1.14 fixtures keep only these.
const KINDS_TALOSCTL_READS: &[&str] = &[
    "HostnameConfig",
    "VolumeConfig",
    "RegistryMirrorConfig",
    "LinkConfig",
    "ExtensionServiceConfig",
];

/// The fixture configs, by name, as text: both shapes for talosctl.
fn fixture_configs() -> Vec<(String, String)> {
    fixture_configs_for(Peer::Talosctl)
}

/// The fixture configs a peer is given, by name, as text, with the
/// documents it reads.
fn fixture_configs_for(peer: Peer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for shape in peer.shapes() {
        for name in [
            "base-controlplane.yaml",
            "base-worker.yaml",
            "overrides-controlplane.yaml",
            "overrides-worker.yaml",
        ] {
            let text = std::fs::read_to_string(fixtures().join(shape).join(name)).unwrap();
            let docs: Vec<Mapping> = yaml_docs(&text)
                .into_iter()
                .filter(|d| match d.get("kind").and_then(Value::as_str) {
                    None => true,
                    Some(kind) => peer.reads(kind),
                })
                .collect();
            out.push((format!("{shape}/{name}"), write_docs(&docs)));
        }
    }
    out
}

fn yaml_docs(text: &str) -> Vec<Mapping> {
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|d| match Value::deserialize(d).unwrap() {
            Value::Mapping(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn write_docs(docs: &[Mapping]) -> String {
    docs.iter()
        .map(|d| serde_yaml_ng::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn y(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// Adds list entries to the fixture so that patches have items to merge
/// into and delete: interfaces with VLANs, sysctls, a `LinkConfig` with two
/// addresses and an `ExtensionServiceConfig` with two config files.
fn with_base_extras(fixture: &str) -> String {
    let mut docs = yaml_docs(fixture);
    let v1 = docs
        .iter_mut()
        .find(|d| !d.contains_key("kind"))
        .expect("a v1alpha1 document");
    let machine = v1
        .entry("machine".into())
        .or_insert(Value::Mapping(Mapping::new()))
        .as_mapping_mut()
        .unwrap();
    machine.insert(
        "network".into(),
        y("interfaces:\n  - interface: eth0\n    dhcp: true\n    vlans:\n      - vlanId: 10\n        mtu: 1500\n  - interface: eth1\n    mtu: 1400\n    addresses: [192.168.1.2/24]\n"),
    );
    machine
        .entry("kubelet".into())
        .or_insert(Value::Mapping(Mapping::new()))
        .as_mapping_mut()
        .unwrap()
        .insert(
            "extraArgs".into(),
            y("feature-gates: [A=true, B=false]\nv: \"2\"\n"),
        );
    machine.insert(
        "sysctls".into(),
        y("net.core.somaxconn: \"65535\"\nvm.swappiness: \"10\"\n"),
    );
    docs.push(y("apiVersion: v1alpha1\nkind: LinkConfig\nname: eth2\nmtu: 9000\naddresses:\n  - address: 10.0.0.1/24\n  - address: 10.0.1.1/24\n").as_mapping().unwrap().clone());
    docs.push(y("apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - content: MONITOR a\n    mountPath: /usr/local/etc/nut/upsmon.conf\n  - content: MODE=netclient\n    mountPath: /usr/local/etc/nut/nut.conf\nenvironment:\n  - UPS_NAME=ups\n").as_mapping().unwrap().clone());
    write_docs(&docs)
}

// ---------------------------------------------------------------- patches

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{2,7}"
}

fn mtu() -> impl Strategy<Value = u32> {
    1280u32..9001
}

/// A piece of the v1alpha1 patch document: (section, key, YAML value text).
fn v1alpha1_piece() -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        name().prop_map(|n| ("machine", format!("network:\n  hostname: {n}\n"))),
        prop::collection::vec(name(), 1..3).prop_map(|v| (
            "machine",
            format!("certSANs: [{}]\n", v.iter().map(|n| format!("{n}.example")).collect::<Vec<_>>().join(", "))
        )),
        (name(), 0u32..100).prop_map(|(k, v)| ("machine", format!("sysctls:\n  kernel.{k}: \"{v}\"\n  vm.swappiness: \"{v}\"\n"))),
        (name(), name()).prop_map(|(k, v)| ("machine", format!("nodeLabels:\n  example.com/{k}: {v}\n"))),
        (name(), name(), any::<bool>()).prop_map(|(k, v, list)| (
            "machine",
            if list {
                format!("kubelet:\n  extraArgs:\n    {k}: [{v}, {v}2]\n    rotate-server-certificates: \"true\"\n")
            } else {
                format!("kubelet:\n  extraArgs:\n    {k}: {v}\n")
            }
        )),
        interfaces_piece().prop_map(|t| ("machine", t)),
        admission_piece().prop_map(|t| ("cluster", t)),
        prop::collection::vec(name(), 1..3).prop_map(|v| ("cluster", format!("apiServer:\n  certSANs: [{}]\n", v.join(", ")))),
        (0u8..250, 0u8..250).prop_map(|(a, b)| ("cluster", format!("network:\n  podSubnets: [10.{a}.0.0/16]\n  serviceSubnets: [10.{b}.0.0/16, fd00:{a}::/112]\n"))),
        any::<bool>().prop_map(|d| ("cluster", format!("proxy:\n  disabled: {d}\n"))),
        inline_manifest_piece().prop_map(|t| ("cluster", t)),
        prop_oneof![
            Just(("machine", "features:\n  kubePrism:\n    $patch: delete\n".to_string())),
            Just(("machine", "sysctls:\n  vm.swappiness:\n    $patch: delete\n".to_string())),
            Just(("machine", "network:\n  interfaces:\n    $patch: delete\n".to_string())),
            Just(("cluster", "apiServer:\n  auditPolicy:\n    $patch: delete\n".to_string())),
            Just(("cluster", "apiServer:\n  auditPolicy:\n    apiVersion: audit.k8s.io/v1\n    kind: Policy\n    rules:\n      - level: None\n".to_string())),
        ],
    ]
}

fn interfaces_piece() -> impl Strategy<Value = String> {
    let item = prop_oneof![
        (0u8..4, mtu(), any::<bool>(), 0u8..250).prop_map(|(i, m, dhcp, a)| format!(
            "    - interface: eth{i}\n      mtu: {m}\n      dhcp: {dhcp}\n      addresses: [172.16.{a}.1/24]\n"
        )),
        (0u8..2, 10u16..13, mtu()).prop_map(|(i, v, m)| format!(
            "    - interface: eth{i}\n      vlans:\n        - vlanId: {v}\n          mtu: {m}\n"
        )),
        (0u8..2).prop_map(|i| format!("    - interface: eth{i}\n      $patch: delete\n")),
    ];
    prop::collection::vec(item, 1..3)
        .prop_map(|items| format!("network:\n  interfaces:\n{}", items.concat()))
}

fn admission_piece() -> impl Strategy<Value = String> {
    let item = prop_oneof![
        (name(), name()).prop_map(|(k, v)| format!(
            "    - name: PodSecurity\n      configuration:\n        defaults:\n          {k}: {v}\n"
        )),
        (name(), name()).prop_map(|(n, k)| format!(
            "    - name: {n}\n      configuration:\n        {k}: [a]\n"
        )),
        Just("    - name: PodSecurity\n      $patch: delete\n".to_string()),
        Just("    - $patch: delete\n      name: PodSecurity\n".to_string()),
    ];
    prop::collection::vec(item, 1..3)
        .prop_map(|items| format!("apiServer:\n  admissionControl:\n{}", items.concat()))
}

fn inline_manifest_piece() -> impl Strategy<Value = String> {
    (name(), 0usize..3, any::<bool>()).prop_map(|(n, blank, tab)| {
        let lead = "\\n".repeat(blank) + if tab { "\\t" } else { "" };
        format!(
            "inlineManifests:\n  - name: {n}\n    contents: \"{lead}apiVersion: v1\\nkind: Namespace\\nmetadata:\\n  name: {n}\\n\"\n"
        )
    })
}

/// A `LinkConfig` patch document: `eth2` is in every base (with the
/// addresses `10.0.0.1/24` and `10.0.1.1/24`), `eth3` only once a patch
/// document added it, so its deletes may aim at a document the patch
/// appended or at none.
fn link_doc() -> impl Strategy<Value = String> {
    (2u8..4).prop_flat_map(link_doc_named)
}

fn link_doc_named(n: u8) -> impl Strategy<Value = String> {
    let head = format!("apiVersion: v1alpha1\nkind: LinkConfig\nname: eth{n}\n");
    let (h1, h2, h3, h4) = (head.clone(), head.clone(), head.clone(), head.clone());
    prop_oneof![
        3 => (mtu(), 0u8..3).prop_map(move |(m, a)| format!(
            "{h1}mtu: {m}\naddresses:\n  - address: 10.0.{a}.1/24\n"
        )),
        1 => mtu().prop_map(move |m| format!("{h2}mtu: {m}\n")),
        1 => (0u8..3).prop_map(move |a| format!(
            "{h3}addresses:\n  - address: 10.0.{a}.1/24\n    $patch: delete\n"
        )),
        1 => Just(format!("{h4}$patch: delete\n")),
    ]
}

fn extension_doc() -> impl Strategy<Value = String> {
    let head = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\n";
    prop_oneof![
        2 => (name(), any::<bool>()).prop_map(move |(c, same)| {
            let path = if same { "upsmon.conf" } else { "extra.conf" };
            format!(
                "{head}configFiles:\n  - content: {c}\n    mountPath: /usr/local/etc/nut/{path}\nenvironment:\n  - X={c}\n"
            )
        }),
        1 => Just(format!(
            "{head}configFiles:\n  - mountPath: /usr/local/etc/nut/nut.conf\n    $patch: delete\n"
        )),
        1 => Just(format!("{head}$patch: delete\n")),
    ]
}

fn hostname_doc() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => name().prop_map(|n| format!("apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: {n}\n")),
        1 => Just("apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n".to_string()),
    ]
}

/// A v1alpha1 patch document built from pieces (merged per section).
fn v1alpha1_doc() -> impl Strategy<Value = String> {
    prop::collection::vec(v1alpha1_piece(), 1..4).prop_map(|pieces| {
        // pieces of one section are merged by the test (Talos refuses duplicate keys)
        let mut v1 = Mapping::new();
        for (section, text) in &pieces {
            let entry = v1
                .entry((*section).into())
                .or_insert(Value::Mapping(Mapping::new()))
                .as_mapping_mut()
                .unwrap();
            for (k, v) in y(text).as_mapping().unwrap() {
                entry.insert(k.clone(), v.clone());
            }
        }
        serde_yaml_ng::to_string(&v1).unwrap()
    })
}

/// A patch document for one of the v1.14 `Kube*` kinds (machinery peer only).
fn kube_doc() -> impl Strategy<Value = String> {
    let head = |kind: &str| format!("apiVersion: v1alpha1\nkind: {kind}\n");
    prop_oneof![
        (0u8..250).prop_map(move |a| format!("{}podSubnets:\n  - 10.{a}.0.0/16\n", head("KubeNetworkConfig"))),
        name().prop_map(move |n| format!("{}dnsDomain: {n}.local\n", head("KubeNetworkConfig"))),
        (7000u16..8000).prop_map(move |p| format!("{}port: {p}\n", head("KubePrismConfig"))),
        Just(format!("{}$patch: delete\n", head("KubePrismConfig"))),
        (0u8..40).prop_map(move |v| format!("{}image: registry.k8s.io/kube-proxy:v1.35.{v}\n", head("KubeProxyConfig"))),
        Just(format!("{}$patch: delete\n", head("KubeProxyConfig"))),
        prop::collection::vec(name(), 1..3).prop_map(move |v| format!(
            "{}certExtraSANs: [{}]\n",
            head("KubeAPIServerConfig"),
            v.join(", ")
        )),
        (name(), name(), any::<bool>()).prop_map(move |(k, v, list)| format!(
            "{}extraArgs:\n  {k}: {}\n",
            head("KubeAPIServerConfig"),
            if list { format!("[https://{v}-a:6443, https://{v}-b:6443]") } else { v }
        )),
        (name(), name()).prop_map(move |(k, v)| format!(
            "{}extraArgs:\n  {k}: [{v}, {v}2]\n",
            head("KubeletConfig")
        )),
        (name(), 0usize..3).prop_map(move |(n, blank)| format!(
            "{}name: {n}\nmanifest: \"{}apiVersion: v1\\nkind: Namespace\\nmetadata:\\n  name: {n}\\n\"\n",
            head("KubeInlineManifestConfig"),
            "\\n".repeat(blank)
        )),
        Just(format!("{}$patch: delete\n", head("KubeFlannelCNIConfig"))),
        name().prop_map(move |n| format!(
            "{}name: PodSecurity\nconfiguration:\n  defaults:\n    enforce: {n}\n",
            head("KubeAdmissionControlConfig")
        )),
        Just(format!("{}name: rbac\n$patch: delete\n", head("KubeAuthorizerConfig"))),
        prop::collection::vec(0u8..250, 1..3).prop_map(move |v| format!(
            "{}clusterDNS: [{}]\n",
            head("KubeletConfig"),
            v.iter().map(|a| format!("10.96.0.{a}")).collect::<Vec<_>>().join(", ")
        )),
        name().prop_map(move |n| format!("{}clusterName: {n}\n", head("KubeClusterConfig"))),
        (name(), name()).prop_map(move |(k, v)| format!(
            "{}labels:\n  example.com/{k}: {v}\n",
            head("KubeNodeConfig")
        )),
        Just(format!(
            "{}configuration:\n  apiVersion: audit.k8s.io/v1\n  kind: Policy\n  rules:\n    - level: None\n",
            head("KubeAuditPolicyConfig")
        )),
    ]
}

/// A strategic merge patch for the machinery peer: the talosctl one plus up
/// to two `Kube*` documents, which may name one document twice (v1.14
/// applies them in order).
fn machinery_strategic_patch() -> impl Strategy<Value = String> {
    (
        prop::option::of(strategic_patch()),
        prop::collection::vec(kube_doc(), 0..3),
    )
        .prop_filter_map("an empty patch", |(base, kube)| {
            let docs: Vec<String> = base.into_iter().chain(kube).collect();
            (!docs.is_empty()).then(|| docs.join("---\n"))
        })
}

/// A strategic merge patch: half the time at most one document per config
/// document (what talosctl v1.13 reads), half the time several documents
/// for one config document, with deletes between them (what Talos v1.14
/// adds), among documents for others.
fn strategic_patch() -> impl Strategy<Value = String> {
    prop_oneof![distinct_documents_patch(), repeated_documents_patch()]
}

/// An optional v1alpha1 document and optional multi-document patches, one
/// of each kind.
fn distinct_documents_patch() -> impl Strategy<Value = String> {
    (
        prop::option::of(v1alpha1_doc()),
        prop::option::of(link_doc()),
        prop::option::of(extension_doc()),
        prop::option::of(hostname_doc()),
    )
        .prop_filter_map("an empty patch", |(v1, link, ext, host)| {
            let docs: Vec<String> = [v1, link, ext, host].into_iter().flatten().collect();
            (!docs.is_empty()).then(|| docs.join("---\n"))
        })
}

/// Two to four documents for one config document (the v1alpha1 one, a
/// `LinkConfig`, the `ExtensionServiceConfig` or the `HostnameConfig`),
/// deletes among them, shuffled with up to two documents for others.
fn repeated_documents_patch() -> impl Strategy<Value = String> {
    let subject = prop_oneof![
        3 => prop::collection::vec(v1alpha1_doc().boxed(), 2..5),
        3 => (2u8..4).prop_flat_map(|n| prop::collection::vec(link_doc_named(n).boxed(), 2..5)),
        1 => prop::collection::vec(extension_doc().boxed(), 2..4),
        1 => prop::collection::vec(hostname_doc().boxed(), 2..4),
    ];
    let others = prop::collection::vec(
        prop_oneof![
            link_doc().boxed(),
            hostname_doc().boxed(),
            extension_doc().boxed()
        ],
        0..3,
    );
    (subject, others, any::<u64>()).prop_map(|(subject, others, order)| {
        // the subject's documents keep their order; the others go between them
        let mut docs = subject;
        let mut order = order;
        for doc in others {
            let at = (order % (docs.len() as u64 + 1)) as usize;
            order /= docs.len() as u64 + 1;
            docs.insert(at, doc);
        }
        docs.join("---\n")
    })
}

/// Patches applied one after another to the v1alpha1 document alone: JSON
/// 6902 patches and strategic merge patches of that document (some with
/// several documents for it), mixed.
fn mixed_patches() -> impl Strategy<Value = Vec<String>> {
    // JSON 6902 operations that mostly apply: the mix is for merges
    let json = prop::collection::vec(
        prop_oneof![
            name().prop_map(|n| format!(
                "- op: add\n  path: /machine/network\n  value:\n    hostname: {n}\n"
            )),
            name().prop_map(|n| format!(
                "- op: add\n  path: /machine/sysctls\n  value:\n    kernel.{n}: \"1\"\n"
            )),
            (name(), name()).prop_map(|(n, v)| format!(
                "- op: add\n  path: /machine/nodeLabels\n  value:\n    example.com/{n}: {v}\n"
            )),
        ],
        1..3,
    )
    .prop_map(|ops| ops.concat());
    let one = prop_oneof![
        json.boxed(),
        v1alpha1_doc().boxed(),
        prop::collection::vec(v1alpha1_doc(), 2..4)
            .prop_map(|docs| docs.join("---\n"))
            .boxed(),
    ];
    prop::collection::vec(one, 2..4).prop_filter("one patch of each kind", |patches| {
        let json = patches.iter().filter(|p| p.starts_with("- op:")).count();
        json > 0 && json < patches.len()
    })
}

/// A JSON 6902 patch (YAML form) for the v1alpha1 document alone.
fn json6902_patch() -> impl Strategy<Value = String> {
    let op = prop_oneof![
        name().prop_map(|n| format!(
            "- op: add\n  path: /machine/network\n  value:\n    hostname: {n}\n"
        )),
        name().prop_map(|n| format!(
            "- op: add\n  path: /machine/certSANs/-\n  value: {n}.example\n"
        )),
        name().prop_map(|n| format!("- op: replace\n  path: /cluster/clusterName\n  value: {n}\n")),
        Just("- op: remove\n  path: /machine/features/kubePrism\n".to_string()),
        Just("- op: remove\n  path: /machine/nope\n".to_string()),
        name().prop_map(|n| format!("- op: test\n  path: /cluster/clusterName\n  value: {n}\n")),
        Just("- op: add\n  path: /cluster/proxy/disabled\n  value: true\n".to_string()),
    ];
    prop::collection::vec(op, 1..4).prop_map(|ops| ops.concat())
}

// ------------------------------------------------------------ comparison

/// Drops what Talos's encoder writes for unset fields: null, empty strings,
/// empty lists and empty mappings (recursively).
fn drop_zero_values(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Mapping(m) => {
            let out: Mapping = m
                .iter()
                .filter_map(|(k, v)| drop_zero_values(v).map(|v| (k.clone(), v)))
                .collect();
            (!out.is_empty()).then_some(Value::Mapping(out))
        }
        Value::Sequence(s) => {
            let out: Vec<Value> = s.iter().filter_map(drop_zero_values).collect();
            (!out.is_empty()).then_some(Value::Sequence(out))
        }
        other => Some(other.clone()),
    }
}

/// A config as Talos reads it: documents with zero values dropped, and
/// Ichor's typed reading of them.
fn as_talos_reads(text: &str) -> Result<(Vec<Value>, MachineConfig), String> {
    let trees: Vec<Value> = yaml_docs(text)
        .iter()
        .map(|d| {
            drop_zero_values(&Value::Mapping(d.clone())).unwrap_or(Value::Mapping(Mapping::new()))
        })
        .collect();
    let mappings = trees
        .iter()
        .map(|t| t.as_mapping().cloned().unwrap_or_default())
        .collect();
    let typed = MachineConfig::from_mappings(mappings, "output")
        .map_err(|e| ichor_api::error_text::chain(&e))?;
    Ok((trees, typed))
}

struct Case {
    fixture: String,
    /// The config patched; empty for a config that holds no document.
    base: String,
    /// The patches, applied in order (one `--patch` each).
    patches: Vec<String>,
}

impl Case {
    fn new(fixture: impl Into<String>, base: impl Into<String>, patch: impl Into<String>) -> Self {
        Self {
            fixture: fixture.into(),
            base: base.into(),
            patches: vec![patch.into()],
        }
    }

    fn patches_text(&self) -> String {
        self.patches.join("\n--- then the patch:\n")
    }
}

/// How one case came out.
#[derive(Debug)]
enum Outcome {
    /// Both applied the patch, with equal results.
    Agree,
    /// Both refused the patch.
    BothRefuse,
    /// A difference ADR 0009 names (see [`Named`]).
    Named(Named),
    Disagree(String),
}

/// The differences between Ichor and a peer that ADR 0009 names ("Talos
/// lines and what Ichor does"); any other difference fails the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Named {
    /// talosctl v1.13.9 refuses a patch with several documents for one
    /// config document; Ichor applies it as v1.14 does. Checked: talosctl
    /// given the documents one patch at a time, in v1.14's order, gives
    /// Ichor's result.
    RepeatedDocuments,
    /// talosctl v1.13.9 crashes on a delete aimed at a document the config
    /// does not have when the delete is reached (one the patch appends, or
    /// one it deleted before), or, for an unnamed kind, writes the delete
    /// as an empty document; v1.14 and Ichor skip such a delete, or apply it
    /// to the document the patch appended. Checked as
    /// [`Named::RepeatedDocuments`] is.
    DeleteOfAbsentDocument,
    /// talosctl reads no config from an empty file ("config not found");
    /// Talos's API patches a config holding no document on both lines, and
    /// so does Ichor (checked against the v1.14 machinery).
    EmptyConfigFile,
    /// A delete of a `machine.sysctls` key that is gone: Talos refuses it
    /// (a missing map key), Ichor changes nothing (ADR 0009, decision 4).
    DeleteOfMissingMapKey,
}

fn talosctl_patch(dir: &Path, base: &str, patch: &str) -> Result<String, String> {
    peer_patch(Peer::Talosctl, dir, base, &[patch.to_string()])
}

fn peer_patch(peer: Peer, dir: &Path, base: &str, patches: &[String]) -> Result<String, String> {
    let (b, o) = (dir.join("base.yaml"), dir.join("out.yaml"));
    let _ = std::fs::remove_file(&o);
    let mut command = peer.patch_command();
    if peer == Peer::Machinery && base.trim().is_empty() {
        command.arg("--from-empty");
    } else {
        std::fs::write(&b, base).unwrap();
        command.arg(&b);
    }
    for (i, patch) in patches.iter().enumerate() {
        let p = dir.join(format!("patch-{i}.yaml"));
        std::fs::write(&p, patch).unwrap();
        command.arg("--patch").arg(format!("@{}", p.display()));
    }
    let out = command.arg("-o").arg(&o).output().expect("the peer runs");
    if out.status.success() {
        Ok(std::fs::read_to_string(&o).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn ichor_patch(base: &str, patch: &str) -> Result<String, String> {
    ichor_patches(base, &[patch.to_string()])
}

fn ichor_patches(base: &str, patches: &[String]) -> Result<String, String> {
    let said = |e: &(dyn std::error::Error + 'static)| ichor_api::error_text::chain(e);
    let mut cfg = MachineConfig::parse(base).map_err(|e| said(&e))?;
    for (i, patch) in patches.iter().enumerate() {
        let origin = format!("patch-{i}.yaml");
        let p = ConfigPatch::parse(patch, &origin).map_err(|e| said(&e))?;
        cfg = p.apply(&cfg, &origin).map_err(|e| said(&e))?;
    }
    cfg.to_yaml().map_err(|e| said(&e))
}

fn compare(dir: &Path, case: &Case) -> Outcome {
    compare_with(Peer::Talosctl, dir, case)
}

fn compare_with(peer: Peer, dir: &Path, case: &Case) -> Outcome {
    let theirs = peer_patch(peer, dir, &case.base, &case.patches);
    let ours = ichor_patches(&case.base, &case.patches);
    classify(peer, dir, case, theirs, ours)
}

/// The comparison rules, on the two results of one case.
fn judge(
    peer: Peer,
    case: &Case,
    theirs: Result<String, String>,
    ours: Result<String, String>,
) -> Outcome {
    let report = |what: &str, detail: String| {
        Outcome::Disagree(format!(
            "{what} on {}\n--- patch:\n{}\n--- {detail}",
            case.fixture,
            case.patches_text()
        ))
    };
    match (theirs, ours) {
        (Err(_), Err(_)) => Outcome::BothRefuse,
        (Err(t), Ok(_)) => report(
            &format!("{peer:?} refused, Ichor applied"),
            format!("{peer:?}: {t}"),
        ),
        (Ok(_), Err(o)) => report(
            &format!("{peer:?} applied, Ichor refused"),
            format!("Ichor: {o}"),
        ),
        (Ok(t), Ok(o)) => {
            let (tt, ttyped) = match as_talos_reads(&t) {
                Ok(x) => x,
                Err(e) => return report(&format!("Ichor cannot read {peer:?}'s output"), e),
            };
            let (ot, otyped) = match as_talos_reads(&o) {
                Ok(x) => x,
                Err(e) => return report("Ichor cannot read its own output", e),
            };
            if tt != ot {
                return report(
                    "different YAML trees",
                    format!(
                        "{peer:?}:\n{}\n--- Ichor:\n{}",
                        serde_yaml_ng::to_string(&tt).unwrap(),
                        serde_yaml_ng::to_string(&ot).unwrap()
                    ),
                );
            }
            if ttyped != otyped {
                return report("different typed configs", format!("{ttyped:?}\n{otyped:?}"));
            }
            Outcome::Agree
        }
    }
}

/// [`judge`], then a disagreement that is one of the [`Named`] differences
/// is classified as such, each only on the evidence that names it: the
/// peer's own words, and for talosctl's refusals of what v1.14 accepts, the
/// result talosctl gives when handed the documents one at a time (which
/// also judges Ichor's refusals of such patches).
fn classify(
    peer: Peer,
    dir: &Path,
    case: &Case,
    theirs: Result<String, String>,
    ours: Result<String, String>,
) -> Outcome {
    let plain = judge(peer, case, theirs.clone(), ours.clone());
    let said = match &theirs {
        Err(said) => said.clone(),
        // talosctl v1.13.9 writes the delete of an unnamed document it does
        // not have as an empty document (a config it cannot read back)
        Ok(text)
            if peer == Peer::Talosctl
                && matches!(plain, Outcome::Disagree(_))
                && yaml_docs(text).iter().any(Mapping::is_empty) =>
        {
            EMPTY_DOCUMENT_WRITTEN.to_string()
        }
        Ok(_) => return plain,
    };
    if peer == Peer::Talosctl && case.base.trim().is_empty() {
        // talosctl's CLI patches no empty config: the v1.14 machinery judges these
        return match (&plain, &ours) {
            (Outcome::Disagree(_), Ok(_))
                if said.contains("config not found") || said.contains("duplicate document") =>
            {
                Outcome::Named(Named::EmptyConfigFile)
            }
            _ => plain,
        };
    }
    let v1_14_only = if peer != Peer::Talosctl {
        None
    } else if said.contains("duplicate document") && said.contains("is not allowed") {
        Some(Named::RepeatedDocuments)
    } else if said.contains("panic") || said == EMPTY_DOCUMENT_WRITTEN {
        Some(Named::DeleteOfAbsentDocument)
    } else {
        None
    };
    let Some(named) = v1_14_only else {
        return match (&plain, &ours) {
            (Outcome::Disagree(_), Ok(_)) if is_missing_map_key_delete(&said) => {
                Outcome::Named(Named::DeleteOfMissingMapKey)
            }
            _ => plain,
        };
    };
    // talosctl v1.13.9 refused what v1.14 takes: it says nothing of the
    // result, so talosctl is asked again, one document at a time
    let stepped = talosctl_document_by_document(dir, &case.base, &case.patches);
    match (
        judge(peer, case, stepped.clone(), ours.clone()),
        &stepped,
        &ours,
    ) {
        (Outcome::Agree, _, _) => Outcome::Named(named),
        (Outcome::BothRefuse, _, _) => Outcome::BothRefuse,
        (_, Err(e), Ok(_)) if is_missing_map_key_delete(e) => {
            Outcome::Named(Named::DeleteOfMissingMapKey)
        }
        (Outcome::Disagree(d), _, _) => Outcome::Disagree(format!(
            "talosctl refused ({said}); given the documents one at a time: {d}"
        )),
        (other, _, _) => Outcome::Disagree(format!(
            "talosctl refused ({said}); given the documents one at a time: {other:?}"
        )),
    }
}

/// What talosctl v1.13.9 "said" when it wrote an empty document.
const EMPTY_DOCUMENT_WRITTEN: &str = "talosctl wrote an empty document";

/// Talos's refusal of a delete of a `machine.sysctls` key that is gone.
fn is_missing_map_key_delete(said: &str) -> bool {
    said.contains("failed to delete path 'machine.sysctls.") && said.contains("lookup failed")
}

// ------------------------------------- v1.14's order, on talosctl v1.13.9

/// Applies the patches with talosctl v1.13.9 the way Talos v1.14 applies
/// them (ADR 0009, from Talos's `configpatcher` and `container`): a JSON
/// 6902 patch as it is; a strategic merge patch one document at a time,
/// after a first step made of every delete aimed at the v1alpha1 document;
/// the deletes of a document the config does not have at that step are
/// left out (v1.14 skips them). Each step is a patch talosctl v1.13.9
/// takes: at most one document for each config document.
fn talosctl_document_by_document(
    dir: &Path,
    base: &str,
    patches: &[String],
) -> Result<String, String> {
    let mut current = base.to_string();
    for patch in patches {
        if patch.trim_start().starts_with('-') || patch.trim_start().starts_with('[') {
            current = talosctl_patch(dir, &current, patch)?;
            continue;
        }
        let docs = yaml_docs(patch);
        let v1_deletes: Vec<Mapping> = docs
            .iter()
            .filter(|d| is_v1alpha1_patch(d))
            .filter_map(only_deletes)
            .collect();
        if !v1_deletes.is_empty() && has_document(&current, &docs[0], true) {
            current = talosctl_patch(dir, &current, &write_docs(&v1_deletes))?;
        }
        for doc in &docs {
            let v1 = is_v1alpha1_patch(doc);
            let step = if !v1 && has_document(&current, doc, false) {
                Some(doc.clone())
            } else {
                without_deletes(doc)
            };
            if let Some(step) = step.filter(has_something_to_merge) {
                current = talosctl_patch(dir, &current, &write_docs(&[step]))?;
            }
        }
    }
    Ok(current)
}

fn is_v1alpha1_patch(doc: &Mapping) -> bool {
    !doc.contains_key("kind")
}

fn is_delete_marker(v: &Value) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// Whether the config holds the document a patch document aims at.
fn has_document(config: &str, doc: &Mapping, v1alpha1: bool) -> bool {
    let id = |d: &Mapping| {
        ["apiVersion", "kind", "name"].map(|k| d.get(k).and_then(Value::as_str).map(str::to_string))
    };
    yaml_docs(config).iter().any(|d| {
        if v1alpha1 {
            is_v1alpha1_patch(d)
        } else {
            !is_v1alpha1_patch(d) && id(d) == id(doc)
        }
    })
}

/// The deletes of a v1alpha1 patch document alone, or `None` when it has none.
fn only_deletes(doc: &Mapping) -> Option<Mapping> {
    fn project(m: &Mapping) -> Option<Mapping> {
        let out: Mapping = m
            .iter()
            .filter_map(|(k, v)| {
                let kept = match v {
                    v if is_delete_marker(v) => Some(v.clone()),
                    Value::Mapping(inner) => project(inner).map(Value::Mapping),
                    Value::Sequence(items) => {
                        let deletes: Vec<Value> = items
                            .iter()
                            .filter(|i| is_delete_marker(i))
                            .cloned()
                            .collect();
                        (!deletes.is_empty()).then_some(Value::Sequence(deletes))
                    }
                    _ => None,
                };
                kept.map(|v| (k.clone(), v))
            })
            .collect();
        (!out.is_empty()).then_some(out)
    }
    project(doc)
}

/// A patch document without its deletes (mappings and lists left empty by
/// them dropped), or `None` when it deletes the whole document.
fn without_deletes(doc: &Mapping) -> Option<Mapping> {
    fn strip(m: &Mapping) -> Mapping {
        m.iter()
            .filter(|(_, v)| !is_delete_marker(v))
            .filter_map(|(k, v)| {
                let kept = match v {
                    Value::Mapping(inner) => {
                        let s = strip(inner);
                        (inner.is_empty() || !s.is_empty()).then_some(Value::Mapping(s))
                    }
                    Value::Sequence(items) => {
                        let s: Vec<Value> = items
                            .iter()
                            .filter(|i| !is_delete_marker(i))
                            .map(|i| match i {
                                Value::Mapping(im) => Value::Mapping(strip(im)),
                                other => other.clone(),
                            })
                            .collect();
                        (items.is_empty() || !s.is_empty()).then_some(Value::Sequence(s))
                    }
                    other => Some(other.clone()),
                };
                kept.map(|v| (k.clone(), v))
            })
            .collect()
    }
    (!is_delete_marker(&Value::Mapping(doc.clone()))).then(|| strip(doc))
}

/// Whether Talos finds something to merge in a patch document: a key
/// other than `version`, `kind` and `name`.
fn has_something_to_merge(doc: &Mapping) -> bool {
    doc.keys()
        .any(|k| !matches!(k.as_str(), Some("version" | "kind" | "name")))
}

/// The tally of a run.
#[derive(Default)]
struct Tally {
    agree: usize,
    refused: usize,
    named: std::collections::BTreeMap<Named, usize>,
    unexplained: Vec<String>,
}

impl Tally {
    fn named_total(&self) -> usize {
        self.named.values().sum()
    }

    fn summary(&self, cases: usize) -> String {
        format!(
            "{cases} cases: {} applied by both with equal results, {} refused by both, {} named differences {:?}, {} unexplained",
            self.agree,
            self.refused,
            self.named_total(),
            self.named,
            self.unexplained.len()
        )
    }
}

/// Runs the cases, two peer processes at a time.
fn run_cases(peer: Peer, cases: &[Case]) -> Tally {
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let dir = tempfile::tempdir().unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(case) = cases.get(i) else { break };
                    let outcome = compare_with(peer, dir.path(), case);
                    let mut t = tally.lock().unwrap();
                    match outcome {
                        Outcome::Agree => t.agree += 1,
                        Outcome::BothRefuse => t.refused += 1,
                        Outcome::Named(n) => *t.named.entry(n).or_default() += 1,
                        Outcome::Disagree(d) => t.unexplained.push(format!("case {i}: {d}")),
                    }
                }
            });
        }
    });
    tally.into_inner().unwrap()
}

fn env_number(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The generated corpus, by the case's number modulo 10: strategic merge
/// patches on every fixture (both shapes, with the base extras), half of
/// them with several documents for one config document (0, 1, 3, 5, 6, 8);
/// JSON 6902 patches on the v1alpha1 document alone (2, 7: Talos applies
/// JSON patches to single-document configs); strategic merge and JSON 6902
/// patches mixed, applied one after another to the v1alpha1 document alone
/// (with the base extras: interfaces, sysctls and `extraArgs` to merge
/// into and delete) (4); strategic merge patches on a config holding no document (9).
fn corpus(peer: Peer, count: usize, seed: u64) -> Vec<Case> {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let fixtures = fixture_configs_for(peer);
    let strategic = match peer {
        Peer::Talosctl => strategic_patch().boxed(),
        Peer::Machinery => machinery_strategic_patch().boxed(),
    };
    let json = json6902_patch();
    let mixed = mixed_patches();
    let v1alpha1_alone = |text: &str| {
        write_docs(&[yaml_docs(text)
            .into_iter()
            .find(|d| !d.contains_key("kind"))
            .unwrap()])
    };
    (0..count)
        .map(|i| {
            let (fixture, text) = &fixtures[i % fixtures.len()];
            match i % 10 {
                2 | 7 => Case::new(
                    format!("{fixture} (v1alpha1 document alone)"),
                    v1alpha1_alone(text),
                    json.new_tree(&mut runner).unwrap().current(),
                ),
                4 => Case {
                    fixture: format!(
                        "{fixture} (v1alpha1 document alone, with the base extras, mixed patches)"
                    ),
                    base: v1alpha1_alone(&with_base_extras(text)),
                    patches: mixed.new_tree(&mut runner).unwrap().current(),
                },
                9 => Case::new(
                    "an empty config",
                    "",
                    strategic.new_tree(&mut runner).unwrap().current(),
                ),
                _ => Case::new(
                    fixture.clone(),
                    with_base_extras(text),
                    strategic.new_tree(&mut runner).unwrap().current(),
                ),
            }
        })
        .collect()
}

/// The corpus's shape: how many cases hold several documents for one
/// config document, mixed patch kinds, and an empty config.
fn corpus_shape(cases: &[Case]) -> (usize, usize, usize) {
    let repeated = cases
        .iter()
        .filter(|c| c.patches.iter().any(|p| names_a_document_twice(p)))
        .count();
    let mixed = cases.iter().filter(|c| c.patches.len() > 1).count();
    let empty = cases.iter().filter(|c| c.base.trim().is_empty()).count();
    (repeated, mixed, empty)
}

/// Whether a strategic merge patch has two documents for one config document.
fn names_a_document_twice(patch: &str) -> bool {
    if patch.trim_start().starts_with('-') {
        return false;
    }
    let ids: Vec<[Option<String>; 3]> = yaml_docs(patch)
        .iter()
        .map(|d| {
            ["apiVersion", "kind", "name"]
                .map(|k| d.get(k).and_then(Value::as_str).map(str::to_string))
        })
        .collect();
    ids.iter()
        .enumerate()
        .any(|(i, id)| ids[i + 1..].contains(id))
}

/// Runs a generated corpus against a peer and checks it: every case a
/// match or a named difference, and the corpus as broad as it should be.
fn run_corpus(peer: Peer, count: usize, seed: u64) -> (Vec<Case>, Tally) {
    let cases = corpus(peer, count, seed);
    let (repeated, mixed, empty) = corpus_shape(&cases);
    let tally = run_cases(peer, &cases);
    eprintln!(
        "{peer:?}, seed {seed}: {} ({repeated} with several documents for one config document, {mixed} with mixed patches, {empty} on an empty config)",
        tally.summary(cases.len())
    );
    // the corpus must mostly exercise merges, not refusals
    assert!(
        tally.refused * 3 < cases.len(),
        "{} of {} cases were refused by both tools; the generator no longer exercises merges",
        tally.refused,
        cases.len()
    );
    assert!(
        repeated * 5 > cases.len() && mixed * 20 > cases.len() && empty * 20 > cases.len(),
        "the corpus lost its shape: {repeated} repeated, {mixed} mixed, {empty} empty of {}",
        cases.len()
    );
    assert!(
        tally.unexplained.is_empty(),
        "{} of {} cases disagree with {peer:?} in a way ADR 0009 does not name:\n\n{}",
        tally.unexplained.len(),
        cases.len(),
        tally.unexplained.join("\n\n")
    );
    (cases, tally)
}

/// Covers: R9.1, R9.1a — the fixed-seed corpus (300 cases unless
/// `ICHOR_DIFF_CASES` says otherwise) agrees with talosctl v1.13.9 on
/// every case but the differences ADR 0009 names for the v1.13 line.
#[test]
fn generated_patches_agree_with_talosctl() {
    let count = env_number("ICHOR_DIFF_CASES", 300) as usize;
    let seed = env_number("ICHOR_DIFF_SEED", 17);
    let (_, tally) = run_corpus(Peer::Talosctl, count, seed);
    assert!(
        (tally.agree + tally.named_total()) * 2 > count,
        "only {} of {count} cases applied by both",
        tally.agree + tally.named_total()
    );
}

/// The comparison can fail: talosctl's real result against an Ichor
/// result with one pod subnet changed, and against a refusal, are both
/// disagreements; the real results of both agree.
#[test]
fn the_comparison_sees_a_wrong_result() {
    let base = with_base_extras(
        &fixture_configs()
            .into_iter()
            .find(|(n, _)| n == "stability-v1.12/base-controlplane.yaml")
            .unwrap()
            .1,
    );
    let case = Case::new(
        "stability-v1.12/base-controlplane.yaml",
        base,
        "cluster:\n  network:\n    podSubnets:\n      - 10.7.0.0/16\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let theirs = peer_patch(Peer::Talosctl, dir.path(), &case.base, &case.patches);
    let ours = ichor_patches(&case.base, &case.patches);
    assert!(theirs.as_ref().unwrap().contains("10.7.0.0/16"));
    assert!(matches!(
        judge(Peer::Talosctl, &case, theirs.clone(), ours.clone()),
        Outcome::Agree
    ));
    let wrong = ours.clone().unwrap().replace("10.7.0.0/16", "10.8.0.0/16");
    let Outcome::Disagree(d) = judge(Peer::Talosctl, &case, theirs.clone(), Ok(wrong)) else {
        panic!("a changed pod subnet went unseen");
    };
    assert!(d.contains("different YAML trees"), "{d}");
    assert!(matches!(
        judge(Peer::Talosctl, &case, theirs, Err("refused".into())),
        Outcome::Disagree(_)
    ));
}

/// The checks against Talos's own v1.14 machinery (`machinery-peer`): built
/// only with the `machinery-peer` feature (`make check-machinery`), because
/// the module proxy does not serve Talos's v1.14 machinery, so a fresh
/// machine cannot build the peer (ADR 0001).
#[cfg(feature = "machinery-peer")]
mod machinery_peer {
    use super::*;

    /// Covers: R9.1, R9.1a (v1.14 shape whole) — the fixed-seed corpus on
    /// the v1.14 fixtures with all their document kinds, patches of the
    /// `Kube*` documents, several documents for one config document and
    /// patches on an empty config, agrees with Talos's v1.14 machinery on
    /// every case but the differences ADR 0009 names (300 unless
    /// `ICHOR_DIFF_MACHINERY_CASES` says otherwise).
    #[test]
    fn generated_patches_agree_with_talos_v1_14_machinery() {
        let count = env_number("ICHOR_DIFF_MACHINERY_CASES", 300) as usize;
        let seed = env_number("ICHOR_DIFF_SEED", 17);
        let (cases, tally) = run_corpus(Peer::Machinery, count, seed);
        let kube = cases
            .iter()
            .filter(|c| c.patches.iter().any(|p| p.contains("kind: Kube")))
            .count();
        eprintln!("{kube} of {count} cases patch a Kube* document");
        assert!(
            kube * 3 > cases.len(),
            "only {kube} of {} cases patch a Kube* document",
            cases.len()
        );
        let v1_14_only = [
            Named::RepeatedDocuments,
            Named::DeleteOfAbsentDocument,
            Named::EmptyConfigFile,
        ];
        assert!(
            v1_14_only.iter().all(|n| !tally.named.contains_key(n)),
            "differences of talosctl v1.13 counted against v1.14: {:?}",
            tally.named
        );
        assert!(
            tally.agree * 2 > count,
            "only {} of {count} cases applied by both",
            tally.agree
        );
    }

    fn assert_agrees_with_machinery(fixture: &str, patch: &str) {
        assert_agrees_with(Peer::Machinery, fixture, patch);
    }

    fn assert_machinery_agrees(fixture: &str, base: &str, patch: &str) {
        let (outcome, _) = outcome(Peer::Machinery, fixture, base, patch);
        assert!(matches!(outcome, Outcome::Agree), "{outcome:?}");
    }

    /// Several documents for one config document, as v1.14 applies them.
    /// Covers: R9.1a
    #[test]
    fn repeated_documents_agree_with_v1_14() {
        let fixture = "stability-v1.14/base-worker.yaml";
        assert_machinery_agrees(fixture, &base_of(Peer::Machinery, fixture), REPEATED_LINK);
    }

    /// A document added, deleted and added again, as v1.14 applies it.
    /// Covers: R9.1a
    #[test]
    fn a_delete_between_repeated_documents_agrees_with_v1_14() {
        let fixture = "stability-v1.14/base-controlplane.yaml";
        assert_machinery_agrees(fixture, &base_of(Peer::Machinery, fixture), DELETE_BETWEEN);
    }

    /// A patch on a config holding no document, as Talos's v1.14 API applies it.
    /// Covers: R9.1a
    #[test]
    fn a_patch_on_an_empty_config_agrees_with_v1_14() {
        assert_machinery_agrees("an empty config", "", ON_EMPTY);
        assert_machinery_agrees(
            "an empty config",
            "",
            "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  a: b\n---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  c: [d, e]\n",
        );
    }

    /// `extraArgs` list values in the v1.14 `Kube*` documents and the
    /// v1alpha1 one, replaced per key, with several documents for one.
    /// Covers: R9.1a
    #[test]
    fn extra_args_lists_agree_with_v1_14() {
        let fixture = "stability-v1.14/overrides-controlplane.yaml";
        assert_machinery_agrees(
            fixture,
            &base_of(Peer::Machinery, fixture),
            "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  service-account-issuer:\n    - https://old.example:6443\n    - https://new.example:6443\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nextraArgs:\n  feature-gates: [A=true]\n---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  service-account-issuer: https://only.example:6443\n  audit-log-maxage: [\"30\"]\n---\nmachine:\n  kubelet:\n    extraArgs:\n      feature-gates: [C=true, D=false]\n",
        );
    }

    /// `KubeNetworkConfig` subnets are replaced, not appended, by both.
    #[test]
    fn kube_network_subnets_replace() {
        assert_agrees_with_machinery(
            "stability-v1.14/overrides-controlplane.yaml",
            "apiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.9.0.0/16]\nserviceSubnets: [10.10.0.0/12]\n",
        );
    }

    /// A `KubeInlineManifestConfig` added with leading blank lines keeps them.
    #[test]
    fn kube_inline_manifest_keeps_its_leading_lines() {
        assert_agrees_with_machinery(
            "stability-v1.14/base-controlplane.yaml",
            "apiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: \"\\n\\nkind: List\\n\"\n",
        );
    }

    /// Deleting the flannel document and a named authorizer, as the Cilium preset does.
    #[test]
    fn kube_documents_deleted_by_kind_and_name() {
        assert_agrees_with_machinery(
            "stability-v1.14/base-controlplane.yaml",
            "apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n---\napiVersion: v1alpha1\nkind: KubeAuthorizerConfig\nname: rbac\n$patch: delete\n",
        );
    }
}

// ------------------------------------------------- named regressions

fn assert_agrees(fixture: &str, patch: &str) {
    assert_agrees_with(Peer::Talosctl, fixture, patch);
}

/// One named case: the fixture (as this peer is given it, with the base
/// extras) patched by Ichor and by the peer reads the same.
fn assert_agrees_with(peer: Peer, fixture: &str, patch: &str) {
    let text = fixture_configs_for(peer)
        .into_iter()
        .find(|(n, _)| n == fixture)
        .unwrap()
        .1;
    let case = Case::new(fixture, with_base_extras(&text), patch);
    let dir = tempfile::tempdir().unwrap();
    if let Outcome::Disagree(d) = compare_with(peer, dir.path(), &case) {
        panic!("{d}");
    }
}

/// An admission-control plugin deleted by `name` is gone in both.
#[test]
fn delete_admission_plugin_by_name() {
    assert_agrees(
        "stability-v1.12/base-controlplane.yaml",
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n",
    );
    let out = ichor_patch(
        &with_base_extras(&fixture_configs()[0].1),
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n",
    )
    .unwrap();
    assert!(!out.contains("PodSecurity"), "{out}");
}

/// An address of a `LinkConfig` document deleted by `address`.
#[test]
fn delete_link_address() {
    assert_agrees(
        "stability-v1.14/base-controlplane.yaml",
        "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth2\naddresses:\n  - address: 10.0.0.1/24\n    $patch: delete\n",
    );
}

/// A config file of an `ExtensionServiceConfig` document deleted by `mountPath`.
#[test]
fn delete_extension_service_config_file() {
    assert_agrees(
        "stability-v1.12/overrides-worker.yaml",
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - mountPath: /usr/local/etc/nut/nut.conf\n    $patch: delete\n",
    );
}

/// A config file patched without `content` keeps its content (items merge, not replace).
#[test]
fn extension_service_config_file_merges_by_mount_path() {
    assert_agrees(
        "stability-v1.14/base-worker.yaml",
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - mountPath: /usr/local/etc/nut/nut.conf\n    content: MODE=standalone\n",
    );
}

/// An inline manifest whose contents start with empty lines loses them, as in Talos.
#[test]
fn inline_manifest_leading_newlines_are_dropped() {
    assert_agrees(
        "stability-v1.12/base-controlplane.yaml",
        "cluster:\n  inlineManifests:\n    - name: cilium\n      contents: \"\\n\\n\\tkind: List\\n\"\n",
    );
}

/// A deleted interface and a merged one; a VLAN merged by `vlanId`.
#[test]
fn interfaces_delete_and_merge() {
    assert_agrees(
        "stability-v1.12/overrides-controlplane.yaml",
        "machine:\n  network:\n    interfaces:\n      - interface: eth1\n        $patch: delete\n      - interface: eth0\n        vlans:\n          - vlanId: 10\n            mtu: 9000\n",
    );
}

/// `extraArgs` values are replaced per key, list values included.
#[test]
fn extra_args_replace_per_key() {
    assert_agrees(
        "stability-v1.12/base-worker.yaml",
        "machine:\n  kubelet:\n    extraArgs:\n      feature-gates: [C=true]\n      x: y\n",
    );
}

// ------------------- the v1.14 patch rules (ADR 0009, "Talos lines")

/// Several documents for one `LinkConfig` (`eth2`, in every base): each
/// merges into what the one before left.
const REPEATED_LINK: &str = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth2\nmtu: 1400\naddresses:\n  - address: 10.0.5.1/24\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth2\nmtu: 9100\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth2\naddresses:\n  - address: 10.0.0.1/24\n    $patch: delete\n";

/// A `LinkConfig` (`eth3`, in no base) added, deleted, added again.
const DELETE_BETWEEN: &str = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\nmtu: 1500\naddresses:\n  - address: 10.0.7.1/24\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\n$patch: delete\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\nmtu: 9000\n";

/// Two v1alpha1 documents and a `LinkConfig`, for a config with no document
/// (the v1alpha1 document comes out first, as Talos writes it).
const ON_EMPTY: &str = "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: h\n---\nmachine:\n  network:\n    hostname: first\n  sysctls:\n    a: \"1\"\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\nmtu: 9000\n---\nmachine:\n  network:\n    hostname: second\n  sysctls:\n    $patch: delete\n";

/// What a case comes to against a peer, and Ichor's result.
fn outcome(
    peer: Peer,
    fixture: &str,
    base: &str,
    patch: &str,
) -> (Outcome, Result<String, String>) {
    let case = Case::new(fixture, base, patch);
    let dir = tempfile::tempdir().unwrap();
    let outcome = compare_with(peer, dir.path(), &case);
    (outcome, ichor_patches(&case.base, &case.patches))
}

/// The base a peer is given for a fixture (with the base extras).
fn base_of(peer: Peer, fixture: &str) -> String {
    with_base_extras(
        &fixture_configs_for(peer)
            .into_iter()
            .find(|(n, _)| n == fixture)
            .unwrap()
            .1,
    )
}

/// The document of a config with this kind and name.
fn document<'a>(docs: &'a [Mapping], kind: &str, name: &str) -> Option<&'a Mapping> {
    docs.iter().find(|d| {
        d.get("kind").and_then(Value::as_str) == Some(kind)
            && d.get("name").and_then(Value::as_str) == Some(name)
    })
}

fn addresses(doc: &Mapping) -> Vec<String> {
    doc.get("addresses")
        .and_then(Value::as_sequence)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.get("address").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Several documents for one config document: talosctl v1.13.9 refuses the
/// patch, and given the documents one at a time gives Ichor's result, which
/// is v1.14's: the documents merge in order.
/// Covers: R9.1a
#[test]
fn repeated_documents_apply_in_order() {
    let fixture = "stability-v1.14/base-worker.yaml";
    let (outcome, ours) = outcome(
        Peer::Talosctl,
        fixture,
        &base_of(Peer::Talosctl, fixture),
        REPEATED_LINK,
    );
    assert!(
        matches!(outcome, Outcome::Named(Named::RepeatedDocuments)),
        "{outcome:?}"
    );
    let docs = yaml_docs(&ours.unwrap());
    let eth2 = document(&docs, "LinkConfig", "eth2").unwrap();
    assert_eq!(eth2.get("mtu"), Some(&Value::from(9100)));
    assert_eq!(addresses(eth2), ["10.0.1.1/24", "10.0.5.1/24"]);
}

/// A document added, deleted and added again by one patch: the delete
/// takes effect between the two, so only the second one's fields are left.
/// talosctl v1.13.9 refuses the patch; one document at a time it agrees.
/// Covers: R9.1a
#[test]
fn a_delete_between_repeated_documents_applies_in_order() {
    let fixture = "stability-v1.12/base-controlplane.yaml";
    let (outcome, ours) = outcome(
        Peer::Talosctl,
        fixture,
        &base_of(Peer::Talosctl, fixture),
        DELETE_BETWEEN,
    );
    assert!(
        matches!(outcome, Outcome::Named(Named::RepeatedDocuments)),
        "{outcome:?}"
    );
    let docs = yaml_docs(&ours.unwrap());
    let eth3 = document(&docs, "LinkConfig", "eth3").unwrap();
    assert_eq!(eth3.get("mtu"), Some(&Value::from(9000)));
    assert!(addresses(eth3).is_empty(), "{eth3:?}");
}

/// A delete aimed at a document the patch appended: talosctl v1.13.9
/// crashes, v1.14 and Ichor delete it (one document at a time, talosctl
/// agrees).
/// Covers: R9.1a
#[test]
fn a_delete_of_a_document_the_patch_appended_removes_it() {
    let fixture = "stability-v1.12/base-worker.yaml";
    let patch = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\nmtu: 1500\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth3\n$patch: delete\n";
    let (outcome, ours) = outcome(
        Peer::Talosctl,
        fixture,
        &base_of(Peer::Talosctl, fixture),
        patch,
    );
    assert!(
        matches!(outcome, Outcome::Named(Named::DeleteOfAbsentDocument)),
        "{outcome:?}"
    );
    assert!(document(&yaml_docs(&ours.unwrap()), "LinkConfig", "eth3").is_none());
}

/// The deletes aimed at the v1alpha1 document apply before any v1alpha1
/// document merges, on both lines: a `sysctls` delete in a later document
/// does not undo an earlier document's sysctl. talosctl v1.13.9 takes this
/// patch (the second document only deletes) and agrees.
/// Covers: R9.1, R9.1a
#[test]
fn v1alpha1_deletes_apply_before_the_v1alpha1_documents_merge() {
    let fixture = "stability-v1.12/base-worker.yaml";
    let patch = "machine:\n  sysctls:\n    kernel.a: \"1\"\n---\nmachine:\n  sysctls:\n    $patch: delete\n";
    let (outcome, ours) = outcome(
        Peer::Talosctl,
        fixture,
        &base_of(Peer::Talosctl, fixture),
        patch,
    );
    assert!(matches!(outcome, Outcome::Agree), "{outcome:?}");
    let docs = yaml_docs(&ours.unwrap());
    let v1 = docs.iter().find(|d| is_v1alpha1_patch(d)).unwrap();
    assert_eq!(v1["machine"]["sysctls"], y("kernel.a: \"1\"\n"));
}

/// A patch on a config holding no document: talosctl's CLI reads no config
/// from an empty file; Ichor patches it as Talos's API does (checked
/// against the v1.14 machinery): the documents are appended, a later one
/// merging into an earlier one, and the deletes before them find nothing.
/// Covers: R9.1a
#[test]
fn a_patch_on_an_empty_config_appends_its_documents() {
    let (outcome, ours) = outcome(Peer::Talosctl, "an empty config", "", ON_EMPTY);
    assert!(
        matches!(outcome, Outcome::Named(Named::EmptyConfigFile)),
        "{outcome:?}"
    );
    let docs = yaml_docs(&ours.unwrap());
    assert_eq!(docs.len(), 3, "{docs:?}");
    assert_eq!(
        docs[0],
        y("machine:\n  network:\n    hostname: second\n  sysctls:\n    a: \"1\"\n")
            .as_mapping()
            .unwrap()
            .clone()
    );
    assert_eq!(
        document(&docs, "LinkConfig", "eth3").unwrap().get("mtu"),
        Some(&Value::from(9000))
    );
}

/// `extraArgs` values are replaced per key, list values included (both
/// Talos lines read list values since v1.13.6).
/// Covers: R9.1, R9.1a
#[test]
fn extra_args_list_values_replace_per_key() {
    let fixture = "stability-v1.12/base-worker.yaml";
    let patch = "machine:\n  kubelet:\n    extraArgs:\n      feature-gates: [C=true, D=false]\n      x: y\n";
    let (outcome, ours) = outcome(
        Peer::Talosctl,
        fixture,
        &base_of(Peer::Talosctl, fixture),
        patch,
    );
    assert!(matches!(outcome, Outcome::Agree), "{outcome:?}");
    let docs = yaml_docs(&ours.unwrap());
    let v1 = docs.iter().find(|d| is_v1alpha1_patch(d)).unwrap();
    assert_eq!(
        v1["machine"]["kubelet"]["extraArgs"],
        y("feature-gates: [C=true, D=false]\nv: \"2\"\nx: y\n")
    );
}

/// Two items for one interface, in a patch on a config whose
/// `machine.network` has no `interfaces`: talosctl folds them into one,
/// and so does Ichor (a finding of the mixed-patch corpus).
/// Covers: R9.1
#[test]
fn a_new_keyed_list_folds_its_items_as_talosctl_does() {
    let v1 = write_docs(&[
        yaml_docs(&base_of(Peer::Talosctl, "stability-v1.12/base-worker.yaml"))
            .into_iter()
            .find(is_v1alpha1_patch)
            .unwrap(),
    ]);
    let case = Case {
        fixture: "stability-v1.12/base-worker.yaml (v1alpha1 document alone, mixed patches)".into(),
        base: v1,
        patches: vec![
            "- op: add\n  path: /machine/network\n  value:\n    hostname: a\n".into(),
            "machine:\n  network:\n    interfaces:\n      - interface: eth1\n        vlans:\n          - vlanId: 11\n            mtu: 1351\n      - interface: eth1\n        vlans:\n          - vlanId: 12\n            mtu: 6352\n".into(),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let outcome = compare(dir.path(), &case);
    assert!(matches!(outcome, Outcome::Agree), "{outcome:?}");
}

/// The classification does not hide a wrong result: a case talosctl
/// refuses for its repeated documents, with Ichor's result changed, is a
/// disagreement, and so is a refusal talosctl gives for another reason.
#[test]
fn the_classification_sees_a_wrong_result() {
    let fixture = "stability-v1.14/base-worker.yaml";
    let case = Case::new(fixture, base_of(Peer::Talosctl, fixture), REPEATED_LINK);
    let dir = tempfile::tempdir().unwrap();
    let theirs = peer_patch(Peer::Talosctl, dir.path(), &case.base, &case.patches);
    let ours = ichor_patches(&case.base, &case.patches).unwrap();
    let wrong = ours.replace("mtu: 9100", "mtu: 1400");
    assert_ne!(wrong, ours);
    let classified = classify(Peer::Talosctl, dir.path(), &case, theirs.clone(), Ok(wrong));
    assert!(matches!(classified, Outcome::Disagree(_)), "{classified:?}");
    let classified = classify(
        Peer::Talosctl,
        dir.path(),
        &case,
        Err("some other refusal".into()),
        Ok(ours),
    );
    assert!(matches!(classified, Outcome::Disagree(_)), "{classified:?}");
}

/// A JSON 6902 `replace` of a missing key adds it, as Talos's JSON patch library does.
#[test]
fn json6902_replace_of_a_missing_key_adds_it() {
    let v1 = yaml_docs(&fixture_configs()[5].1)
        .into_iter()
        .find(|d| !d.contains_key("kind"))
        .unwrap();
    let case = Case::new(
        "stability-v1.14/base-worker.yaml (v1alpha1 document alone)",
        write_docs(&[v1]),
        "- op: replace\n  path: /cluster/clusterName\n  value: lab\n",
    );
    let dir = tempfile::tempdir().unwrap();
    if let Outcome::Disagree(d) = compare(dir.path(), &case) {
        panic!("{d}");
    }
    assert!(
        ichor_patches(&case.base, &case.patches)
            .unwrap()
            .contains("clusterName: lab")
    );
}

/// A patch whose only document holds nothing to merge is refused by both.
#[test]
fn a_patch_with_nothing_to_merge_is_refused() {
    assert_agrees("stability-v1.12/base-worker.yaml", "version: v1alpha1\n");
}

/// Deleting an item that is not there is refused by both.
#[test]
fn deleting_a_missing_list_item_is_refused() {
    assert_agrees(
        "stability-v1.12/base-controlplane.yaml",
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: NoSuchPlugin\n        $patch: delete\n",
    );
    assert!(
        ichor_patch(
            &with_base_extras(&fixture_configs()[0].1),
            "cluster:\n  apiServer:\n    admissionControl:\n      - name: NoSuchPlugin\n        $patch: delete\n",
        )
        .is_err()
    );
}

/// Deleting a document the config does not have: talosctl v1.13.9 crashes
/// (it keeps the delete as a document and cannot encode it); Ichor changes
/// nothing, which its CNI presets rely on, and so does Talos's v1.14.0-rc.1
/// machinery (ADR 0009, decision 3). When the tools cache's talosctl is
/// upgraded and stops crashing, this test says so: then compare with
/// `assert_agrees` instead.
#[test]
fn deleting_an_absent_document_changes_nothing_where_talosctl_crashes() {
    let base = with_base_extras(&fixture_configs()[0].1);
    let patch = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth9\n$patch: delete\n";
    let dir = tempfile::tempdir().unwrap();
    let theirs = talosctl_patch(dir.path(), &base, patch).unwrap_err();
    assert!(theirs.contains("panic"), "talosctl said: {theirs}");
    let ours = ichor_patch(&base, patch).unwrap();
    assert_eq!(
        as_talos_reads(&ours).unwrap(),
        as_talos_reads(&MachineConfig::parse(&base).unwrap().to_yaml().unwrap()).unwrap()
    );
}

/// A null-valued key, a null section and an empty document: Ichor's output
/// reads as talosctl's does (ADR 0009, decision 5), and Ichor keeps the
/// explicit null of a document it does not type.
#[test]
fn null_values_and_empty_documents_read_as_talos_reads_them() {
    let case = Case::new(
        "a config with nulls",
        "version: v1alpha1\nmachine:\n---\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\nhostname: null\n",
        "machine:\n  network:\n    hostname: x\n",
    );
    let dir = tempfile::tempdir().unwrap();
    if let Outcome::Disagree(d) = compare(dir.path(), &case) {
        panic!("{d}");
    }
    let ours = ichor_patches(&case.base, &case.patches).unwrap();
    assert!(ours.contains("hostname: null"), "{ours}");
    assert_eq!(yaml_docs(&ours).len(), 2, "{ours}");
}

/// A delete under a section the config does not have (a worker has no
/// `cluster.apiServer`) is refused by both.
#[test]
fn deleting_under_a_missing_section_is_refused() {
    assert_agrees(
        "stability-v1.12/base-worker.yaml",
        "cluster:\n  apiServer:\n    auditPolicy:\n      $patch: delete\n",
    );
    let base = with_base_extras(&fixture_configs()[1].1);
    let err = ichor_patch(
        &base,
        "cluster:\n  apiServer:\n    auditPolicy:\n      $patch: delete\n",
    )
    .unwrap_err();
    assert!(err.contains("the config has no cluster.apiServer"), "{err}");
}
