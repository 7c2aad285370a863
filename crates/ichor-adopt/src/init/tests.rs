use super::*;
use ichor_render::INLINE_CNI_NAME;
use pretty_assertions::assert_eq;

fn fixtures() -> std::path::PathBuf {
    ichor_testenv::fixtures::talos_dir()
}

/// The stability fixtures' bundle (real Talos output).
fn bundle() -> SecretsBundle {
    SecretsBundle::from_file(&fixtures().join("stability-secrets.yaml")).unwrap()
}

const CILIUM: &str =
    "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n";

fn fresh(address: &str, hostname: &str, version: &str) -> NodeProbe {
    NodeProbe {
        address: address.into(),
        answer: NodeAnswer::Maintenance {
            hostname: hostname.into(),
            talos_version: version.into(),
            disks: vec!["/dev/vdb".into(), "/dev/vda".into()],
        },
    }
}

fn request() -> InitRequest {
    InitRequest {
        cluster: "lab".into(),
        endpoint: "https://10.5.0.2:6443".into(),
        control_planes: vec!["10.5.0.2".into()],
        workers: vec!["10.5.0.3".into(), "10.5.0.4".into()],
        talos_version: None,
        kubernetes_version: None,
        tunnel: Tunnel::Vxlan,
        kube_proxy: KubeProxyMode::Enabled,
        patches: vec![],
        secrets_source: "generated".into(),
    }
}

fn probes(version: &str) -> Vec<NodeProbe> {
    vec![
        fresh("10.5.0.2", "cp-1", version),
        fresh("10.5.0.3", "worker-1", version),
        fresh("10.5.0.4", "worker-2", version),
    ]
}

fn messages(refusals: &[Refusal]) -> Vec<String> {
    refusals.iter().map(|r| r.message.clone()).collect()
}

/// Every bad input is named at once, each with what to do, before anything
/// is written.
/// Covers: R10.1
#[test]
fn every_refusal_at_once() {
    let mut req = request();
    req.endpoint = "10.5.0.2:6443".into();
    req.control_planes = vec!["10.5.0.2".into(), "10.5.0.5".into()];
    req.workers = vec![
        "10.5.0.3".into(),
        "10.5.0.4".into(),
        "10.5.0.2".into(),
        "10.5.0.6".into(),
    ];
    req.patches = vec![PatchFile {
        name: "broken.yaml".into(),
        text: "machine: [\n".into(),
    }];
    let probes = vec![
        fresh("10.5.0.2", "cp-1", "v1.13.9"),
        NodeProbe {
            address: "10.5.0.3".into(),
            answer: NodeAnswer::Configured {
                detail: "its insecure API refuses: it runs a config".into(),
            },
        },
        NodeProbe {
            address: "10.5.0.4".into(),
            answer: NodeAnswer::Unreachable {
                error: "connection refused".into(),
            },
        },
        fresh("10.5.0.5", "cp-2", "v1.11.5"),
        fresh("10.5.0.6", "worker-3", "v1.13.9"),
    ];
    let refusals = plan(&req, &probes, &bundle(), CILIUM).unwrap_err();
    let m = messages(&refusals);
    assert_eq!(m.len(), 6, "{m:#?}");
    assert!(m[0].starts_with("--endpoint \"10.5.0.2:6443\" is not a URL of the Kubernetes API: it must start with https://"), "{m:#?}");
    assert_eq!(
        m[1],
        "node 10.5.0.2 is given twice: each address may appear once, under --control-plane or --worker"
    );
    assert!(
        m[2].starts_with("node 10.5.0.5 runs Talos v1.11.5; ichor init needs Talos v1.12 or later"),
        "{m:#?}"
    );
    assert!(
        m[3].starts_with("node 10.5.0.3 is not in maintenance mode"),
        "{m:#?}"
    );
    assert!(m[3].contains("ichor adopt"), "{m:#?}");
    assert!(
        m[4].starts_with("node 10.5.0.4 is unreachable: connection refused"),
        "{m:#?}"
    );
    assert!(m[5].starts_with("--config-patch broken.yaml:"), "{m:#?}");
}

