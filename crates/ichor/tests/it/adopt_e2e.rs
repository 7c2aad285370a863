//! `ichor adopt` end to end on the lab: a real kube-apiserver and etcd,
//! emulated Talos nodes, the node simulator, the real `ichor` binary (adopt,
//! and the controller adopt installs, which the lab runs as its Deployment's
//! pod under its ServiceAccount's token), the real helm and the stand-in
//! Cilium chart. One test per hardware case of docs/requirements.md (E1–E7), each asserting what
//! the case asserts.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use ichor_api::{IchorInstallation, KubeProxyMode, TalosCluster, TalosMachine};
use ichor_lab::{LabCni, LabOptions};
use ichor_testenv::Tool;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::{DynamicObject, ListParams};

use crate::common::{LabHarness, NS, run, text};

/// The shared harness, and what only these cases need.
struct Harness(LabHarness);

impl std::ops::Deref for Harness {
    type Target = LabHarness;
    fn deref(&self) -> &LabHarness {
        &self.0
    }
}

impl Harness {
    async fn up(shape: impl FnOnce(&mut LabOptions)) -> Harness {
        Harness(LabHarness::up(shape).await)
    }

    /// Every node's config, to compare before and after.
    fn configs(&self) -> Vec<Option<Vec<u8>>> {
        (0..self.lab.hostnames.len())
            .map(|i| self.lab.emulator.active_config(i))
            .collect()
    }

    async fn namespace_exists(&self, name: &str) -> bool {
        Api::<Namespace>::all(self.client().await)
            .get_opt(name)
            .await
            .unwrap()
            .is_some()
    }

