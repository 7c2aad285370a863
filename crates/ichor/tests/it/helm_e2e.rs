//! Ichor installed with Helm, end to end on the lab: the hardware cases F1–F5 of docs/requirements.md
//! with the real helm (v3 and v4) installing the packaged chart
//! (`dist/chart`), and the real `ichor` binary.
//!
//! The chart's controller Deployment runs as itself: the lab runs its pod as
//! the local `ichor` binary with the Deployment's args, under a token of the
//! chart's ServiceAccount, and the API server calls the chart's webhooks
//! through their Service (the chart's own failurePolicy, Fail).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ichor_api::{IchorInstallation, Manager, TalosCluster, TalosMachine};
use ichor_lab::LabCni;
use ichor_testenv::Tool;
use ichor_testenv::tools::repo_root;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};

/// The preflight's text, word for word as R4.4a has it.
const PREFLIGHT: &str = "this cluster has no pod network, so Ichor's pods cannot start. Run ichor cni bootstrap first (it installs Ichor's Cilium), then helm install again.";

use crate::common::{LabHarness, NS, run, text};

/// The shared harness, and what only the Helm cases need.
struct Harness(LabHarness);

impl std::ops::Deref for Harness {
    type Target = LabHarness;
    fn deref(&self) -> &LabHarness {
        &self.0
    }
}

impl Harness {
    async fn up(cni: LabCni) -> Harness {
        Harness(LabHarness::up(|o| o.cni = cni).await)
    }

    /// `helm package` of dist/chart, as the release does; `None` keeps
    /// Chart.yaml's versions.
    fn package(&self, version: Option<(&str, &str)>) -> PathBuf {
        let dest = self.dir.path().join(format!(
            "chart-{}",
            version.map(|v| v.0).unwrap_or("default")
        ));
        let chart = repo_root().join("dist/chart");
        let mut cmd = Command::new(Tool::Helm4.path());
        cmd.env("HELM_CACHE_HOME", self.dir.path().join("pkg/cache"))
            .env("HELM_CONFIG_HOME", self.dir.path().join("pkg/config"))
            .env("HELM_DATA_HOME", self.dir.path().join("pkg/data"))
            .arg("package")
            .arg(&chart)
            .arg("--destination")
            .arg(&dest);
        if let Some((v, app)) = version {
            cmd.args(["--version", v, "--app-version", app]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "helm package: {}", text(&out));
        std::fs::read_dir(&dest)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "tgz"))
            .unwrap()
    }

    fn install(&self, tool: Tool, archive: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "install",
            "ichor",
            archive.to_str().unwrap(),
            "--namespace",
            NS,
            "--create-namespace",
        ];
        args.extend_from_slice(extra);
        self.helm(tool, &args)
    }

    fn adopt(&self, extra: &[&str]) -> Output {
        self.0.adopt(extra).output().expect("run ichor adopt")
    }

    /// The IchorInstallation, if there is one yet, is the chart's
    /// controller's (manager helm, R5.2), never adopt's.
    async fn assert_adopt_created_no_installation(&self) {
        if let Some(installation) = self.installation().await {
            assert_eq!(installation.spec.deployment.manager, Manager::Helm);
            let writers: Vec<String> = installation
                .metadata
                .managed_fields
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.manager)
                .collect();
            assert!(
                !writers.iter().any(|w| w == ichor_adopt_run::FIELD_MANAGER),
                "adopt creates no IchorInstallation on a Helm install: {writers:?}"
            );
        }
    }

    async fn installation(&self) -> Option<IchorInstallation> {
        Api::<IchorInstallation>::namespaced(self.client().await, NS)
            .get_opt("ichor")
            .await
            .unwrap_or(None)
    }

    /// Objects in ichor-system that `ichor adopt` wrote by server-side apply
    /// (the install manifest, the policies): none on a Helm install.
    async fn applied_by_adopt(&self) -> Vec<String> {
        let client = self.client().await;
        let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
        let mut found = Vec::new();
        let mut listed = 0;
        for group in discovery.groups() {
            for (ar, caps) in group.recommended_resources() {
                if caps.scope != kube::discovery::Scope::Namespaced
                    || !caps.supports_operation(kube::discovery::verbs::LIST)
                {
                    continue;
                }
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
                let Ok(list) = api.list(&ListParams::default()).await else {
                    continue;
                };
                listed += list.items.len();
                for o in list.items {
                    let by_adopt = o.metadata.managed_fields.iter().flatten().any(|m| {
                        m.manager.as_deref() == Some(ichor_adopt_run::FIELD_MANAGER)
                            && m.operation.as_deref() == Some("Apply")
                    });
                    if by_adopt {
                        found.push(format!(
                            "{} {}",
                            ar.kind,
                            o.metadata.name.unwrap_or_default()
                        ));
                    }
                }
            }
        }
        assert!(listed > 0, "the look at ichor-system saw no object at all");
        found
    }

    async fn crds_present(&self) -> usize {
        Api::<CustomResourceDefinition>::all(self.client().await)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|c| c.spec.group == ichor_api::GROUP)
            .count()
    }

    async fn installer_deployment(&self) -> bool {
        let lp = ListParams::default().labels(&format!(
            "app.kubernetes.io/name={}",
            ichor_adopt::install::INSTALLER_NAME_LABEL
        ));
        !Api::<Deployment>::all(self.client().await)
            .list(&lp)
            .await
            .unwrap()
            .items
            .is_empty()
    }

    async fn policies(&self) -> usize {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cilium.io",
            "v2",
            "CiliumNetworkPolicy",
        ));
        Api::<DynamicObject>::namespaced_with(self.client().await, NS, &ar)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
    }
}

