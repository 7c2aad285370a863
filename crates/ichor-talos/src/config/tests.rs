use super::*;
use crate::test_support::{all_yaml_fixtures, fixture};
use pretty_assertions::assert_eq;

/// Every non-empty document of a YAML text, as values.
fn raw_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid yaml"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Machine-config fixtures only (not the secrets bundle).
fn config_fixtures() -> Vec<String> {
    all_yaml_fixtures()
        .into_iter()
        .filter(|f| f != "stability-secrets.yaml")
        .collect()
}

/// Covers: R1.3d (configs are read without loss).
#[test]
fn every_fixture_round_trips_semantically_and_byte_stably() {
    let files = config_fixtures();
    assert!(
        files.len() >= 30,
        "expected the shared fixtures, found {files:?}"
    );
    for f in files {
        let text = fixture(&f);
        let cfg = MachineConfig::parse_with_origin(&text, &f).unwrap();
        let out = cfg.to_yaml().unwrap();
        assert_eq!(
            raw_docs(&text),
            raw_docs(&out),
            "semantic round trip of {f}"
        );
        let again = MachineConfig::parse(&out).unwrap();
        assert_eq!(cfg, again, "typed round trip of {f}");
        assert_eq!(
            out,
            again.to_yaml().unwrap(),
            "byte-stable second round trip of {f}"
        );
    }
}

#[test]
fn known_kinds_are_typed_and_unknown_kinds_kept() {
    let cfg = MachineConfig::parse(&fixture("stability-v1.14/base-controlplane.yaml")).unwrap();
    assert!(matches!(cfg.documents[0], Document::V1Alpha1(_)));
    for kind in [
        DocumentKind::KubePrism,
        DocumentKind::KubeNetwork,
        DocumentKind::KubeFlannelCni,
        DocumentKind::KubeProxy,
        DocumentKind::KubeApiServerCa,
        DocumentKind::KubeAggregatorCa,
        DocumentKind::KubeServiceAccount,
        DocumentKind::KubeEtcdEncryption,
        DocumentKind::DiscoveryIdentity,
        DocumentKind::KubeCluster,
        DocumentKind::Kubelet,
        DocumentKind::KubeNode,
        DocumentKind::KubeAuthorizer,
        DocumentKind::KubeApiServer,
        DocumentKind::KubeControllerManager,
        DocumentKind::KubeScheduler,
        DocumentKind::KubeCoreDns,
        DocumentKind::DiscoveryService,
        DocumentKind::Resolver,
        DocumentKind::Hostname,
    ] {
        assert!(cfg.has(kind), "{kind:?} is typed");
    }
    let others: Vec<_> = cfg
        .documents_of(DocumentKind::Other)
        .map(|d| d.kind_name().to_string())
        .collect();
    assert!(others.contains(&"VolumeConfig".to_string()), "{others:?}");
    let two_authorizers = cfg
        .documents
        .iter()
        .filter(|d| d.kind_name() == "KubeAuthorizerConfig")
        .count();
    assert_eq!(two_authorizers, 2);
}

#[test]
fn single_k8s_documents_parse_into_their_types() {
    let prism = MachineConfig::parse(&fixture("k8s-documents/kubeprismconfig.yaml")).unwrap();
    let Document::KubePrism(p) = &prism.documents[0] else {
        panic!("not typed")
    };
    assert_eq!(p.port, Some(7445));

    let proxy = MachineConfig::parse(&fixture("k8s-documents/proxyconfig.yaml")).unwrap();
    let Document::KubeProxy(p) = &proxy.documents[0] else {
        panic!("not typed")
    };
    assert_eq!(p.enabled, Some(true));
    assert_eq!(p.mode.as_deref(), Some("nftables"));
    assert!(p.extra.contains_key("resources"));

    let enc =
        MachineConfig::parse(&fixture("k8s-documents/etcdencryptionconfig_redacted.yaml")).unwrap();
    let Document::KubeEtcdEncryption(e) = &enc.documents[0] else {
        panic!("not typed")
    };
    assert_eq!(e.provider_secret("aescbc").as_deref(), Some("REDACTED"));
    assert_eq!(e.provider_secret("secretbox").as_deref(), Some("REDACTED"));
}