    /// Waits (bounded) until every machine has the controller's report.
    async fn wait_machines_reconciled(&self) {
        let machines: Api<TalosMachine> = Api::namespaced(self.client().await, NS);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let list = machines.list(&ListParams::default()).await.unwrap();
            let done = !list.items.is_empty()
                && list.items.iter().all(|m| {
                    m.status.as_ref().is_some_and(|s| {
                        s.config_hash.is_some()
                            && s.conditions
                                .iter()
                                .any(|c| c.type_ == "Held" && c.status == "False")
                    })
                });
            if done {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "machines not reconciled after release: {list:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn helm_list(h: &LabHarness, tool: Tool, namespace: &str) -> serde_json::Value {
    let out = h.helm(tool, &["list", "--namespace", namespace, "-o", "json"]);
    assert!(out.status.success(), "helm list: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The values Ichor's Cilium release was installed with (its record's
/// `config`), whichever chart the lab gave Ichor.
async fn cilium_values(h: &Harness) -> serde_json::Value {
    let release = ichor_cilium::deployed_release(h.client().await, NS)
        .await
        .unwrap()
        .expect("Ichor's Cilium release is deployed");
    serde_json::Value::Object(release.config.unwrap_or_default())
}

/// Covers: R1.1a, R1.2a, R1.5a, R1.5b, R1.5c, R1.5d, R1.5e, R1.5f, R1.6, R1.7a, R1.7b, R2.2, R1.4d
///
/// E1: no CNI, kube-proxy enabled: the Cilium record in ichor-system (read by
/// helm v3 and v4), nodes Ready, Ichor installed, CNIHandover=True with no
/// inline entry and no ichor-cni Job, the nodes' configs untouched (the
/// emulator's write log is empty), holds released, and `ichor cluster status`
/// says managed Cilium. The controller doing it is the one adopt installed,
/// working as its ServiceAccount (the audit log says so), and a spec only
/// the webhook refuses is refused through the webhook's Service.
#[tokio::test(flavor = "multi_thread")]
async fn e1_no_cni_cluster_gets_cilium_then_ichor_then_is_adopted() {
    let h = Harness::up(|_| {}).await;
    let before = h.configs();

    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(out.status.success(), "adopt failed:\n{said}");
    assert!(said.contains("no CNI found: Ichor will install Cilium (tunnel vxlan, kube-proxy enabled) as its own Helm release, then install Ichor, then adopt"), "{said}");
    // Cilium before Ichor, Ichor before the machines (R1.5b–d, R1.7b).
    let order = [
        "installing Cilium",
        "Cilium is installed",
        "installing Ichor",
        "held TalosMachines",
        "CNIHandover=True",
        "released the hold",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|s| {
            said.find(s)
                .unwrap_or_else(|| panic!("{s:?} missing:\n{said}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "phases out of order:\n{said}"
    );

    let client = h.client().await;
    for tool in [Tool::Helm3, Tool::Helm4] {
        let releases = helm_list(&h, tool, NS);
        assert_eq!(releases[0]["name"], "cilium", "{releases}");
        assert_eq!(releases[0]["status"], "deployed", "{releases}");
        assert_eq!(releases[0]["namespace"], "kube-system", "{releases}");
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(nodes.items.iter().all(|n| {
        n.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }));
    assert!(
        Api::<IchorInstallation>::namespaced(client.clone(), NS)
            .get_opt("ichor")
            .await
            .unwrap()
            .is_some()
    );

    let cluster = Api::<TalosCluster>::namespaced(client.clone(), NS)
        .get("lab")
        .await
        .unwrap();
    let status = cluster.status.clone().unwrap();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "CNIHandover" && c.status == "True")
    );
    assert_eq!(
        status.cni.unwrap().detected,
        Some(ichor_api::DetectedCni::Cilium)
    );
    assert_eq!(
        cluster.metadata.annotations.as_ref().unwrap()["ichor.maesh.dev/adopted"],
        "true"
    );
    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        jobs.items.is_empty(),
        "no ichor-cni Job when the hash matches: {:?}",
        jobs.items
    );

    // R1.4d: the values installed are those the controller derives from the written object.
    let settings =
        ichor_cilium::ClusterSettings::from_cluster(&cluster, nodes.items.len() as u32).unwrap();
    let derived = serde_json::Value::Object(ichor_cilium::effective_values(&settings).unwrap());
    let installed = cilium_values(&h).await;
    for (k, v) in derived.as_object().unwrap() {
        assert_eq!(
            &installed[k], v,
            "installed value {k} differs from the derived one"
        );
    }

    h.wait_machines_reconciled().await;
    // The installed controller did the work, as its ServiceAccount, and the
    // API server calls its webhooks through their Service.
    crate::common::assert_the_controller_acts_as_its_service_account(&h).await;
    crate::common::assert_the_webhook_refuses_through_its_service(&h).await;
    let machines = Api::<TalosMachine>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 2);
    for m in &machines.items {
        assert!(!m.spec.hold, "hold released on {:?}", m.metadata.name);
        assert!(
            m.status
                .as_ref()
                .unwrap()
                .drift
                .iter()
                .all(|d| d.class == ichor_api::DriftClass::A),
            "{:?}",
            m.status
        );
    }
    assert!(
        h.lab.emulator.writes().is_empty(),
        "nothing was written to a node: {:?}",
        h.lab.emulator.writes()
    );
    assert_eq!(
        h.configs(),
        before,
        "the nodes' configs are byte-identical before and after"
    );

    let mut status = h.ichor();
    status
        .args(["cluster", "status", "--kubeconfig"])
        .arg(&h.lab.kubeconfig);
    let out = run(status);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("managed Cilium"), "{}", text(&out));
}

/// Covers: R1.4b, R1.4d
///
/// E2: kube-proxy disabled in Talos: `replaced`, kubeProxyReplacement=true.
#[tokio::test(flavor = "multi_thread")]
async fn e2_kube_proxy_disabled_in_talos_is_replaced_by_cilium() {
    let h = Harness::up(|o| o.kube_proxy = false).await;
    let out = run(h.adopt(&["--tunnel", "geneve"]));
    let said = text(&out);
    assert!(out.status.success(), "adopt failed:\n{said}");
    assert!(
        said.contains("(tunnel geneve, kube-proxy replaced)"),
        "{said}"
    );
    let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
        .get("lab")
        .await
        .unwrap();
    assert_eq!(cluster.spec.cni.kube_proxy, KubeProxyMode::Replaced);
    let values = cilium_values(&h).await;
    // Cilium 1.18 takes the string form.
    assert_eq!(values["kubeProxyReplacement"], "true", "{values}");
    assert_eq!(values["tunnelProtocol"], "geneve");
}

/// Covers: R1.2b, R1.3e
///
/// E3: --cni-unmanaged on a no-CNI cluster is refused; the nodes' configs and
/// ichor-system are unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn e3_cni_unmanaged_on_a_no_cni_cluster_is_refused_with_nothing_written() {
    let h = Harness::up(|_| {}).await;
    let before = h.configs();
    let out = run(h.adopt(&["--cni-unmanaged"]));
    assert!(!out.status.success());
    assert!(text(&out).contains("this cluster has no CNI, so no pod can run on it, including Ichor's. Run again without --cni-unmanaged and Ichor installs Cilium, or install a CNI yourself first."), "{}", text(&out));
    assert!(!h.namespace_exists(NS).await, "ichor-system must not exist");
    assert_eq!(h.configs(), before);
    assert!(h.lab.emulator.writes().is_empty());
}

/// Covers: R1.3b, R1.3c, R1.3e
///
/// E4: KubePrism disabled → refused with the enable-KubePrism message; a node
/// without a pod CIDR → refused; nothing written either time.
#[tokio::test(flavor = "multi_thread")]
async fn e4_kubeprism_off_or_a_node_without_pod_cidr_is_refused() {
    let h = Harness::up(|o| o.kube_prism = false).await;
    let out = run(h.adopt(&[]));
    assert!(!out.status.success());
    assert!(
        text(&out).contains("KubePrism must be enabled on port 7445 on node"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("Enable it first"), "{}", text(&out));
    assert!(!h.namespace_exists(NS).await);
    drop(h);

    let h = Harness::up(|o| o.pod_cidrs = false).await;
    let out = run(h.adopt(&[]));
    assert!(!out.status.success());
    assert!(text(&out).contains("has no spec.podCIDR"), "{}", text(&out));
    assert!(!h.namespace_exists(NS).await);
    assert!(h.lab.emulator.writes().is_empty());
}

/// Runs adopt and SIGKILLs it as soon as it prints `line`.
fn adopt_killed_after(h: &Harness, line: &str) -> String {
    let mut child = h
        .adopt(&[])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = String::new();
    for l in BufReader::new(stderr).lines() {
        let l = l.unwrap();
        seen.push_str(&l);
        seen.push('\n');
        if l.contains(line) {
            child.kill().unwrap();
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "adopt should have been killed at {line:?}:\n{seen}"
    );
    seen
}

/// Helm's record Secrets of Ichor's Cilium release in ichor-system:
/// (revision, status), oldest first.
async fn cilium_records(h: &Harness) -> Vec<(u32, String)> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(h.client().await, NS);
    let lp = ListParams::default().labels("owner=helm,name=cilium");
    let mut records: Vec<(u32, String)> = secrets
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let labels = s.metadata.labels.unwrap_or_default();
            (labels["version"].parse().unwrap(), labels["status"].clone())
        })
        .collect();
    records.sort();
    records
}

/// Runs adopt and SIGKILLs it the moment Ichor's Cilium record exists in
/// ichor-system as `pending-install` (the Helm engine's lock, written before
/// any object); returns the records as they were after the kill.
async fn adopt_killed_while_the_record_is_pending(h: &Harness) -> Vec<(u32, String)> {
    let mut child = h
        .adopt(&[])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        if cilium_records(h)
            .await
            .iter()
            .any(|(_, s)| s == "pending-install")
        {
            child.kill().unwrap();
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "adopt ended before its Cilium record was pending"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending Cilium record appeared"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!child.wait().unwrap().success());
    cilium_records(h).await
}

/// Covers: R1.7c, R5.6
///
/// E5: the CLI killed while Ichor's Cilium record is pending-install (the
/// Helm install under way), and again after the Cilium wait; each rerun
/// finishes the job. The first rerun repairs the dead pending record: the
/// history shows an upgrade over it (revision 1 superseded, revision 2
/// deployed), not an uninstall and a new install.
#[tokio::test(flavor = "multi_thread")]
async fn e5_a_killed_adopt_is_finished_by_a_rerun() {
    let h = Harness::up(|_| {}).await;
    let at_the_kill = adopt_killed_while_the_record_is_pending(&h).await;
    assert_eq!(
        at_the_kill,
        [(1, "pending-install".to_string())],
        "the record was pending when adopt was killed"
    );
    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(
        out.status.success(),
        "rerun after a kill during the Helm install:\n{said}\n{}",
        h.logs()
    );
    assert_eq!(
        cilium_records(&h).await,
        [(1, "superseded".to_string()), (2, "deployed".to_string())],
        "the rerun repaired the pending record and upgraded over it:\n{said}"
    );
    let history = h.helm(
        Tool::Helm4,
        &["history", "cilium", "--namespace", NS, "-o", "json"],
    );
    assert!(history.status.success(), "{}", text(&history));
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(history[1]["description"], "Upgrade complete", "{history}");
    drop(h);

    let h = Harness::up(|_| {}).await;
    adopt_killed_after(&h, "Cilium is installed");
    assert_eq!(
        cilium_records(&h).await,
        [(1, "deployed".to_string())],
        "killed after the Cilium wait: the release is deployed"
    );
    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(out.status.success(), "rerun after the Cilium wait:\n{said}");
    assert!(
        said.contains("Cilium with Ichor's Helm record in ichor-system"),
        "the rerun sees Ichor's record:\n{said}"
    );
    let releases = helm_list(&h, Tool::Helm4, NS);
    assert_eq!(releases[0]["status"], "deployed");
    let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
        .get("lab")
        .await
        .unwrap();
    assert!(
        cluster
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "CNIHandover" && c.status == "True")
    );
}

/// Covers: R3.1, R3.2
///
/// E6 (bad image): Ichor's controller never becomes ready → adopt exits
/// within its wait timeout with the Pending reasons printed.
#[tokio::test(flavor = "multi_thread")]
async fn e6_a_broken_ichor_image_ends_the_wait_with_its_reason() {
    let h = Harness::up(|_| {}).await;
    let out = run(h.adopt(&[
        "--controller-image",
        "ghcr.io/maeshinshin/ichor-controller:broken",
        "--wait-timeout",
        "20s",
    ]));
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("Ichor's webhooks did not finish within 20s"),
        "{said}"
    );
    assert!(said.contains("waiting: ImagePullBackOff"), "{said}");
}

