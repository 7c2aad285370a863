use super::*;
use crate::config::{CniName, Document, DocumentKind};
use crate::test_support::fixture;
use pretty_assertions::assert_eq;

fn smp(cfg: &MachineConfig, patch: &str) -> MachineConfig {
    ConfigPatch::parse(patch, "test patch")
        .unwrap()
        .apply(cfg, "test patch")
        .unwrap()
}

fn v12_cp() -> MachineConfig {
    MachineConfig::parse(&fixture("stability-v1.12/base-controlplane.yaml")).unwrap()
}

fn v14_cp() -> MachineConfig {
    MachineConfig::parse(&fixture("stability-v1.14/base-controlplane.yaml")).unwrap()
}

#[test]
fn strategic_merge_sets_nested_fields_and_keeps_the_rest() {
    let cfg = v12_cp();
    let out = smp(
        &cfg,
        "cluster:\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: true\n",
    );
    let f = out.facts();
    assert_eq!(f.cni, Some(CniName::None));
    assert_eq!(f.kube_proxy_enabled, Some(false));
    // untouched fields stay
    assert_eq!(f.pod_subnets, cfg.facts().pod_subnets);
    assert_eq!(out.documents.len(), cfg.documents.len());
    assert_eq!(
        out.v1alpha1().unwrap().machine.as_ref().unwrap().ca,
        cfg.v1alpha1().unwrap().machine.as_ref().unwrap().ca
    );
}

#[test]
fn pod_and_service_subnets_are_replaced_other_lists_appended() {
    let cfg = v12_cp();
    let out = smp(
        &cfg,
        "machine:\n  certSANs: [a.example]\ncluster:\n  network:\n    podSubnets: [10.1.0.0/16]\n    serviceSubnets: [10.2.0.0/16]\n",
    );
    let f = out.facts();
    assert_eq!(f.pod_subnets, vec!["10.1.0.0/16"]);
    assert_eq!(f.service_subnets, vec!["10.2.0.0/16"]);
    let sans = out
        .v1alpha1()
        .unwrap()
        .machine
        .as_ref()
        .unwrap()
        .cert_sans
        .clone()
        .unwrap();
    assert_eq!(sans.last().map(String::as_str), Some("a.example"));

    let v14 = smp(
        &v14_cp(),
        "apiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.9.0.0/16]\n",
    );
    assert_eq!(v14.facts().pod_subnets, vec!["10.9.0.0/16"]);
}

/// Covers: R1.6 (the cilium preset's `$patch: delete` of KubeFlannelCNIConfig)
#[test]
fn patch_delete_removes_a_document_and_is_a_no_op_when_absent() {
    let cfg = v14_cp();
    let del = "apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n";
    let out = smp(&cfg, del);
    assert!(!out.has(DocumentKind::KubeFlannelCni));
    assert_eq!(out.documents.len(), cfg.documents.len() - 1);
    assert_eq!(out.facts().cni, Some(CniName::None));
    let again = smp(&out, del);
    assert_eq!(again, out, "deleting an absent document changes nothing");
}

#[test]
fn patch_delete_removes_a_key() {
    let out = smp(
        &v12_cp(),
        "machine:\n  features:\n    kubePrism:\n      $patch: delete\n",
    );
    assert!(!out.facts().kube_prism.enabled);
    let features = out
        .v1alpha1()
        .unwrap()
        .machine
        .as_ref()
        .unwrap()
        .features
        .clone()
        .unwrap();
    assert!(features.kube_prism.is_none());
    assert_eq!(features.disk_quota_support, Some(true));
}