#[test]
fn serialisation_puts_api_version_and_kind_first() {
    let cfg = MachineConfig {
        documents: vec![Document::KubePrism(KubePrismConfig::new(7445))],
    };
    assert_eq!(
        cfg.to_yaml().unwrap(),
        "apiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7445\n"
    );
}

/// Covers: R1.3b, R1.3d
#[test]
fn facts_from_v1_12_base_controlplane() {
    let f = MachineConfig::parse(&fixture("stability-v1.12/base-controlplane.yaml"))
        .unwrap()
        .facts();
    assert_eq!(f.shape, ConfigShape::Legacy);
    assert_eq!(f.machine_type, MachineType::ControlPlane);
    assert_eq!(f.cni, Some(CniName::Flannel));
    assert_eq!(f.pod_subnets, vec!["10.244.0.0/16"]);
    assert_eq!(f.service_subnets, vec!["10.96.0.0/12"]);
    assert_eq!(f.kube_proxy_enabled, Some(true));
    assert_eq!(
        f.kube_prism,
        KubePrismFact {
            enabled: true,
            port: Some(7445)
        }
    );
    assert_eq!(f.kubernetes_version.as_deref(), Some("v1.28.0"));
    assert_eq!(f.cluster_name.as_deref(), Some("base"));
}

/// Covers: R1.3b, R1.3d
#[test]
fn facts_from_v1_14_base_controlplane() {
    let f = MachineConfig::parse(&fixture("stability-v1.14/base-controlplane.yaml"))
        .unwrap()
        .facts();
    assert_eq!(f.shape, ConfigShape::Multidoc);
    assert_eq!(f.machine_type, MachineType::ControlPlane);
    assert_eq!(f.cni, Some(CniName::Flannel));
    assert_eq!(f.pod_subnets, vec!["10.244.0.0/16"]);
    assert_eq!(f.service_subnets, vec!["10.96.0.0/12"]);
    assert_eq!(f.kube_proxy_enabled, Some(true));
    assert_eq!(
        f.kube_prism,
        KubePrismFact {
            enabled: true,
            port: Some(7445)
        }
    );
    assert_eq!(f.kubernetes_version.as_deref(), Some("v1.28.0"));
    assert_eq!(
        f.control_plane_endpoint.as_deref(),
        Some("https://base:6443")
    );
}

#[test]
fn facts_custom_cni_in_both_shapes() {
    for f in [
        "stability-v1.12/overrides-controlplane.yaml",
        "stability-v1.14/overrides-controlplane.yaml",
    ] {
        let facts = MachineConfig::parse(&fixture(f)).unwrap().facts();
        assert_eq!(facts.cni, Some(CniName::Custom), "{f}");
        assert_eq!(facts.cni_urls, vec!["https://example.com/cni.yaml"], "{f}");
        assert_eq!(facts.dns_domain, "example.com", "{f}");
    }
    let v12 = MachineConfig::parse(&fixture("stability-v1.12/overrides-controlplane.yaml"))
        .unwrap()
        .facts();
    assert_eq!(v12.install_disk.as_deref(), Some("/dev/vda"));
}

#[test]
fn facts_workers() {
    let w12 = MachineConfig::parse(&fixture("stability-v1.12/base-worker.yaml"))
        .unwrap()
        .facts();
    assert_eq!(w12.machine_type, MachineType::Worker);
    let w14 = MachineConfig::parse(&fixture("stability-v1.14/base-worker.yaml"))
        .unwrap()
        .facts();
    assert_eq!(w14.machine_type, MachineType::Worker);
    assert_eq!(
        w14.kube_prism,
        KubePrismFact {
            enabled: true,
            port: Some(7445)
        }
    );
    assert_eq!(
        w14.cni, None,
        "a v1.14 worker config does not say which CNI runs"
    );
    assert_eq!(w14.kube_proxy_enabled, None);
}