/// Covers: R4.4a
///
/// F5: on a no-CNI cluster, `helm template` and `helm install --dry-run`
/// (v3 and v4) do not fail on the preflight: `lookup` returns nothing there.
#[tokio::test(flavor = "multi_thread")]
async fn f5_template_and_dry_run_do_not_fail_on_the_preflight() {
    let h = Harness::up(LabCni::None).await;
    let archive = h.package(None);
    let kube_version = Tool::KubeApiserver.version();
    for tool in [Tool::Helm3, Tool::Helm4] {
        let out = h.helm(
            tool,
            &[
                "template",
                "ichor",
                archive.to_str().unwrap(),
                "--namespace",
                NS,
                "--kube-version",
                &kube_version,
            ],
        );
        assert!(out.status.success(), "{tool:?} template: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("kind: Deployment"));
        let out = h.helm(
            tool,
            &[
                "install",
                "ichor",
                archive.to_str().unwrap(),
                "--namespace",
                NS,
                "--dry-run",
            ],
        );
        assert!(
            out.status.success(),
            "{tool:?} install --dry-run: {}",
            text(&out)
        );
        assert!(!text(&out).contains("no pod network"), "{}", text(&out));
    }
    assert_eq!(h.crds_present().await, 0, "a dry run writes nothing");
}

/// Covers: R4.4a, R4.4b, R4.4c, R4.3a, R4.3b, R5.2, R4.5
///
/// F3: on a no-CNI cluster `helm install` of the packaged chart is refused by
/// the preflight with the text of R4.4a (v3 and v4) and creates nothing;
/// `preflight.cni=false` skips it (checked with a dry run against the
/// cluster). `ichor cni bootstrap --kube-proxy enabled` installs Ichor's
/// Cilium; `helm install` then succeeds; `ichor adopt` recognises the Cilium
/// record (R4.4c), reads tunnel and kube-proxy back, skips the install step
/// and completes. The IchorInstallation is the controller's (manager helm).
#[tokio::test(flavor = "multi_thread")]
async fn f3_preflight_refuses_a_no_cni_cluster_until_cni_bootstrap() {
    let h = Harness::up(LabCni::None).await;
    let archive = h.package(None);
    for tool in [Tool::Helm3, Tool::Helm4] {
        let out = h.install(tool, &archive, &[]);
        assert!(
            !out.status.success(),
            "{tool:?} installed on a cluster with no pod network"
        );
        assert!(text(&out).contains(PREFLIGHT), "{tool:?}: {}", text(&out));
    }
    assert_eq!(
        h.crds_present().await,
        0,
        "a refused install creates nothing"
    );
    // preflight.cni=false: the check is off (a server-side dry run does lookups).
    let out = h.helm(
        Tool::Helm4,
        &[
            "install",
            "ichor",
            archive.to_str().unwrap(),
            "--namespace",
            NS,
            "--dry-run=server",
            "--set",
            "preflight.cni=false",
        ],
    );
    assert!(out.status.success(), "preflight.cni=false: {}", text(&out));

    let mut bootstrap = h.ichor();
    bootstrap
        .args([
            "cni",
            "bootstrap",
            "--kube-proxy",
            "enabled",
            "--tunnel",
            "geneve",
            "--wait-timeout",
            "3m",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig)
        .arg("--helm")
        .arg(Tool::Helm4.path())
        .arg("--cilium-chart")
        .arg(h.cilium_chart());
    let out = bootstrap.output().unwrap();
    assert!(out.status.success(), "ichor cni bootstrap: {}", text(&out));

    let out = h.install(Tool::Helm4, &archive, &[]);
    assert!(
        out.status.success(),
        "helm install after the bootstrap: {}",
        text(&out)
    );

    let out = h.adopt(&[]);
    let said = text(&out);
    assert!(out.status.success(), "adopt: {said}");
    assert!(
        said.contains("Cilium with Ichor's Helm record in ichor-system"),
        "{said}"
    );
    assert!(
        said.contains(
            "Ichor is installed by Helm (release ichor, version v0.1.0); not touching it"
        ),
        "{said}"
    );
    assert!(!said.contains("installing Ichor"), "{said}");
    let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
        .get("lab")
        .await
        .unwrap();
    assert_eq!(
        cluster.spec.cni.tunnel,
        ichor_api::Tunnel::Geneve,
        "the tunnel is read back from the record"
    );
    assert_eq!(
        cluster.spec.cni.kube_proxy,
        ichor_api::KubeProxyMode::Enabled
    );
    assert!(
        cluster
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "CNIHandover" && c.status == "True")
    );
    let inst = h
        .installation()
        .await
        .expect("the controller created the IchorInstallation");
    assert_eq!(inst.spec.deployment.manager, Manager::Helm);
    assert!(!h.installer_deployment().await);
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 2);
    assert!(
        machines.items.iter().all(|m| !m.spec.hold),
        "holds released"
    );
}

