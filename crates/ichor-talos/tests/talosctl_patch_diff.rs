//! Config patches applied by Ichor and by the real `talosctl machineconfig
//! patch` (tools cache, `tools/testbin.sh`) on the fixtures in `testdata/talos`, in both
//! shapes, with generated strategic-merge and JSON 6902 patches: the results
//! must be equal as Talos reads them.
//!
//! Each case writes a base config and a patch file, runs talosctl once and
//! Ichor once, and compares the two outputs after dropping the zero values
//! Talos's encoder writes for unset fields (`certSANs: []`, `key: ""`,
//! `{}`), both as YAML trees and as Ichor's typed config. When talosctl
//! refuses a patch, Ichor must refuse it too.
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
//! Covers: R9.1, and the null values and empty documents of ADR 0009.

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

fn link_doc() -> impl Strategy<Value = String> {
    let head = |n: u8| format!("apiVersion: v1alpha1\nkind: LinkConfig\nname: eth{n}\n");
    prop_oneof![
        (1u8..4, mtu(), 0u8..250).prop_map(move |(n, m, a)| format!(
            "{}mtu: {m}\naddresses:\n  - address: 10.9.{a}.1/24\n",
            head(n)
        )),
        (0u8..2).prop_map(move |a| format!(
            "{}addresses:\n  - address: 10.0.{a}.1/24\n    $patch: delete\n",
            head(2)
        )),
        Just(format!("{}$patch: delete\n", head(2))),
    ]
}

fn extension_doc() -> impl Strategy<Value = String> {
    let head = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\n";
    prop_oneof![
        (name(), any::<bool>()).prop_map(move |(c, same)| {
            let path = if same { "upsmon.conf" } else { "extra.conf" };
            format!(
                "{head}configFiles:\n  - content: {c}\n    mountPath: /usr/local/etc/nut/{path}\nenvironment:\n  - X={c}\n"
            )
        }),
        Just(format!(
            "{head}configFiles:\n  - mountPath: /usr/local/etc/nut/nut.conf\n    $patch: delete\n"
        )),
        Just(format!("{head}$patch: delete\n")),
    ]
}

