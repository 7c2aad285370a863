//! `ichor cni bootstrap` and `ichor cni helm apply` on the lab, with the real
//! binary, the real helm and the stand-in Cilium chart.

use std::process::Output;

use ichor_testenv::Tool;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::common::{LabHarness, text};

async fn lab(kube_proxy: bool) -> LabHarness {
    LabHarness::up(|o| o.kube_proxy = kube_proxy).await
}

/// `ichor ARGS --kubeconfig … --helm … --cilium-chart …` against the lab.
fn ichor(h: &LabHarness, args: &[&str]) -> Output {
    h.ichor()
        .args(args)
        .arg("--kubeconfig")
        .arg(&h.lab.kubeconfig)
        .arg("--helm")
        .arg(Tool::Helm3.path())
        .arg("--cilium-chart")
        .arg(h.cilium_chart())
        .output()
        .unwrap()
}

/// Covers: R4.4b, R4.4c, R4.4d
///
/// `ichor cni bootstrap` installs Ichor's Cilium (record in ichor-system,
/// objects in kube-system) and waits for the nodes; adopt afterwards finds
/// Ichor's record, reads the tunnel back and agrees with the Talos side.
#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_then_adopt_agrees_with_the_record() {
    let h = lab(false).await;
    let out = ichor(
        &h,
        &[
            "cni",
            "bootstrap",
            "--kube-proxy",
            "replaced",
            "--tunnel",
            "geneve",
            "--wait-timeout",
            "2m",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("every node is Ready"), "{}", text(&out));
    let record = ichor_cilium::deployed_release(h.lab.client().await, "ichor-system")
        .await
        .unwrap()
        .expect("Ichor's record");
    assert_eq!(record.namespace, "kube-system");

    let out = h.adopt(&[]).output().unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("Cilium with Ichor's Helm record in ichor-system"),
        "{said}"
    );
    assert!(
        said.contains("tunnel geneve, kube-proxy replaced"),
        "the tunnel is read back from the record: {said}"
    );
}

/// Covers: R4.4c
///
/// A bootstrap for the wrong kube-proxy mode is refused by adopt, naming the fix.
#[tokio::test(flavor = "multi_thread")]
async fn adopt_refuses_a_bootstrap_that_disagrees_with_talos() {
    let h = lab(true).await;
    let out = ichor(
        &h,
        &[
            "cni",
            "bootstrap",
            "--kube-proxy",
            "replaced",
            "--wait-timeout",
            "2m",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = h.adopt(&[]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("installed for kube-proxy replaced, but Talos says kube-proxy is enabled. Run ichor cni bootstrap again with --kube-proxy enabled"),
        "{}",
        text(&out)
    );
}

/// Covers: R5.1, R1.7c
///
/// `ichor cni helm apply` (the ichor-cni Job's command) applies a
/// TalosCluster's effective values: nothing when they are deployed already, a
/// new revision when the cluster's values change.
#[tokio::test(flavor = "multi_thread")]
async fn helm_apply_follows_the_talos_cluster() {
    let h = lab(true).await;
    let client = h.lab.client().await;
    // The CRDs and a TalosCluster, as adopt writes them.
    ichor_adopt_run::apply_objects(
        &client,
        &ichor_adopt::install::install_objects("v0.1.0", "x")[..5],
    )
    .await
    .unwrap();
    let cluster: ichor_api::TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "lab", "namespace": "ichor-system"},
        "spec": {"endpoint": "https://127.0.0.1:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "lab-talos-secrets"}, "cni": {"preset": "cilium", "kubeProxy": "enabled"}}
    }))
    .unwrap();
    let clusters: Api<ichor_api::TalosCluster> = Api::namespaced(client.clone(), "ichor-system");
    // Accepted once the API server serves the new CRD.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while let Err(e) = clusters.create(&Default::default(), &cluster).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the TalosCluster was never created: {e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    let out = ichor(&h, &["cni", "helm", "apply", "--cluster", "lab"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("deployed at revision 1"),
        "{}",
        text(&out)
    );
    let out = ichor(&h, &["cni", "helm", "apply", "--cluster", "lab"]);
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));

    clusters
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"cni": {"cilium": {"values": {"debug": {"enabled": true}}}}}})),
        )
        .await
        .unwrap();
    let out = ichor(&h, &["cni", "helm", "apply", "--cluster", "lab"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("deployed at revision 2"),
        "{}",
        text(&out)
    );
    let record = ichor_cilium::deployed_release(client, "ichor-system")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.config.unwrap()["debug"]["enabled"], true);
}