#[test]
fn named_documents_match_by_name_and_new_ones_are_appended() {
    let cfg = v14_cp();
    let out = smp(
        &cfg,
        "apiVersion: v1alpha1\nkind: KubeAuthorizerConfig\nname: rbac\ntype: Webhook\n---\napiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: 'kind: List'\n",
    );
    let types: Vec<_> = out
        .documents
        .iter()
        .filter(|d| d.kind_name() == "KubeAuthorizerConfig")
        .map(|d| {
            d.to_mapping()
                .unwrap()
                .get("type")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(types, vec!["Node", "Webhook"]);
    assert!(matches!(
        out.documents.last(),
        Some(Document::KubeInlineManifest(_))
    ));
    assert_eq!(out.facts().inline_manifests.len(), 1);
}

#[test]
fn interfaces_merge_by_name_and_vlans_by_id() {
    let base = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\n        vlans:\n          - vlanId: 10\n            mtu: 1500\n      - interface: eth1\n        dhcp: true\n",
    )
    .unwrap();
    let out = smp(
        &base,
        "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 9000\n        vlans:\n          - vlanId: 10\n            mtu: 9000\n          - vlanId: 20\n      - interface: eth1\n        $patch: delete\n",
    );
    let want = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\n        vlans:\n          - vlanId: 10\n            mtu: 9000\n          - vlanId: 20\n        mtu: 9000\n",
    )
    .unwrap();
    assert_eq!(out.to_yaml().unwrap(), want.to_yaml().unwrap());
}

#[test]
fn audit_policy_is_replaced_not_merged() {
    let out = smp(
        &v12_cp(),
        "cluster:\n  apiServer:\n    auditPolicy:\n      kind: Policy\n",
    );
    let m = out.to_mappings().unwrap();
    let ap = m[0]["cluster"]["apiServer"]["auditPolicy"].clone();
    assert_eq!(
        ap,
        serde_yaml_ng::from_str::<Value>("kind: Policy").unwrap()
    );
}

#[test]
fn json6902_on_a_single_document_config() {
    let cfg = v12_cp();
    let single = MachineConfig {
        documents: vec![cfg.documents[0].clone()],
    };
    let p = ConfigPatch::parse(
        "- op: add\n  path: /cluster/network/cni\n  value:\n    name: none\n- op: add\n  path: /machine/certSANs/-\n  value: x.example\n",
        "p.yaml",
    )
    .unwrap();
    assert!(matches!(p, ConfigPatch::Json6902(_)));
    let out = p.apply(&single, "p.yaml").unwrap();
    assert_eq!(out.facts().cni, Some(CniName::None));

    let json = ConfigPatch::parse(
        r#"[{"op":"remove","path":"/machine/features/kubePrism"}]"#,
        "p.json",
    )
    .unwrap();
    assert!(
        !json
            .apply(&single, "p.json")
            .unwrap()
            .facts()
            .kube_prism
            .enabled
    );
}

#[test]
fn json6902_errors_are_clear() {
    let p = ConfigPatch::parse("- op: remove\n  path: /nope\n", "p.yaml").unwrap();
    let err = p.apply(&v14_cp(), "p.yaml").unwrap_err();
    assert!(err.to_string().contains("strategic merge"), "{err}");
    let single = MachineConfig {
        documents: vec![v12_cp().documents[0].clone()],
    };
    let err = p.apply(&single, "p.yaml").unwrap_err();
    assert!(matches!(err, PatchError::Json6902Apply { .. }), "{err}");
    let err = ConfigPatch::parse("- just a string\n", "bad.yaml").unwrap_err();
    assert!(err.to_string().contains("JSON 6902"), "{err}");
}

#[test]
fn a_patch_producing_a_bad_type_is_refused() {
    let err = ConfigPatch::parse(
        "apiVersion: v1alpha1\nkind: KubePrismConfig\nport: seven\n",
        "p",
    )
    .unwrap()
    .apply(&v14_cp(), "p")
    .unwrap_err();
    assert!(matches!(err, PatchError::Result { .. }), "{err}");
}

#[test]
fn a_patch_document_without_kind_or_v1alpha1_keys_is_refused() {
    let err = ConfigPatch::parse("foo: bar\n", "p.yaml")
        .unwrap()
        .apply(&v14_cp(), "p.yaml")
        .unwrap_err();
    assert!(matches!(err, PatchError::UnknownDocument { .. }), "{err}");
    assert!(err.to_string().contains("p.yaml"), "{err}");
}