/// Covers: R10.1
#[test]
fn endpoints_that_are_not_urls_are_refused() {
    for bad in [
        "10.5.0.2:6443",
        "http://10.5.0.2:6443",
        "https://10.5.0.2",
        "https://:6443",
        "https://10.5.0.2:6443/api",
        "https://10.5.0.2:http",
    ] {
        assert!(check_endpoint(bad).is_err(), "{bad}");
    }
    for good in [
        "https://10.5.0.2:6443",
        "https://k8s.example.com:443",
        "https://[fd00::2]:6443",
    ] {
        assert_eq!(check_endpoint(good), Ok(()), "{good}");
    }
}

/// Covers: R10.1
#[test]
fn kubernetes_versions_outside_talos_support_are_refused() {
    let mut req = request();
    req.kubernetes_version = Some("v1.37.2".into());
    let m = messages(&plan(&req, &probes("v1.13.9"), &bundle(), CILIUM).unwrap_err());
    assert_eq!(
        m,
        [
            "--kubernetes-version v1.37.2 is not supported by Talos v1.13.9 (it runs Kubernetes v1.31 to v1.36)"
        ]
    );
}

/// The plan as read before consent and as `-o json` prints it.
/// Covers: R10.2
#[test]
fn the_init_plan_text_and_json_snapshots() {
    let mut req = request();
    req.patches = vec![PatchFile {
        name: "ntp.yaml".into(),
        text: "machine:\n  time:\n    servers: [time.cloudflare.com]\n".into(),
    }];
    let (p, _) = plan(&req, &probes("v1.13.9"), &bundle(), CILIUM).unwrap();
    insta::assert_snapshot!("init-plan-text", p.text());
    insta::assert_snapshot!("init-plan-json", serde_json::to_string_pretty(&p).unwrap());
}

/// No value of the bundle shows in the plan, in either form.
#[test]
fn the_plan_holds_no_secret() {
    let b = bundle();
    let (p, w) = plan(&request(), &probes("v1.13.9"), &b, CILIUM).unwrap();
    let shown = format!(
        "{}\n{}\n{w:?}",
        p.text(),
        serde_json::to_string(&p).unwrap()
    );
    let secrets = [
        b.cluster.secret.clone(),
        b.secrets.bootstraptoken.clone(),
        b.trustdinfo.token.clone(),
        b.certs.os.key.clone().unwrap(),
        b.certs.k8s.key.clone().unwrap(),
    ];
    for s in secrets {
        assert!(!shown.contains(&s), "a secret shows in the plan");
    }
}

fn rendered(w: &InitWrites, address: &str) -> MachineConfig {
    let (_, text) = w.configs.iter().find(|(a, _)| a == address).unwrap();
    MachineConfig::parse_live(text, address).unwrap()
}

/// What the controller's first reconcile sees: for every node, the render of
/// the TalosCluster and TalosMachine init wrote, over the config init
/// applied, equals that config. No drift.
/// Covers: R10.2
#[test]
fn the_controllers_first_reconcile_finds_no_drift_in_both_shapes() {
    for (version, kube_proxy) in [
        ("v1.13.9", KubeProxyMode::Enabled),
        ("v1.12.4", KubeProxyMode::Replaced),
        ("v1.14.0", KubeProxyMode::Replaced),
        ("v1.14.0", KubeProxyMode::Enabled),
    ] {
        let mut req = request();
        req.kube_proxy = kube_proxy;
        req.patches = vec![PatchFile {
            name: "ntp.yaml".into(),
            text: "machine:\n  time:\n    servers: [time.cloudflare.com]\n".into(),
        }];
        let (_, w) = plan(&req, &probes(version), &bundle(), CILIUM).unwrap();
        for machine in &w.machines {
            let patches: Vec<_> = machine
                .spec
                .patches
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            assert_eq!(patches, ["ntp.yaml"], "the machine keeps init's patch");
            let live = rendered(&w, &machine.spec.address);
            let desired =
                ichor_render::render(&RenderInput::from_objects(&w.cluster, machine, &live))
                    .unwrap();
            let drift = ichor_render::compare(&live, &desired.config).unwrap();
            assert!(
                drift.entries.is_empty(),
                "{version} {}: {:?}",
                machine.spec.address,
                drift.entries
            );
        }
    }
}