/// Covers: R5.6, R5.1
///
/// Hand-over when the release is off the cluster's values: the controller
/// starts the ichor-cni Job; a failed Job is reported (CNIHandover=False,
/// JobFailed) and deleted, and a new attempt starts after a back-off; once the cause is gone
/// the release is deployed at the hash and CNIHandover=True.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_cni_job_is_retried_until_the_hand_over_completes() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::batch::v1::Job;
    use std::time::Duration;

    let h = LabHarness::up(|o| o.cni = ichor_lab::LabCni::Cilium).await;
    let client = h.lab.client().await;
    // A Cilium operator whose selector the chart cannot take over: every Job fails.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    deployments
        .delete("cilium-operator", &Default::default())
        .await
        .unwrap();
    let odd: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cilium-operator", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"odd": "selector"}},
            "template": {"metadata": {"labels": {"odd": "selector"}},
                "spec": {"hostNetwork": true, "containers": [{"name": "operator", "image": "quay.io/cilium/operator-generic:v1.18.5"}]}}}
    }))
    .unwrap();
    deployments.create(&Default::default(), &odd).await.unwrap();

    // Ichor installed as adopt installs it: the lab runs its controller.
    ichor_adopt_run::install_ichor(&client, "v0.1.0", crate::common::CONTROLLER_IMAGE)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cluster: ichor_api::TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "lab", "namespace": "ichor-system"},
        "spec": {"endpoint": "https://127.0.0.1:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "lab-talos-secrets"}, "cni": {"preset": "cilium", "kubeProxy": "enabled"}}
    }))
    .unwrap();
    let clusters: Api<ichor_api::TalosCluster> = Api::namespaced(client.clone(), "ichor-system");
    // Accepted once the installed controller serves its webhooks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while let Err(e) = clusters.create(&Default::default(), &cluster).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the TalosCluster was never admitted: {e}\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let handover = |c: &ichor_api::TalosCluster| {
        c.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "CNIHandover")
                .cloned()
        })
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), "ichor-system");
    let mut job_uids = std::collections::BTreeSet::new();
    let mut saw_failed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !(saw_failed && job_uids.len() >= 2) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed Job followed by a new attempt; Jobs {job_uids:?}\n{}",
            h.logs()
        );
        for j in jobs.list(&Default::default()).await.unwrap().items {
            job_uids.insert(j.metadata.uid.unwrap_or_default());
        }
        let c = clusters.get("lab").await.unwrap();
        if let Some(cond) = handover(&c)
            && cond.reason == "JobFailed"
        {
            // Reported while it fails, and while the back-off before the
            // next attempt runs.
            assert!(
                cond.message.contains("a new attempt starts in")
                    || cond.message.contains("the next attempt starts at"),
                "{}",
                cond.message
            );
            saw_failed = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The cause goes away: the next attempt takes Cilium over.
    deployments
        .delete("cilium-operator", &Default::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let c = clusters.get("lab").await.unwrap();
        if handover(&c).is_some_and(|c| c.status == "True") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "hand-over never completed: {:?}\n{}",
            handover(&c),
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let record = ichor_cilium::deployed_release(client, "ichor-system")
        .await
        .unwrap()
        .expect("Ichor's record");
    assert_eq!(record.namespace, "kube-system");
}