/// Covers: R9.1 — `$patch: delete` on an item of a keyed list, in both shapes.
#[test]
fn patch_delete_removes_list_items_by_their_first_key() {
    let out = smp(
        &v12_cp(),
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n",
    );
    let m = out.to_mappings().unwrap();
    assert_eq!(
        m[0]["cluster"]["apiServer"]["admissionControl"],
        Value::Sequence(vec![])
    );

    let base = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  type: worker\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.0.1/24\n  - address: 10.0.1.1/24\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - content: a\n    mountPath: /a\n  - content: b\n    mountPath: /b\n",
    )
    .unwrap();
    let out = smp(
        &base,
        "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.0.1/24\n    $patch: delete\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - $patch: delete\n    mountPath: /a\n  - mountPath: /b\n    content: b2\n",
    );
    let want = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  type: worker\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.1.1/24\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - content: b2\n    mountPath: /b\n",
    )
    .unwrap();
    assert_eq!(out.to_yaml().unwrap(), want.to_yaml().unwrap());
}

/// Talos applies a document's deletes before merging the rest of it.
#[test]
fn deletes_apply_before_the_merge_of_the_same_document() {
    let out = smp(
        &v12_cp(),
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n      - name: PodSecurity\n        configuration:\n          kind: Fresh\n",
    );
    let m = out.to_mappings().unwrap();
    let list = m[0]["cluster"]["apiServer"]["admissionControl"]
        .as_sequence()
        .unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(
        list[0]["configuration"],
        serde_yaml_ng::from_str::<Value>("kind: Fresh").unwrap()
    );
}

#[test]
fn deletes_talos_refuses_are_refused_naming_the_path() {
    for (patch, says) in [
        (
            "cluster:\n  apiServer:\n    admissionControl:\n      - name: Nope\n        $patch: delete\n",
            "cluster.apiServer.admissionControl",
        ),
        (
            "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu:\n          $patch: delete\n",
            "inner key of a list item",
        ),
        ("version: v1alpha1\n$patch: delete\n", "legacy document"),
        (
            "cluster:\n  apiServer:\n    admissionControl:\n      - $patch: delete\n",
            "no key to select",
        ),
    ] {
        let err = ConfigPatch::parse(patch, "p.yaml")
            .unwrap()
            .apply(&v12_cp(), "p.yaml")
            .unwrap_err();
        assert!(matches!(err, PatchError::Delete { .. }), "{patch}: {err}");
        let msg = ichor_api::error_text::chain(&err);
        assert!(msg.contains(says) && msg.contains("p.yaml"), "{msg}");
        assert!(err.help().is_some(), "{msg}");
    }
}

#[test]
fn extra_args_are_replaced_key_by_key() {
    let base = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  kubelet:\n    extraArgs:\n      a: x\n      gates: [A, B]\n",
    )
    .unwrap();
    let out = smp(
        &base,
        "machine:\n  kubelet:\n    extraArgs:\n      gates: [C]\n      b: y\n",
    );
    let m = out.to_mappings().unwrap();
    assert_eq!(
        m[0]["machine"]["kubelet"]["extraArgs"],
        serde_yaml_ng::from_str::<Value>("a: x\ngates: [C]\nb: y\n").unwrap()
    );
}

#[test]
fn admission_plugins_merge_by_name() {
    let out = smp(
        &v12_cp(),
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        configuration:\n          defaults:\n            enforce: restricted\n",
    );
    let m = out.to_mappings().unwrap();
    let list = m[0]["cluster"]["apiServer"]["admissionControl"]
        .as_sequence()
        .unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(
        list[0]["configuration"]["defaults"]["enforce"],
        Value::from("restricted")
    );
    assert_eq!(
        list[0]["configuration"]["defaults"]["audit"],
        Value::from("restricted")
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A patch without lists is idempotent, and what it sets is what facts() reads.
        #[test]
        fn map_only_patches_are_idempotent(port in 1u32..65536, hostname in "[a-z][a-z0-9-]{0,12}", legacy in any::<bool>()) {
            let cfg = if legacy { v12_cp() } else { v14_cp() };
            let patch = format!(
                "machine:\n  network:\n    hostname: {hostname}\n---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: {port}\n"
            );
            let once = smp(&cfg, &patch);
            let twice = smp(&once, &patch);
            prop_assert_eq!(&once, &twice);
            prop_assert_eq!(once.facts().kube_prism.port, Some(port));
            let del = "apiVersion: v1alpha1\nkind: KubePrismConfig\n$patch: delete\n";
            let d1 = smp(&once, del);
            prop_assert_eq!(&smp(&d1, del), &d1);
        }
    }
}