/// The control plane carries Ichor's Cilium inline, the workers do not; the
/// CNI is off (Cilium replaces it), kube-proxy follows the request, the
/// patch is applied, and the shape follows the Talos version.
/// Covers: R10.2
#[test]
fn the_configs_carry_cilium_inline_on_control_planes_only() {
    for (version, shape) in [
        ("v1.13.9", ichor_talos::config::ConfigShape::Legacy),
        ("v1.14.0", ichor_talos::config::ConfigShape::Multidoc),
    ] {
        let mut req = request();
        req.kube_proxy = KubeProxyMode::Replaced;
        req.patches = vec![PatchFile {
            name: "ntp.yaml".into(),
            text: "machine:\n  time:\n    servers: [time.cloudflare.com]\n".into(),
        }];
        let (p, w) = plan(&req, &probes(version), &bundle(), CILIUM).unwrap();
        assert_eq!(p.bootstrap_node, "10.5.0.2");
        let cp = rendered(&w, "10.5.0.2").facts();
        assert_eq!(cp.shape, shape, "{version}");
        assert_eq!(cp.cni, Some(ichor_talos::config::CniName::None));
        assert_eq!(cp.kube_proxy_enabled, Some(false));
        let inline: Vec<_> = cp
            .inline_manifests
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(inline, [INLINE_CNI_NAME]);
        assert_eq!(cp.install_disk.as_deref(), Some("/dev/vda"));
        let worker = rendered(&w, "10.5.0.3").facts();
        assert!(worker.inline_manifests.is_empty());
        let (_, text) = &w.configs[1];
        assert!(
            text.contains("time.cloudflare.com"),
            "the patch is in the worker's config"
        );
        assert_eq!(w.machines.len(), 3);
        assert!(
            w.machines.iter().all(|m| !m.spec.hold),
            "init's machines are not held"
        );
        assert_eq!(w.machines[0].metadata.name.as_deref(), Some("cp-1"));
    }
}

/// The base config init starts each node's render from, in both shapes and
/// both roles, byte for byte (the fixture bundle's test secrets only).
#[test]
fn the_base_configs_in_both_shapes_and_roles() {
    let b = bundle();
    for (shape, talos_version, kubernetes_version) in [
        (ConfigShape::Legacy, "v1.13.9", "v1.36.0"),
        (ConfigShape::Multidoc, "v1.14.0", "v1.37.0"),
    ] {
        for control_plane in [true, false] {
            let docs = base_config(
                &b,
                &BaseInput {
                    shape,
                    control_plane,
                    cluster_name: "lab",
                    endpoint: "https://10.5.0.2:6443",
                    kubernetes_version,
                    talos_version,
                    install_disk: "/dev/vda",
                },
            );
            let yaml: Vec<String> = docs
                .iter()
                .map(|d| serde_yaml_ng::to_string(d).unwrap())
                .collect();
            let role = if control_plane {
                "controlplane"
            } else {
                "worker"
            };
            insta::assert_snapshot!(
                format!("init-base-{}-{role}", shape.as_str()),
                yaml.join("---\n")
            );
        }
    }
}

/// Init writes every document of a base config from ichor-talos's typed
/// model (docs/adr/0003-typed-machine-config.md): none reads back as an
/// untyped document.
#[test]
fn the_base_configs_hold_no_untyped_document() {
    use ichor_talos::config::DocumentKind;
    let b = bundle();
    for shape in [ConfigShape::Legacy, ConfigShape::Multidoc] {
        for control_plane in [true, false] {
            let docs = base_config(
                &b,
                &BaseInput {
                    shape,
                    control_plane,
                    cluster_name: "lab",
                    endpoint: "https://10.5.0.2:6443",
                    kubernetes_version: "v1.36.0",
                    talos_version: "v1.14.0",
                    install_disk: "/dev/vda",
                },
            );
            let cfg = MachineConfig::from_mappings(docs, "the base config").unwrap();
            let untyped: Vec<String> = cfg
                .documents_of(DocumentKind::Other)
                .map(|d| d.kind_name().to_string())
                .collect();
            assert!(
                untyped.is_empty(),
                "{shape:?}, control plane {control_plane}: {untyped:?}"
            );
        }
    }
}