/// Covers: R4.1, R4.3a, R4.3b, R4.3d, R4.6a, R4.6b, R4.5, R11.7 (kind `ichor` refused on a Helm install, the command printed)
///
/// F1 (with the hands-off Cilium of the lab): `helm install` (helm v3) of the
/// packaged chart creates Ichor; `ichor adopt --cni-unmanaged` finds it by
/// its Helm record, skips the install step, creates no IchorInstallation,
/// applies nothing to ichor-system by server-side apply, prints the policy
/// advice, and registers the cluster with its holds released. `ichor
/// upgrade ichor` is refused by the chart's controller with the `helm
/// upgrade` command printed. `helm upgrade`
/// (helm v4, on v3's record) turns the policies on and keeps the webhook
/// certificate; `helm uninstall` keeps
/// the CRDs and every cluster object and does not touch Cilium.
///
/// The takeover of a foreign Cilium (adopt without --cni-unmanaged) needs the
/// ichor-cni Job, which is not built yet; this case uses the hands-off mode.
#[tokio::test(flavor = "multi_thread")]
async fn f1_helm_install_then_adopt_registers_and_uninstall_keeps_the_cluster() {
    let h = Harness::up(LabCni::Cilium).await;
    let archive = h.package(None);
    let out = h.install(Tool::Helm3, &archive, &[]);
    assert!(out.status.success(), "helm install: {}", text(&out));
    assert_eq!(h.crds_present().await, ichor_api::crds::all().len());
    let d = Api::<Deployment>::namespaced(h.client().await, NS)
        .get("ichor-controller")
        .await
        .unwrap();
    assert_eq!(
        d.metadata.labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "ichor"
    );

    let out = h.adopt(&["--cni-unmanaged"]);
    let said = text(&out);
    assert!(out.status.success(), "adopt: {said}");
    assert!(
        said.contains(
            "Ichor is installed by Helm (release ichor, version v0.1.0); not touching it"
        ),
        "{said}"
    );
    assert!(
        said.contains("set networkPolicy.cilium.enabled=true and run helm upgrade"),
        "{said}"
    );
    assert!(!said.contains("installing Ichor"), "{said}");
    h.assert_adopt_created_no_installation().await;
    assert!(
        h.applied_by_adopt().await.is_empty(),
        "{:?}",
        h.applied_by_adopt().await
    );
    assert!(!h.installer_deployment().await);
    assert_eq!(h.policies().await, 0);
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 2);
    assert!(
        machines.items.iter().all(|m| !m.spec.hold),
        "holds released"
    );
    // The chart's webhooks, with the chart's own failurePolicy (Fail), are
    // called through their Service; the chart's controller works as its
    // ServiceAccount.
    crate::common::assert_the_webhook_refuses_through_its_service(&h).await;
    crate::common::assert_the_controller_acts_as_its_service_account(&h).await;

    // Ichor's own upgrade on a Helm install: the chart's controller refuses
    // the TalosOperation of kind `ichor` at plan time, and the real `ichor
    // upgrade ichor` prints the `helm upgrade` command instead (R4.6a).
    let mut upgrade = h.ichor();
    upgrade
        .args([
            "upgrade",
            "ichor",
            "--cluster",
            "lab",
            "--to",
            "v0.2.0",
            "--name",
            "self",
        ])
        .args(["-n", NS, "--kubeconfig"])
        .arg(&h.lab.kubeconfig);
    let out = run(upgrade);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "helm upgrade ichor <chart> --namespace {NS} --version 0.2.0"
        )),
        "{said}\n{}",
        h.logs()
    );

    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(h.client().await, NS);
    let cert_before = secrets.get("ichor-webhook-tls").await.unwrap().data;
    let out = h.helm(
        Tool::Helm4,
        &[
            "upgrade",
            "ichor",
            archive.to_str().unwrap(),
            "--namespace",
            NS,
            "--reuse-values",
            "--set",
            "networkPolicy.cilium.enabled=true",
        ],
    );
    assert!(out.status.success(), "helm upgrade: {}", text(&out));
    assert_eq!(
        h.policies().await,
        1,
        "the upgrade turned Ichor's policies on"
    );
    assert_eq!(
        secrets.get("ichor-webhook-tls").await.unwrap().data,
        cert_before,
        "helm upgrade keeps the webhook's certificate"
    );

    let cilium_before = Api::<DaemonSet>::namespaced(h.client().await, "kube-system")
        .get("cilium")
        .await
        .unwrap();
    let out = h.helm(Tool::Helm4, &["uninstall", "ichor", "--namespace", NS]);
    assert!(out.status.success(), "helm uninstall: {}", text(&out));
    assert_eq!(
        h.crds_present().await,
        ichor_api::crds::all().len(),
        "the CRDs are kept"
    );
    assert!(
        Api::<TalosCluster>::namespaced(h.client().await, NS)
            .get_opt("lab")
            .await
            .unwrap()
            .is_some()
    );
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 2, "the cluster objects are kept");
    assert!(
        Api::<Deployment>::namespaced(h.client().await, NS)
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .is_none()
    );
    let cilium_after = Api::<DaemonSet>::namespaced(h.client().await, "kube-system")
        .get("cilium")
        .await
        .unwrap();
    assert_eq!(
        cilium_before.metadata.uid, cilium_after.metadata.uid,
        "Cilium is not touched"
    );
}