fn hostname_doc() -> impl Strategy<Value = String> {
    prop_oneof![
        name().prop_map(|n| format!("apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: {n}\n")),
        Just("apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n".to_string()),
    ]
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
/// to two `Kube*` documents (of different kinds or names: Talos refuses two
/// patches of one document).
fn machinery_strategic_patch() -> impl Strategy<Value = String> {
    (
        prop::option::of(strategic_patch()),
        prop::collection::vec(kube_doc(), 0..3),
    )
        .prop_filter_map("an empty patch", |(base, kube)| {
            let mut seen = std::collections::HashSet::new();
            let mut docs: Vec<String> = base.into_iter().collect();
            for doc in kube {
                let m = y(&doc);
                let id = (
                    m.get("kind").and_then(Value::as_str).map(str::to_string),
                    m.get("name").and_then(Value::as_str).map(str::to_string),
                );
                if seen.insert(id) {
                    docs.push(doc);
                }
            }
            (!docs.is_empty()).then(|| docs.join("---\n"))
        })
}

/// A strategic merge patch: an optional v1alpha1 document built from
/// pieces (merged per section) and optional multi-document patches.
fn strategic_patch() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(v1alpha1_piece(), 0..4),
        prop::option::of(link_doc()),
        prop::option::of(extension_doc()),
        prop::option::of(hostname_doc()),
    )
        .prop_filter_map("an empty patch", |(pieces, link, ext, host)| {
            let mut docs = Vec::new();
            if !pieces.is_empty() {
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
                docs.push(serde_yaml_ng::to_string(&v1).unwrap());
            }
            docs.extend(link);
            docs.extend(ext);
            docs.extend(host);
            (!docs.is_empty()).then(|| docs.join("---\n"))
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
    let typed = MachineConfig::from_mappings(mappings, "output").map_err(|e| e.to_string())?;
    Ok((trees, typed))
}

struct Case {
    fixture: String,
    base: String,
    patch: String,
}

enum Outcome {
    /// Both applied the patch, with equal results.
    Agree,
    /// Both refused the patch.
    BothRefuse,
    Disagree(String),
}

fn talosctl_patch(dir: &Path, base: &str, patch: &str) -> Result<String, String> {
    peer_patch(Peer::Talosctl, dir, base, patch)
}

fn peer_patch(peer: Peer, dir: &Path, base: &str, patch: &str) -> Result<String, String> {
    let (b, p, o) = (
        dir.join("base.yaml"),
        dir.join("patch.yaml"),
        dir.join("out.yaml"),
    );
    std::fs::write(&b, base).unwrap();
    std::fs::write(&p, patch).unwrap();
    let _ = std::fs::remove_file(&o);
    let out = peer
        .patch_command()
        .arg(&b)
        .arg("--patch")
        .arg(format!("@{}", p.display()))
        .arg("-o")
        .arg(&o)
        .output()
        .expect("the peer runs");
    if out.status.success() {
        Ok(std::fs::read_to_string(&o).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn ichor_patch(base: &str, patch: &str) -> Result<String, String> {
    let cfg = MachineConfig::parse(base).map_err(|e| e.to_string())?;
    let p = ConfigPatch::parse(patch, "patch.yaml").map_err(|e| e.to_string())?;
    let out = p.apply(&cfg, "patch.yaml").map_err(|e| e.to_string())?;
    out.to_yaml().map_err(|e| e.to_string())
}

fn compare(dir: &Path, case: &Case) -> Outcome {
    compare_with(Peer::Talosctl, dir, case)
}

fn compare_with(peer: Peer, dir: &Path, case: &Case) -> Outcome {
    let theirs = peer_patch(peer, dir, &case.base, &case.patch);
    let ours = ichor_patch(&case.base, &case.patch);
    judge(peer, case, theirs, ours)
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
            case.fixture, case.patch
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

/// Runs the cases, two peer processes at a time; returns the
/// disagreements and how many cases both tools refused.
fn run_cases(peer: Peer, cases: &[Case]) -> (Vec<String>, usize) {
    let next = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let found = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let dir = tempfile::tempdir().unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(case) = cases.get(i) else { break };
                    match compare_with(peer, dir.path(), case) {
                        Outcome::Disagree(d) => {
                            found.lock().unwrap().push(format!("case {i}: {d}"))
                        }
                        Outcome::BothRefuse => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Outcome::Agree => {}
                    }
                }
            });
        }
    });
    (found.into_inner().unwrap(), refused.into_inner())
}