/// Covers: R2.1a, R2.1b, R2.1c, R2.0
///
/// E7: the policy gate. Flannel and Calico adopted with --cni-unmanaged → no
/// policies and the notice; Cilium with --cni-unmanaged → policies applied.
#[tokio::test(flavor = "multi_thread")]
async fn e7_policies_follow_the_detected_cni_not_the_preset() {
    for (cni, notice) in [
        (LabCni::Flannel, Some("detected CNI is flannel")),
        (LabCni::Calico, Some("detected CNI is calico")),
        (LabCni::Cilium, None),
    ] {
        let h = Harness::up(|o| o.cni = cni).await;
        // Without --cni-unmanaged a CNI that is not Ichor's to manage is refused…
        if cni != LabCni::Cilium {
            let out = run(h.adopt(&[]));
            assert!(!out.status.success());
            assert!(text(&out).contains("--cni-unmanaged"), "{}", text(&out));
        }
        let out = run(h.adopt(&["--cni-unmanaged"]));
        let said = text(&out);
        assert!(out.status.success(), "{cni:?}: {said}");
        let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "cilium.io",
            "v2",
            "CiliumNetworkPolicy",
        ));
        let policies = match notice {
            Some(n) => {
                assert!(
                    said.contains(&format!(
                        "not applying Ichor's Cilium network policies: {n}"
                    )),
                    "{said}"
                );
                0
            }
            None => {
                assert!(
                    said.contains("applied Ichor's Cilium network policies"),
                    "{said}"
                );
                Api::<DynamicObject>::namespaced_with(h.client().await, NS, &ar)
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .len()
            }
        };
        assert_eq!(policies > 0, notice.is_none(), "{cni:?}");
        let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
            .get("lab")
            .await
            .unwrap();
        assert_eq!(cluster.spec.cni.preset, ichor_api::CniPreset::Unmanaged);
    }
}