/// Covers: R1.1a, R1.4b (the Talos side of "no CNI" and kube-proxy replaced)
#[test]
fn facts_no_cni_and_no_kube_proxy_in_both_shapes() {
    let legacy = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: true\n  inlineManifests:\n    - name: cilium\n      contents: 'kind: List'\n";
    let f = MachineConfig::parse(legacy).unwrap().facts();
    assert_eq!(f.cni, Some(CniName::None));
    assert_eq!(f.kube_proxy_enabled, Some(false));
    assert_eq!(f.kube_prism.enabled, false);
    assert_eq!(
        f.inline_manifests,
        vec![InlineManifestFact {
            name: "cilium".into(),
            contents: "kind: List".into()
        }]
    );

    let multidoc = "version: v1alpha1\nmachine:\n  type: controlplane\n---\napiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.1.0.0/16]\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n---\napiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: 'kind: List'\n";
    let f = MachineConfig::parse(multidoc).unwrap().facts();
    assert_eq!(f.shape, ConfigShape::Multidoc);
    assert_eq!(f.cni, Some(CniName::None));
    assert_eq!(f.kube_proxy_enabled, Some(false));
    assert_eq!(f.pod_subnets, vec!["10.1.0.0/16"]);
    assert_eq!(f.service_subnets, vec!["10.96.0.0/12"]);
    assert_eq!(f.inline_manifests.len(), 1);
}

#[test]
fn unattended_install_disk_and_image() {
    let text = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: factory.talos.dev/metal-installer/x:v1.14.0\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/nvme0n1\"\n  wipe: false\n";
    let f = MachineConfig::parse(text).unwrap().facts();
    assert_eq!(f.install_disk.as_deref(), Some("/dev/nvme0n1"));
    assert_eq!(
        f.install_image.as_deref(),
        Some("factory.talos.dev/metal-installer/x:v1.14.0")
    );
}