fn env_number(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The generated corpus: strategic merge patches on every fixture (both
/// shapes, with the base extras), and JSON 6902 patches on the v1alpha1
/// document alone (Talos applies JSON patches to single-document configs).
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
    (0..count)
        .map(|i| {
            let (fixture, text) = &fixtures[i % fixtures.len()];
            if i % 5 == 4 {
                let v1 = yaml_docs(text)
                    .into_iter()
                    .find(|d| !d.contains_key("kind"))
                    .unwrap();
                Case {
                    fixture: format!("{fixture} (v1alpha1 document alone)"),
                    base: write_docs(&[v1]),
                    patch: json.new_tree(&mut runner).unwrap().current(),
                }
            } else {
                Case {
                    fixture: fixture.clone(),
                    base: with_base_extras(text),
                    patch: strategic.new_tree(&mut runner).unwrap().current(),
                }
            }
        })
        .collect()
}

/// Covers: R9.1 — the fixed-seed corpus (300 cases unless
/// `ICHOR_DIFF_CASES` says otherwise) agrees with talosctl on every case.
#[test]
fn generated_patches_agree_with_talosctl() {
    let count = env_number("ICHOR_DIFF_CASES", 300) as usize;
    let seed = env_number("ICHOR_DIFF_SEED", 17);
    let cases = corpus(Peer::Talosctl, count, seed);
    let (found, refused) = run_cases(Peer::Talosctl, &cases);
    eprintln!(
        "{} differential cases (seed {seed}): {} applied by both, {refused} refused by both, {} disagreements",
        cases.len(),
        cases.len() - refused - found.len(),
        found.len()
    );
    // the corpus must mostly exercise merges, not refusals
    assert!(
        refused * 3 < cases.len(),
        "{refused} of {} cases were refused by both tools; the generator no longer exercises merges",
        cases.len()
    );
    assert!(
        found.is_empty(),
        "{} of {} cases disagree with talosctl:\n\n{}",
        found.len(),
        cases.len(),
        found.join("\n\n")
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
    let case = Case {
        fixture: "stability-v1.12/base-controlplane.yaml".into(),
        base,
        patch: "cluster:\n  network:\n    podSubnets:\n      - 10.7.0.0/16\n".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let theirs = peer_patch(Peer::Talosctl, dir.path(), &case.base, &case.patch);
    let ours = ichor_patch(&case.base, &case.patch);
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

    /// Covers: R9.1 (v1.14 shape whole) — the fixed-seed corpus on
    /// the v1.14 fixtures with all their document kinds, and patches of the
    /// `Kube*` documents, agrees with Talos's v1.14 machinery on every case
    /// (300 unless `ICHOR_DIFF_MACHINERY_CASES` says otherwise).
    #[test]
    fn generated_patches_agree_with_talos_v1_14_machinery() {
        let count = env_number("ICHOR_DIFF_MACHINERY_CASES", 300) as usize;
        let seed = env_number("ICHOR_DIFF_SEED", 17);
        let cases = corpus(Peer::Machinery, count, seed);
        let kube = cases
            .iter()
            .filter(|c| c.patch.contains("kind: Kube"))
            .count();
        let (found, refused) = run_cases(Peer::Machinery, &cases);
        eprintln!(
            "{} differential cases against the v1.14 machinery (seed {seed}, {kube} with Kube* documents): {} applied by both, {refused} refused by both, {} disagreements",
            cases.len(),
            cases.len() - refused - found.len(),
            found.len()
        );
        assert!(
            kube * 3 > cases.len(),
            "only {kube} of {} cases patch a Kube* document",
            cases.len()
        );
        assert!(
            refused * 3 < cases.len(),
            "{refused} of {} cases were refused by both tools; the generator no longer exercises merges",
            cases.len()
        );
        assert!(
            found.is_empty(),
            "{} of {} cases disagree with Talos's v1.14 machinery:\n\n{}",
            found.len(),
            cases.len(),
            found.join("\n\n")
        );
    }

    fn assert_agrees_with_machinery(fixture: &str, patch: &str) {
        assert_agrees_with(Peer::Machinery, fixture, patch);
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
    let case = Case {
        fixture: fixture.to_string(),
        base: with_base_extras(&text),
        patch: patch.to_string(),
    };
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

/// Two patch documents for the same config document are refused by both.
#[test]
fn duplicate_patch_documents_are_refused() {
    assert_agrees(
        "stability-v1.12/base-worker.yaml",
        "machine:\n  network:\n    hostname: a\n---\nmachine:\n  network:\n    hostname: b\n",
    );
}

/// A JSON 6902 `replace` of a missing key adds it, as Talos's JSON patch library does.
#[test]
fn json6902_replace_of_a_missing_key_adds_it() {
    let v1 = yaml_docs(&fixture_configs()[5].1)
        .into_iter()
        .find(|d| !d.contains_key("kind"))
        .unwrap();
    let case = Case {
        fixture: "stability-v1.14/base-worker.yaml (v1alpha1 document alone)".into(),
        base: write_docs(&[v1]),
        patch: "- op: replace\n  path: /cluster/clusterName\n  value: lab\n".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    if let Outcome::Disagree(d) = compare(dir.path(), &case) {
        panic!("{d}");
    }
    assert!(
        ichor_patch(&case.base, &case.patch)
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
    let case = Case {
        fixture: "a config with nulls".into(),
        base: "version: v1alpha1\nmachine:\n---\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\nhostname: null\n".into(),
        patch: "machine:\n  network:\n    hostname: x\n".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    if let Outcome::Disagree(d) = compare(dir.path(), &case) {
        panic!("{d}");
    }
    let ours = ichor_patch(&case.base, &case.patch).unwrap();
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