fn reapplied(cfg: &MachineConfig, patch: &str) -> MachineConfig {
    ConfigPatch::parse(patch, "test patch")
        .unwrap()
        .reapply(cfg, "test patch")
        .unwrap()
}

fn v1alpha1_only(cfg: &MachineConfig) -> MachineConfig {
    let docs = cfg.to_mappings().unwrap();
    MachineConfig::from_mappings(
        docs.into_iter()
            .filter(|d| d.get("kind").is_none())
            .collect(),
        "test",
    )
    .unwrap()
}

/// `apply` appends again as Talos does; `reapply` gives the same result the
/// first time and changes nothing the second (ADR 0016).
/// Covers: R9.1
#[test]
fn reapply_appends_once_where_apply_appends_again() {
    let cfg = v12_cp();
    let patch = "machine:\n  certSANs:\n    - a.example.com\n    - a.example.com\n  time:\n    servers:\n      - pool.ntp.org\n";
    let once = smp(&cfg, patch);
    assert_eq!(reapplied(&cfg, patch), once);
    assert_eq!(reapplied(&once, patch), once);
    let again = smp(&once, patch);
    assert_ne!(again, once, "Talos's merge appends again");
    let sans = |c: &MachineConfig| {
        c.to_mappings().unwrap()[0]["machine"]["certSANs"]
            .as_sequence()
            .unwrap()
            .len()
    };
    assert_eq!(sans(&once), 2, "a patch's own duplicates are kept");
    assert_eq!(sans(&again), 4);
}

/// JSON 6902 adds into a list are skipped when the list holds the value;
/// a `remove` of a path already gone changes nothing when reapplied.
/// Covers: R9.1
#[test]
fn reapply_skips_json6902_adds_and_removes_already_done() {
    let cfg = v1alpha1_only(&v12_cp());
    let patch = r#"[{"op":"add","path":"/machine/certSANs/-","value":"a"},{"op":"add","path":"/machine/certSANs/0","value":"b"},{"op":"remove","path":"/machine/kubelet/image"}]"#;
    let once = reapplied(&cfg, patch);
    assert_eq!(once, smp(&cfg, patch));
    assert_eq!(reapplied(&once, patch), once);
    let err = ConfigPatch::parse(patch, "test patch")
        .unwrap()
        .apply(&once, "test patch");
    assert!(err.is_err(), "Talos refuses the remove of a missing path");
}

/// A delete of a list item that is gone is refused by `apply` as Talos
/// refuses it, and changes nothing when reapplied.
/// Covers: R9.1
#[test]
fn reapply_of_a_delete_already_done_changes_nothing() {
    let cfg = v12_cp();
    let add = "machine:\n  kubelet:\n    extraMounts:\n      - destination: /x\n        type: bind\n        source: /x\n";
    let delete =
        "machine:\n  kubelet:\n    extraMounts:\n      - destination: /x\n        $patch: delete\n";
    let with = smp(&cfg, add);
    let once = reapplied(&with, delete);
    assert_eq!(once, smp(&with, delete));
    assert_eq!(reapplied(&once, delete), once);
    assert!(
        ConfigPatch::parse(delete, "test patch")
            .unwrap()
            .apply(&once, "test patch")
            .is_err()
    );
}

// ------------- the v1.14 patch rules (ADR 0009, "Talos lines")