/// Covers: R2.0, R2.1c, R5.1
///
/// E7, the managed half: a Cilium installed by someone else is taken over —
/// the controller's ichor-cni Job (run by the lab as the real binary) makes it
/// Ichor's release with its record in ichor-system, the hand-over completes,
/// and Ichor's policies are applied.
#[tokio::test(flavor = "multi_thread")]
async fn e7_a_cilium_takeover_gets_the_policies_and_ichors_release() {
    let h = Harness::up(|o| o.cni = LabCni::Cilium).await;
    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    assert!(
        said.contains("Cilium without an Ichor record found: Ichor will take it over"),
        "{said}"
    );
    assert!(
        said.contains("applied Ichor's Cilium network policies"),
        "{said}"
    );
    let releases = helm_list(&h, Tool::Helm3, NS);
    assert_eq!(releases[0]["name"], "cilium", "{releases}");
    assert_eq!(releases[0]["status"], "deployed", "{releases}");
    let jobs = Api::<Job>::namespaced(h.client().await, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(jobs.items.len(), 1, "one ichor-cni Job took it over");
    assert_eq!(jobs.items[0].status.as_ref().unwrap().succeeded, Some(1));
    let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
        .get("lab")
        .await
        .unwrap();
    assert_eq!(cluster.spec.cni.preset, ichor_api::CniPreset::Cilium);
    assert!(
        cluster
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "CNIHandover" && c.status == "True")
    );
}