/// Covers: R4.3d, R2.1b
///
/// F2: a flannel cluster: `helm install`, then `ichor adopt --cni-unmanaged`:
/// the policy notice names why there are none (the gate is false: detected
/// CNI is flannel), and adopt applies nothing to ichor-system.
#[tokio::test(flavor = "multi_thread")]
async fn f2_flannel_helm_install_then_unmanaged_adopt_applies_nothing() {
    let h = Harness::up(LabCni::Flannel).await;
    let archive = h.package(None);
    let out = h.install(Tool::Helm3, &archive, &[]);
    assert!(out.status.success(), "helm install: {}", text(&out));
    let out = h.adopt(&["--cni-unmanaged"]);
    let said = text(&out);
    assert!(out.status.success(), "adopt: {said}");
    assert!(
        said.contains(
            "Ichor is installed by Helm (release ichor, version v0.1.0); not touching it"
        ),
        "{said}"
    );
    assert!(
        said.contains("not applying Ichor's Cilium network policies: detected CNI is flannel"),
        "{said}"
    );
    assert!(
        !said.contains("set networkPolicy.cilium.enabled=true"),
        "no Cilium, no advice to enable Cilium policies: {said}"
    );
    assert!(
        h.applied_by_adopt().await.is_empty(),
        "{:?}",
        h.applied_by_adopt().await
    );
    h.assert_adopt_created_no_installation().await;
    assert!(!h.installer_deployment().await);
    let cluster = Api::<TalosCluster>::namespaced(h.client().await, NS)
        .get("lab")
        .await
        .unwrap();
    assert_eq!(cluster.spec.cni.preset, ichor_api::CniPreset::Unmanaged);
}