/// The documents of a config as YAML mappings.
fn mappings(cfg: &MachineConfig) -> Vec<Mapping> {
    cfg.to_mappings().unwrap()
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// The document with this kind (and name, when given).
fn doc_of(cfg: &MachineConfig, kind: &str, name: Option<&str>) -> Option<Mapping> {
    mappings(cfg).into_iter().find(|d| {
        d.get("kind").and_then(Value::as_str) == Some(kind)
            && d.get("name").and_then(Value::as_str) == name
    })
}

/// Several documents for one config document are read and merged in their
/// order, each into what the one before left, as Talos v1.14 does (v1.13
/// refused such a patch): a later scalar wins, lists grow in order.
/// Covers: R9.1a
#[test]
fn repeated_documents_merge_in_their_order() {
    let patch = "apiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7001\n---\nmachine:\n  certSANs: [a.example]\n---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7002\n---\nmachine:\n  certSANs: [b.example]\n  network:\n    hostname: node-b\n";
    let parsed = ConfigPatch::parse(patch, "p.yaml").unwrap();
    assert!(matches!(&parsed, ConfigPatch::StrategicMerge(d) if d.len() == 4));
    let cfg = v14_cp();
    let before = mappings(&cfg)[0]["machine"]["certSANs"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let out = parsed.apply(&cfg, "p.yaml").unwrap();
    assert_eq!(out.facts().kube_prism.port, Some(7002));
    let v1 = &mappings(&out)[0];
    let mut want = before;
    want.extend([Value::from("a.example"), Value::from("b.example")]);
    assert_eq!(v1["machine"]["certSANs"], Value::Sequence(want));
    assert_eq!(v1["machine"]["network"]["hostname"], Value::from("node-b"));
    assert_eq!(
        out.documents.len(),
        cfg.documents.len(),
        "merged, not appended"
    );
}

/// A document the patch appends is the one its later documents merge into
/// and delete from: added, deleted, added again leaves the last one alone;
/// a key deleted between two documents is set again by the second.
/// Covers: R9.1a
#[test]
fn a_delete_between_repeated_documents_applies_in_its_place() {
    let cfg = v12_cp();
    let head = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth7\n";
    let out = smp(
        &cfg,
        &format!(
            "{head}mtu: 1500\naddresses:\n  - address: 10.0.7.1/24\n---\n{head}$patch: delete\n---\n{head}mtu: 9000\n"
        ),
    );
    assert_eq!(
        doc_of(&out, "LinkConfig", Some("eth7")).unwrap(),
        yaml(&format!("{head}mtu: 9000\n"))
            .as_mapping()
            .unwrap()
            .clone()
    );
    assert_eq!(out.documents.len(), cfg.documents.len() + 1);

    let out = smp(
        &cfg,
        &format!(
            "{head}mtu: 1500\naddresses:\n  - address: 10.0.7.1/24\n  - address: 10.0.8.1/24\n---\n{head}addresses:\n  - address: 10.0.7.1/24\n    $patch: delete\n---\n{head}mtu:\n  $patch: delete\n---\n{head}addresses:\n  - address: 10.0.9.1/24\n"
        ),
    );
    assert_eq!(
        doc_of(&out, "LinkConfig", Some("eth7")).unwrap(),
        yaml(&format!(
            "{head}addresses:\n  - address: 10.0.8.1/24\n  - address: 10.0.9.1/24\n"
        ))
        .as_mapping()
        .unwrap()
        .clone()
    );

    // a delete aimed at a document the patch appended and then deleted finds nothing
    let out = smp(
        &cfg,
        &format!("{head}mtu: 1500\n---\n{head}$patch: delete\n---\n{head}$patch: delete\n"),
    );
    assert_eq!(out, cfg);
}

/// The deletes aimed at the v1alpha1 document, from all the patch's
/// documents, apply before any of them merges (Talos's order on both
/// lines): a later document's delete does not undo an earlier one's
/// values, and a delete of a key only a patch document sets is refused.
/// Covers: R9.1, R9.1a
#[test]
fn v1alpha1_deletes_apply_before_any_v1alpha1_document_merges() {
    let base = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  type: worker\n  sysctls:\n    b: \"2\"\n",
    )
    .unwrap();
    let out = smp(
        &base,
        "machine:\n  sysctls:\n    a: \"1\"\n---\nmachine:\n  sysctls:\n    $patch: delete\n",
    );
    assert_eq!(mappings(&out)[0]["machine"]["sysctls"], yaml("a: \"1\"\n"));

    let err = ConfigPatch::parse(
        "machine:\n  network:\n    interfaces:\n      - interface: eth9\n        mtu: 1500\n---\nmachine:\n  network:\n    interfaces:\n      - interface: eth9\n        $patch: delete\n",
        "p.yaml",
    )
    .unwrap()
    .apply(&base, "p.yaml")
    .unwrap_err();
    assert!(matches!(err, PatchError::Delete { .. }), "{err}");
    let said = ichor_api::error_text::chain(&err);
    assert!(said.contains("machine.network"), "{said}");
}

/// A patch on a config holding no document appends its documents (a later
/// one merging into an earlier one), and its deletes find nothing, as
/// Talos's API does on both lines (talosctl's CLI reads no config from an
/// empty file). A JSON 6902 patch is refused: it needs exactly one document.
/// Covers: R9.1a
#[test]
fn a_patch_on_an_empty_config_appends_its_documents() {
    let empty = MachineConfig::parse("").unwrap();
    assert!(empty.documents.is_empty());
    // the v1alpha1 document comes first, as in every config Talos writes
    let out = smp(
        &empty,
        "apiVersion: v1alpha1\nkind: KubePrismConfig\n$patch: delete\n---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7445\n---\nmachine:\n  network:\n    hostname: a\n---\nmachine:\n  sysctls:\n    $patch: delete\n  network:\n    hostname: b\n",
    );
    assert_eq!(
        mappings(&out),
        vec![
            yaml("machine:\n  network:\n    hostname: b\n")
                .as_mapping()
                .unwrap()
                .clone(),
            yaml("apiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7445\n")
                .as_mapping()
                .unwrap()
                .clone(),
        ]
    );
    let err = ConfigPatch::parse("- op: add\n  path: /machine\n  value: {}\n", "j.yaml")
        .unwrap()
        .apply(&empty, "j.yaml")
        .unwrap_err();
    assert!(
        matches!(err, PatchError::Json6902Multidoc { documents: 0, .. }),
        "{err}"
    );
}

/// `extraArgs` list values, in the v1alpha1 document and in the v1.14
/// `Kube*` documents, are replaced per key (a list by a string and the
/// other way round), across several documents for one config document.
/// Covers: R9.1a
#[test]
fn extra_args_list_values_are_replaced_per_key() {
    let cfg = v14_cp();
    let out = smp(
        &cfg,
        "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  service-account-issuer:\n    - https://old.example:6443\n    - https://new.example:6443\n  audit-log-maxage: \"30\"\n---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  service-account-issuer: https://new.example:6443\n  audit-log-maxage: [\"30\", \"31\"]\n---\nmachine:\n  kubelet:\n    extraArgs:\n      feature-gates: [A=true]\n---\nmachine:\n  kubelet:\n    extraArgs:\n      feature-gates: [B=true]\n",
    );
    let api = doc_of(&out, "KubeAPIServerConfig", None).unwrap();
    let args = api["extraArgs"].as_mapping().unwrap();
    assert_eq!(
        args["service-account-issuer"],
        Value::from("https://new.example:6443")
    );
    assert_eq!(args["audit-log-maxage"], yaml("[\"30\", \"31\"]"));
    let before = doc_of(&cfg, "KubeAPIServerConfig", None).unwrap();
    for (k, v) in before
        .get("extraArgs")
        .and_then(Value::as_mapping)
        .into_iter()
        .flatten()
    {
        if !matches!(
            k.as_str(),
            Some("service-account-issuer" | "audit-log-maxage")
        ) {
            assert_eq!(args.get(k), Some(v), "{k:?} is kept");
        }
    }
    assert_eq!(
        mappings(&out)[0]["machine"]["kubelet"]["extraArgs"]["feature-gates"],
        yaml("[B=true]")
    );
}

/// Reapplied, a patch whose documents append to one list counts the items
/// across all of them: on a config without them it gives `apply`'s result
/// (two documents appending one item keep two copies), and on its own
/// result it changes nothing, a list created by an earlier document and a
/// delete between the documents included (ADR 0016).
/// Covers: R9.1a
#[test]
fn reapply_of_repeated_documents_appends_once() {
    let cfg = v12_cp();
    for patch in [
        "machine:\n  certSANs: [x.example]\n---\nmachine:\n  certSANs: [x.example]\n",
        "machine:\n  time:\n    servers: [ntp.example]\n---\nmachine:\n  time:\n    servers: [ntp.example, ntp2.example]\n",
        "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth7\naddresses:\n  - address: 10.0.7.1/24\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth7\n$patch: delete\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth7\naddresses:\n  - address: 10.0.7.1/24\n  - address: 10.0.8.1/24\n",
        "machine:\n  network:\n    interfaces:\n      - interface: eth5\n        addresses: [10.5.0.1/24]\n---\nmachine:\n  network:\n    interfaces:\n      - interface: eth5\n        addresses: [10.5.0.1/24]\n",
    ] {
        let once = smp(&cfg, patch);
        assert_eq!(reapplied(&cfg, patch), once, "{patch}");
        assert_eq!(reapplied(&once, patch), once, "{patch}");
        if !patch.contains("$patch") {
            assert_ne!(
                smp(&once, patch),
                once,
                "Talos's merge appends again: {patch}"
            );
        }
    }
}

/// Reapplied, a patch that deletes a list item one of its own documents
/// appended and appends it again keeps the items, but may move the
/// re-appended one to the end once: the second reapply changes nothing
/// more (ADR 0009, "Talos lines").
/// Covers: R9.1a
#[test]
fn reapply_settles_when_a_patch_deletes_its_own_item() {
    let cfg = v12_cp();
    let head = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth7\n";
    let patch = format!(
        "{head}addresses:\n  - address: 10.0.7.1/24\n---\n{head}addresses:\n  - address: 10.0.7.1/24\n    $patch: delete\n---\n{head}addresses:\n  - address: 10.0.7.1/24\n  - address: 10.0.8.1/24\n"
    );
    let once = smp(&cfg, &patch);
    assert_eq!(reapplied(&cfg, &patch), once);
    let again = reapplied(&once, &patch);
    assert_eq!(reapplied(&again, &patch), again, "settled");
    let addresses = |c: &MachineConfig| {
        let mut a: Vec<String> = doc_of(c, "LinkConfig", Some("eth7")).unwrap()["addresses"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|i| i["address"].as_str().unwrap().to_string())
            .collect();
        a.sort();
        a
    };
    assert_eq!(addresses(&again), addresses(&once));
}

/// A keyed list the config's section does not have yet: Talos merges the
/// patch's items into it one by one, so two items for one interface fold
/// into one; a section the config lacks is taken whole, as Talos takes it
/// (a differential-test finding).
/// Covers: R9.1
#[test]
fn a_new_keyed_list_folds_its_items_in_a_section_the_config_has() {
    let patch = "machine:\n  network:\n    interfaces:\n      - interface: eth1\n        mtu: 1400\n      - interface: eth1\n        dhcp: true\n";
    let with_section = MachineConfig::parse(
        "version: v1alpha1\nmachine:\n  type: worker\n  network:\n    hostname: a\n",
    )
    .unwrap();
    assert_eq!(
        mappings(&smp(&with_section, patch))[0]["machine"]["network"]["interfaces"],
        yaml("- interface: eth1\n  mtu: 1400\n  dhcp: true\n")
    );
    let without = MachineConfig::parse("version: v1alpha1\nmachine:\n  type: worker\n").unwrap();
    assert_eq!(
        mappings(&smp(&without, patch))[0]["machine"]["network"]["interfaces"]
            .as_sequence()
            .unwrap()
            .len(),
        2
    );
}