#[test]
fn errors_name_the_document_and_what_to_do() {
    let err = MachineConfig::parse_with_origin(
        "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: seven\n",
        "node.yaml",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("node.yaml") && msg.contains("document #2") && msg.contains("KubePrismConfig"),
        "{msg}"
    );
    let err = MachineConfig::parse_with_origin("- a\n", "x.yaml").unwrap_err();
    assert!(err.to_string().contains("is a YAML sequence"), "{err}");
    let err = MachineConfig::parse_with_origin("a: [\n", "x.yaml").unwrap_err();
    assert!(err.to_string().contains("not valid YAML"), "{err}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| Value::Number(i.into())),
            "[a-zA-Z0-9 :#\\-\n\"'{}]{0,16}".prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        scalar().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Sequence),
                prop::collection::vec(("[a-z]{1,6}", inner), 0..3).prop_map(|kv| {
                    Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect())
                }),
            ]
        })
    }

    fn extra() -> impl Strategy<Value = Extra> {
        prop::collection::vec(("x[a-z]{1,6}", value()), 0..3)
            .prop_map(|kv| kv.into_iter().collect())
    }

    fn opt_string() -> impl Strategy<Value = Option<String>> {
        prop::option::of("[a-zA-Z0-9./:\\- ]{0,12}")
    }

    fn string_map() -> impl Strategy<Value = Option<indexmap::IndexMap<String, String>>> {
        prop::option::of(
            prop::collection::vec(("[a-z./-]{1,12}", "[a-zA-Z0-9:]{0,8}"), 0..3)
                .prop_map(|kv| kv.into_iter().collect()),
        )
    }

    /// The documents Ichor reads and writes: v1alpha1 and the first
    /// multi-document kinds.
    fn core_document() -> impl Strategy<Value = Document> {
        prop_oneof![
            (
                opt_string(),
                prop::option::of(any::<bool>()),
                prop::option::of(1u32..65536),
                extra()
            )
                .prop_map(|(t, en, port, extra)| {
                    let mut v = V1Alpha1Config {
                        version: Some("v1alpha1".into()),
                        ..Default::default()
                    };
                    v.machine = Some(v1alpha1::MachineSection {
                        machine_type: t,
                        features: Some(v1alpha1::FeaturesSection {
                            kube_prism: Some(v1alpha1::KubePrismFeature {
                                enabled: en,
                                port,
                                extra: Extra::new(),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                    v.extra = extra;
                    Document::V1Alpha1(Box::new(v))
                }),
            (prop::option::of(0u32..70000), opt_string(), extra()).prop_map(
                |(port, tls, extra)| {
                    Document::KubePrism(KubePrismConfig {
                        api_version: Some("v1alpha1".into()),
                        port,
                        tls_server_name: tls,
                        extra,
                    })
                }
            ),
            (
                prop::option::of(prop::collection::vec("[0-9./]{1,18}", 0..3)),
                opt_string(),
                extra()
            )
                .prop_map(|(pods, dns, extra)| Document::KubeNetwork(
                    KubeNetworkConfig {
                        api_version: Some("v1alpha1".into()),
                        dns_domain: dns,
                        pod_subnets: pods,
                        service_subnets: None,
                        extra,
                    }
                )),
            (opt_string(), opt_string(), extra()).prop_map(|(n, m, extra)| {
                Document::KubeInlineManifest(KubeInlineManifestConfig {
                    api_version: Some("v1alpha1".into()),
                    name: n,
                    manifest: m,
                    extra,
                })
            }),
        ]
    }

    /// The Kubernetes kinds init writes, and a kind Ichor does not type.
    fn kube_document() -> impl Strategy<Value = Document> {
        prop_oneof![
            (string_map(), string_map(), extra()).prop_map(|(labels, taints, extra)| {
                Document::KubeNode(KubeNodeConfig {
                    api_version: Some("v1alpha1".into()),
                    labels,
                    annotations: None,
                    taints,
                    extra,
                })
            }),
            (
                opt_string(),
                prop::option::of(prop::collection::vec("[a-z0-9.]{1,12}", 0..3)),
                extra()
            )
                .prop_map(|(image, sans, extra)| Document::KubeApiServer(
                    KubeApiServerConfig {
                        api_version: Some("v1alpha1".into()),
                        image,
                        cert_extra_sans: sans,
                        extra,
                    }
                )),
            (opt_string(), opt_string(), extra()).prop_map(|(name, kind, extra)| {
                Document::KubeAuthorizer(KubeAuthorizerConfig {
                    api_version: Some("v1alpha1".into()),
                    name,
                    authorizer_type: kind,
                    extra,
                })
            }),
            ("[A-Z][a-zA-Z]{2,10}Config", extra()).prop_map(|(kind, extra)| {
                let mut m = Mapping::new();
                m.insert("apiVersion".into(), "v1alpha1".into());
                m.insert("kind".into(), Value::String(format!("Zz{kind}")));
                for (k, v) in extra {
                    m.insert(Value::String(k), v);
                }
                Document::Other(OtherDocument { mapping: m })
            }),
        ]
    }

    fn document() -> impl Strategy<Value = Document> {
        prop_oneof![core_document(), kube_document()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// parse(serialise(x)) == x, and serialising twice gives the same bytes.
        #[test]
        fn parse_of_serialise_is_identity(docs in prop::collection::vec(document(), 1..5)) {
            let cfg = MachineConfig { documents: docs };
            let text = cfg.to_yaml().unwrap();
            let back = MachineConfig::parse(&text).unwrap();
            prop_assert_eq!(&back, &cfg);
            prop_assert_eq!(back.to_yaml().unwrap(), text);
        }
    }
}

#[test]
fn live_resource_output_is_unwrapped() {
    let cfg = MachineConfig::parse_live(&fixture("cosi-machineconfig-resource.yaml"), "res.yaml")
        .unwrap();
    assert_eq!(cfg.facts().machine_type, MachineType::ControlPlane);
    let plain = fixture("stability-v1.12/base-controlplane.yaml");
    assert_eq!(
        MachineConfig::parse_live(&plain, "p").unwrap(),
        MachineConfig::parse(&plain).unwrap()
    );
    let two = format!(
        "{}\n---\n{}",
        fixture("cosi-machineconfig-resource.yaml"),
        fixture("cosi-machineconfig-resource.yaml")
    );
    let err = MachineConfig::parse_live(&two, "two.yaml").unwrap_err();
    assert!(
        err.to_string().contains("holds 2 MachineConfig resources"),
        "{err}"
    );
}

#[test]
fn upsert_and_remove_documents() {
    let mut cfg = MachineConfig::parse(&fixture("stability-v1.14/base-controlplane.yaml")).unwrap();
    let n = cfg.documents.len();
    cfg.upsert(Document::KubePrism(KubePrismConfig::new(7446)));
    assert_eq!(cfg.documents.len(), n);
    assert_eq!(cfg.facts().kube_prism.port, Some(7446));
    cfg.upsert(Document::KubeInlineManifest(KubeInlineManifestConfig::new(
        "cilium",
        "kind: List",
    )));
    cfg.upsert(Document::KubeInlineManifest(KubeInlineManifestConfig::new(
        "other",
        "kind: List",
    )));
    assert_eq!(cfg.documents.len(), n + 2);
    assert_eq!(cfg.remove("KubeInlineManifestConfig", Some("cilium")), 1);
    assert_eq!(cfg.remove("KubeAuthorizerConfig", None), 2);
    assert!(cfg.find_by_kind_name("KubeAuthorizerConfig").is_none());
    assert!(cfg.find_by_kind_name("HostnameConfig").is_some());
}

/// An upgraded cluster: legacy Kubernetes settings plus a v1.14 KubePrismConfig document.
#[test]
fn facts_of_a_mixed_upgraded_config_follow_the_legacy_fields() {
    let text = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  controlPlane:\n    endpoint: https://x:6443\n  network:\n    podSubnets: [10.3.0.0/16]\n---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7445\n";
    let f = MachineConfig::parse(text).unwrap().facts();
    assert_eq!(f.shape, ConfigShape::Legacy);
    assert_eq!(f.cni, Some(CniName::Flannel));
    assert_eq!(f.kube_proxy_enabled, Some(true));
    assert_eq!(
        f.kube_prism,
        KubePrismFact {
            enabled: true,
            port: Some(7445)
        }
    );
    assert_eq!(f.pod_subnets, vec!["10.3.0.0/16"]);
}

/// Covers: Talos's load rules (ADR 0009) — an inline manifest is read as Talos loads it:
/// leading line breaks and tabs dropped, leading spaces kept.
#[test]
fn inline_manifest_contents_lose_leading_line_breaks_as_in_talos() {
    let cfg = MachineConfig::parse(
        "version: v1alpha1\ncluster:\n  inlineManifests:\n    - name: a\n      contents: \"\\n\\n\\tkind: List\\n\"\n    - name: b\n      contents: \"  kind: List\\n\"\n",
    )
    .unwrap();
    let facts = cfg.facts();
    assert_eq!(facts.inline_manifests[0].contents, "kind: List\n");
    assert_eq!(facts.inline_manifests[1].contents, "  kind: List\n");
    let again = MachineConfig::parse(&cfg.to_yaml().unwrap()).unwrap();
    assert_eq!(again, cfg);
}

/// [`super::lookup`] finds what the mapping's own look-up finds, whether
/// it compares the keys in order (a small mapping) or hashes (a large one).
#[test]
fn lookup_finds_what_get_finds() {
    use serde_yaml_ng::{Mapping, Value};
    for n in [0usize, 1, 5, 12, 13, 40] {
        let mut m = Mapping::new();
        m.insert(Value::from(7), Value::from("a number key"));
        for i in 0..n {
            m.insert(Value::from(format!("k{i}")), Value::from(i as u64));
        }
        for i in 0..=n {
            let key = format!("k{i}");
            assert_eq!(
                super::lookup(&m, &key),
                m.get(key.as_str()),
                "{n} keys, {key}"
            );
        }
        assert_eq!(
            super::lookup(&m, "7"),
            m.get("7"),
            "a number key is not a string key"
        );
    }
}