/// Bad input: an unreadable talosconfig, a wrong CA, an unreachable node and a
/// wrong kubeconfig each end with one clear error, and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gives_one_clear_error_and_writes_nothing() {
    let h = Harness::up(|_| {}).await;
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("missing-talosconfig");
    let out = run(h.adopt_with(&missing, &h.lab.kubeconfig, &[]));
    assert!(!out.status.success());
    assert!(text(&out).contains("missing-talosconfig"), "{}", text(&out));

    // A talosconfig whose CA is another cluster's.
    let other = ichor_talos::secrets::SecretsBundle::generate().unwrap();
    let nodes: Vec<String> = h.lab.addresses.iter().map(ToString::to_string).collect();
    let tc = ichor_talos::talosconfig::Talosconfig::generate(
        &other,
        "other",
        &nodes[..1],
        &nodes,
        ichor_talos::talosconfig::Role::Admin,
        Duration::from_secs(3600),
    )
    .unwrap();
    let wrong = dir.path().join("wrong-ca");
    tc.write_file(&wrong).unwrap();
    let out = run(h.adopt_with(&wrong, &h.lab.kubeconfig, &[]));
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&nodes[0]),
        "the error names the node: {}",
        text(&out)
    );

    // A node no control plane can reach (a loopback address nothing listens on).
    let unreachable = run(h.adopt(&["--nodes", &format!("{},127.1.2.3", nodes[0])]));
    assert!(!unreachable.status.success());
    assert!(
        text(&unreachable).contains("127.1.2.3"),
        "the error names the node: {}",
        text(&unreachable)
    );

    let bad_kube = dir.path().join("kubeconfig");
    std::fs::write(
        &bad_kube,
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n",
    )
    .unwrap();
    let out = run(h.adopt_with(&h.lab.talosconfig, &bad_kube, &[]));
    assert!(!out.status.success());
    assert!(text(&out).contains("kubeconfig"), "{}", text(&out));

    assert!(!h.namespace_exists(NS).await, "nothing written");
    assert!(h.lab.emulator.writes().is_empty());
}