/// Covers: R4.3c, R4.3e
///
/// F4: `--require-ichor` with no Ichor is refused ("install Ichor with Helm
/// first") with nothing written; a chart of another version than the CLI's is
/// refused with the `helm upgrade` command, nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn f4_version_skew_and_require_ichor_are_refused() {
    let h = Harness::up(LabCni::Flannel).await;
    let out = h.adopt(&["--cni-unmanaged", "--require-ichor"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("install Ichor with Helm first"),
        "{}",
        text(&out)
    );
    assert!(
        Api::<Namespace>::all(h.client().await)
            .get_opt(NS)
            .await
            .unwrap()
            .is_none(),
        "nothing written"
    );
    assert_eq!(h.crds_present().await, 0, "nothing written");

    let archive = h.package(Some(("0.0.9", "v0.0.9")));
    let out = h.install(Tool::Helm4, &archive, &[]);
    assert!(out.status.success(), "helm install: {}", text(&out));
    let out = h.adopt(&["--cni-unmanaged"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("ichor adopt refused; nothing was written"),
        "{said}"
    );
    assert!(
        said.contains("Ichor v0.0.9 is installed by Helm (release ichor) but this ichor is v0.1.0"),
        "{said}"
    );
    assert!(
        said.contains("helm upgrade ichor oci://ghcr.io/maeshinshin/charts/ichor --version 0.1.0 --namespace ichor-system --reuse-values"),
        "{said}"
    );
    assert!(
        Api::<TalosCluster>::namespaced(h.client().await, NS)
            .get_opt("lab")
            .await
            .unwrap()
            .is_none()
    );
}

/// Covers: R4.3a, R4.3c, R4.6a, R4.6b, R5.2
///
/// After `helm upgrade`, adopt checks the version of the chart now deployed,
/// not the IchorInstallation's `spec.version`, which the controller wrote
/// once when it created the object (and never changes): an Ichor installed at
/// v0.0.9 is refused, and the same install upgraded to the CLI's version with
/// `helm upgrade` is accepted. After `helm uninstall` (which keeps the CRDs
/// and so the object) adopt refuses instead of registering a cluster that no
/// controller would manage.
#[tokio::test(flavor = "multi_thread")]
async fn after_helm_upgrade_adopt_checks_the_deployed_chart_version() {
    let h = Harness::up(LabCni::Flannel).await;
    let old = h.package(Some(("0.0.9", "v0.0.9")));
    let out = h.install(Tool::Helm3, &old, &[]);
    assert!(out.status.success(), "helm install: {}", text(&out));
    // What the v0.0.9 controller would have created (R5.2).
    let mut inst = IchorInstallation::new(
        "ichor",
        ichor_api::IchorInstallationSpec {
            version: "v0.0.9".into(),
            deployment: ichor_api::DeploymentSpec {
                manager: Manager::Helm,
            },
            installer_repository: None,
        },
    );
    inst.metadata.namespace = Some(NS.into());
    let api = Api::<IchorInstallation>::namespaced(h.client().await, NS);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match api.create(&Default::default(), &inst).await {
            Ok(_) => break,
            // The chart's controller created it first: what a v0.0.9 one writes.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                api.patch(
                    "ichor",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(serde_json::json!({"spec": {"version": "v0.0.9"}})),
                )
                .await
                .expect("the IchorInstallation at v0.0.9");
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "creating the IchorInstallation: {e}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }

    let out = h.adopt(&["--cni-unmanaged"]);
    assert!(!out.status.success());
    assert!(
        text(&out)
            .contains("Ichor v0.0.9 is installed by Helm (release ichor) but this ichor is v0.1.0"),
        "{}",
        text(&out)
    );

    let current = h.package(None);
    let out = h.helm(
        Tool::Helm4,
        &[
            "upgrade",
            "ichor",
            current.to_str().unwrap(),
            "--namespace",
            NS,
            "--reuse-values",
        ],
    );
    assert!(out.status.success(), "helm upgrade: {}", text(&out));
    let out = h.adopt(&["--cni-unmanaged"]);
    let said = text(&out);
    assert!(out.status.success(), "adopt after helm upgrade: {said}");
    assert!(
        said.contains(
            "Ichor is installed by Helm (release ichor, version v0.1.0); not touching it"
        ),
        "{said}"
    );
    assert_eq!(
        h.installation().await.unwrap().spec.version,
        "v0.0.9",
        "adopt does not rewrite the IchorInstallation"
    );
    assert!(h.applied_by_adopt().await.is_empty());

    // helm uninstall keeps the CRDs and so the IchorInstallation (manager
    // helm): adopt must not take that for a running Ichor.
    let out = h.helm(Tool::Helm4, &["uninstall", "ichor", "--namespace", NS]);
    assert!(out.status.success(), "helm uninstall: {}", text(&out));
    assert!(h.installation().await.is_some());
    let out = h.adopt(&["--cni-unmanaged"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("IchorInstallation ichor-system/ichor says Ichor v0.0.9 is managed by Helm, but no Helm release of the chart ichor is deployed"),
        "{said}"
    );
    assert!(
        said.contains(
            "helm install ichor oci://ghcr.io/maeshinshin/charts/ichor --namespace ichor-system"
        ),
        "{said}"
    );
    assert!(
        !h.installer_deployment().await,
        "adopt did not install Ichor over Helm's object"
    );
}
