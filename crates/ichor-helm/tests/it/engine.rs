//! The release engine against a real kube-apiserver + etcd, with records
//! read back by the real helm v3 and v4.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use ichor_helm::{ApplyOptions, Error, Status};
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const HELMS: [Tool; 2] = [Tool::Helm3, Tool::Helm4];

/// Records written by Ichor, with the release namespace apart from the
/// storage namespace, read by real helm v3 and v4: list, status, history,
/// get values, get manifest. Upgrade supersedes.
/// Covers: R4.4d (the record lives apart from the release namespace)
#[tokio::test]
async fn records_written_by_ichor_are_read_by_real_helm() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let rel_ns = env.namespace("rel").await;
    let home = HelmHome::new();
    let engine = engine(&store, &home).await;

    let v1 = engine
        .install(
            &request("demo", &rel_ns, json!({"greeting": "hi"})),
            &no_wait(),
        )
        .await
        .unwrap();
    assert_eq!((v1.version, v1.status()), (1, Status::Deployed));
    let v2 = engine
        .upgrade(
            &request("demo", &rel_ns, json!({"greeting": "hallo"})),
            &no_wait(),
        )
        .await
        .unwrap();
    assert_eq!((v2.version, v2.status()), (2, Status::Deployed));
    assert_eq!(v2.apply_method.as_deref(), Some("ssa"));

    for tool in HELMS {
        let list = home.json(tool, &["list", "--namespace", &store]);
        let row = &list.as_array().unwrap()[0];
        assert_eq!(row["name"], "demo", "{tool:?}: {list}");
        assert_eq!(row["namespace"], rel_ns.as_str(), "{tool:?}");
        assert_eq!(row["revision"], "2", "{tool:?}");
        assert_eq!(row["status"], "deployed", "{tool:?}");
        assert_eq!(row["chart"], "demo-0.1.0", "{tool:?}");

        let status = home.json(tool, &["status", "demo", "--namespace", &store]);
        assert_eq!(status["version"], 2, "{tool:?}");
        assert_eq!(status["namespace"], rel_ns.as_str(), "{tool:?}");
        assert_eq!(status["info"]["status"], "deployed", "{tool:?}");

        let history = home.json(tool, &["history", "demo", "--namespace", &store]);
        let h: Vec<(u64, String)> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["revision"].as_u64().unwrap(),
                    r["status"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            h,
            vec![(1, "superseded".into()), (2, "deployed".into())],
            "{tool:?}"
        );

        let values = home.json(tool, &["get", "values", "demo", "--namespace", &store]);
        assert_eq!(values, json!({"greeting": "hallo"}), "{tool:?}");
        let values1 = home.json(
            tool,
            &[
                "get",
                "values",
                "demo",
                "--namespace",
                &store,
                "--revision",
                "1",
            ],
        );
        assert_eq!(values1, json!({"greeting": "hi"}), "{tool:?}");

        let manifest = home.run(tool, &["get", "manifest", "demo", "--namespace", &store]);
        assert!(
            manifest.contains("name: demo-config"),
            "{tool:?}: {manifest}"
        );
        // In the release namespace helm finds nothing: the record is elsewhere.
        let (ok, _, _) = home.try_run(tool, &["status", "demo", "--namespace", &rel_ns]);
        assert!(!ok, "{tool:?} found a record in the release namespace");
    }

    // The objects carry Helm's ownership metadata, with the release namespace.
    let client = env.client().await;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &rel_ns)
        .get("demo-config")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["greeting"], "hallo");
    let labels = cm.metadata.labels.unwrap();
    let ann = cm.metadata.annotations.unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(ann["meta.helm.sh/release-name"], "demo");
    assert_eq!(ann["meta.helm.sh/release-namespace"], rel_ns.as_str());
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|f| {
            (f.operation.as_deref() == Some("Apply")).then(|| f.manager.unwrap_or_default())
        })
        .collect();
    assert_eq!(managers, vec!["ichor".to_string()]);
    // The upgrade was rendered as an upgrade of the recorded release.
    let seen: serde_json::Value =
        serde_json::from_str(&cm_release_json(&client, &rel_ns).await).unwrap();
    assert_eq!(
        seen,
        json!({"isUpgrade": true, "isInstall": false, "revision": 2, "namespace": rel_ns})
    );
    // A cluster-scoped object of the chart.
    Api::<ClusterRole>::all(client)
        .get(&format!("demo-{rel_ns}"))
        .await
        .unwrap();
}

/// Records written by real helm (v3 and v4) are read by Ichor, and Ichor
/// upgrades them: the helm-written revision becomes superseded.
#[tokio::test]
async fn records_written_by_real_helm_are_read_and_upgraded() {
    let env = TestEnv::shared();
    for tool in HELMS {
        let ns = env.namespace("helmwrote").await;
        let home = HelmHome::new();
        let chart = demo_chart();
        home.run(
            tool,
            &[
                "install",
                "demo",
                chart.to_str().unwrap(),
                "--namespace",
                &ns,
                "--set",
                "greeting=from-helm",
            ],
        );
        let engine = engine(&ns, &home).await;
        let rel = engine.status("demo").await.unwrap().expect("helm's record");
        assert_eq!(rel.version, 1, "{tool:?}");
        assert_eq!(rel.status(), Status::Deployed, "{tool:?}");
        assert_eq!(rel.namespace, ns, "{tool:?}");
        assert_eq!(
            rel.config.as_ref().unwrap()["greeting"],
            "from-helm",
            "{tool:?}"
        );
        assert_eq!(rel.chart_version(), Some("0.1.0"));
        assert!(rel.manifest.contains("demo-config"));
        // The deployed revision, found by the status label helm wrote.
        let deployed = engine.deployed("demo").await.unwrap();
        assert_eq!(deployed.as_ref(), Some(&rel), "{tool:?}");

        let up = engine
            .upgrade(
                &request("demo", &ns, json!({"greeting": "from-ichor"})),
                &no_wait(),
            )
            .await
            .unwrap();
        assert_eq!(up.version, 2);
        let h: Vec<Status> = engine
            .history("demo")
            .await
            .unwrap()
            .iter()
            .map(|r| r.status())
            .collect();
        assert_eq!(h, vec![Status::Superseded, Status::Deployed], "{tool:?}");
        let status = home.json(tool, &["status", "demo", "--namespace", &ns]);
        assert_eq!(status["version"], 2, "{tool:?}");
        let deployed = engine.deployed("demo").await.unwrap();
        assert_eq!(deployed.map(|r| r.version), Some(2), "{tool:?}");
        // A deployed record whose status label is gone (another tool's
        // write) is still found: the whole history is read then.
        let secrets = Api::<Secret>::namespaced(env.client().await, &ns);
        secrets
            .patch(
                "sh.helm.release.v1.demo.v2",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"status": null}}})),
            )
            .await
            .unwrap();
        let deployed = engine.deployed("demo").await.unwrap();
        assert_eq!(deployed.map(|r| r.version), Some(2), "{tool:?}");
    }
}

/// An object that left the chart is deleted; one marked
/// `helm.sh/resource-policy: keep` stays.
#[tokio::test]
async fn upgrade_prunes_objects_that_left_the_chart_and_honours_keep() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("prune").await;
    let home = HelmHome::new();
    let engine = engine(&store, &home).await;
    let cms = Api::<ConfigMap>::namespaced(env.client().await, &ns);

    engine
        .install(
            &request("demo", &ns, json!({"extra": true, "kept": true})),
            &no_wait(),
        )
        .await
        .unwrap();
    assert!(cms.get_opt("demo-extra").await.unwrap().is_some());
    assert!(cms.get_opt("demo-kept").await.unwrap().is_some());

    engine
        .upgrade(
            &request("demo", &ns, json!({"extra": false, "kept": false})),
            &no_wait(),
        )
        .await
        .unwrap();
    // Background deletion of a ConfigMap has no finalizers: it is gone at once.
    assert!(
        cms.get_opt("demo-extra").await.unwrap().is_none(),
        "demo-extra was not pruned"
    );
    assert!(
        cms.get_opt("demo-kept").await.unwrap().is_some(),
        "demo-kept was deleted despite keep"
    );
    assert!(cms.get_opt("demo-config").await.unwrap().is_some());
}

/// An existing DaemonSet without Helm's metadata is refused without take
/// ownership (nothing applied, revision failed), and adopted with it.
/// Covers: R2.0 (takeover of an existing Cilium works through take ownership)
#[tokio::test]
async fn take_ownership_adopts_an_existing_daemonset() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("adopt").await;
    let client = env.client().await;
    let dss = Api::<DaemonSet>::namespaced(client.clone(), &ns);
    let foreign: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "demo", "labels": {"installed-by": "someone-else"}},
        "spec": {"selector": {"matchLabels": {"app": "demo"}}, "template": {
            "metadata": {"labels": {"app": "demo"}},
            "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.9"}]}}}
    }))
    .unwrap();
    let before = dss.create(&PostParams::default(), &foreign).await.unwrap();

    let home = HelmHome::new();
    let engine = engine(&store, &home).await;
    let req = request("demo", &ns, json!({"daemonset": true}));
    let err = engine.install(&req, &no_wait()).await.unwrap_err();
    assert!(matches!(err, Error::Ownership { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("DaemonSet.apps") && msg.contains("demo") && msg.contains("take ownership"),
        "{msg}"
    );
    assert_eq!(
        engine.status("demo").await.unwrap().unwrap().status(),
        Status::Failed
    );
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt("demo-config")
            .await
            .unwrap()
            .is_none(),
        "nothing may be applied when ownership fails"
    );

    let opts = ApplyOptions {
        take_ownership: true,
        ..no_wait()
    };
    let rel = engine.install_or_upgrade(&req, &opts).await.unwrap();
    assert_eq!((rel.version, rel.status()), (2, Status::Deployed));
    let after = dss.get("demo").await.unwrap();
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "adopted, not recreated"
    );
    assert_eq!(
        after.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "Helm"
    );
    assert_eq!(
        after.metadata.labels.as_ref().unwrap()["installed-by"],
        "someone-else"
    );
    let image = &after.spec.template.spec.unwrap().containers[0].image;
    assert_eq!(image.as_deref(), Some("registry.k8s.io/pause:3.10"));
}

/// The rollout wait is bounded, reports what it waits for, and ends when a
/// test (playing the kubelets) reports the DaemonSet rolled out.
/// Covers: R3.1 (bounded, says what is left)
#[tokio::test]
async fn rollout_wait_is_bounded_and_ends_when_status_is_patched() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("wait").await;
    let home = HelmHome::new();
    let engine = Arc::new(engine(&store, &home).await);
    let reports: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let sink = reports.clone();
    let opts = ApplyOptions {
        wait: true,
        timeout: Duration::from_secs(2),
        on_wait: Some(Arc::new(move |lines: &[String]| {
            sink.lock().unwrap().push(lines.to_vec())
        })),
        ..no_wait()
    };
    let req = request("demo", &ns, json!({"daemonset": true}));
    let err = engine.install(&req, &opts).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{msg}");
    assert!(
        msg.contains(&format!("DaemonSet.apps {ns}/demo: no status reported yet")),
        "{msg}"
    );
    assert!(
        !reports.lock().unwrap().is_empty(),
        "the wait reported nothing"
    );
    assert!(reports.lock().unwrap()[0][0].contains("DaemonSet.apps"));
    assert_eq!(
        engine.status("demo").await.unwrap().unwrap().status(),
        Status::Failed
    );

    // Again with a generous bound; the test marks the DaemonSet ready.
    let opts = ApplyOptions {
        timeout: Duration::from_secs(120),
        ..opts
    };
    let e = engine.clone();
    let req2 = request(
        "demo",
        &ns,
        json!({"daemonset": true, "greeting": "second"}),
    );
    let task = tokio::spawn(async move { e.upgrade(&req2, &opts).await });
    let client = env.client().await;
    let dss = Api::<DaemonSet>::namespaced(client.clone(), &ns);
    // Wait for the upgrade to apply the new generation, then report it ready.
    eventually(60, "the upgrade applied the DaemonSet", || {
        let dss = dss.clone();
        async move {
            dss.get("demo")
                .await
                .ok()
                .and_then(|d| d.metadata.generation)
                == Some(2)
        }
    })
    .await;
    mark_daemonset_ready(&client, &ns, "demo").await;
    let rel = task.await.unwrap().unwrap();
    assert_eq!((rel.version, rel.status()), (2, Status::Deployed));
}

/// Hardware case E5 at this layer: the operation dies after its pending
/// record is written and before it is deployed. Without the exclusive
/// option a young pending record is "another operation is in progress";
/// with it the record is repaired and the rerun finishes as an upgrade
/// (v1 superseded, v2 deployed, no uninstall, objects intact).
/// Covers: R1.7c, R5.6
#[tokio::test]
async fn pending_record_left_by_a_killed_operation_is_repaired() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("e5").await;
    let home = HelmHome::new();
    let engine = Arc::new(engine(&store, &home).await);
    let client = env.client().await;
    let req = request("demo", &ns, json!({"daemonset": true}));

    // The first run blocks in the rollout wait (no kubelet); kill it there.
    let opts = ApplyOptions {
        wait: true,
        timeout: Duration::from_secs(600),
        ..no_wait()
    };
    let (e, r, o) = (engine.clone(), req.clone(), opts.clone());
    let task = tokio::spawn(async move { e.install(&r, &o).await });
    let dss = Api::<DaemonSet>::namespaced(client.clone(), &ns);
    eventually(60, "the install applied the DaemonSet", || {
        let dss = dss.clone();
        async move { dss.get_opt("demo").await.ok().flatten().is_some() }
    })
    .await;
    task.abort();
    let _ = task.await;
    let uid = dss.get("demo").await.unwrap().metadata.uid;
    let v1 = engine.status("demo").await.unwrap().unwrap();
    assert_eq!((v1.version, v1.status()), (1, Status::PendingInstall));

    // A rerun without the lock: the record is young, so another operation may own it.
    let err = engine
        .install_or_upgrade(&req, &no_wait())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InProgress { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("another operation is in progress since"),
        "{err}"
    );
    for tool in HELMS {
        let history = home.json(tool, &["history", "demo", "--namespace", &store]);
        assert_eq!(history[0]["status"], "pending-install", "{tool:?}");
    }

    // The rerun holding the lock repairs it and finishes as an upgrade.
    let exclusive = ApplyOptions {
        exclusive: true,
        ..no_wait()
    };
    let v2 = engine.install_or_upgrade(&req, &exclusive).await.unwrap();
    assert_eq!((v2.version, v2.status()), (2, Status::Deployed));
    let history = engine.history("demo").await.unwrap();
    assert_eq!(history[0].status(), Status::Superseded);
    assert!(
        history[0]
            .info
            .as_ref()
            .unwrap()
            .description
            .contains("Superseded")
    );
    assert_eq!(
        dss.get("demo").await.unwrap().metadata.uid,
        uid,
        "objects intact, no uninstall"
    );
    for tool in HELMS {
        let history = home.json(tool, &["history", "demo", "--namespace", &store]);
        let statuses: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, vec!["superseded", "deployed"], "{tool:?}");
    }
}

/// Without the exclusive option, a pending record older than the apply
/// timeout is repaired (marked failed) and the operation goes on.
/// Covers: R1.7c, R5.6
#[tokio::test]
async fn pending_record_older_than_the_timeout_is_repaired_without_the_lock() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("stale").await;
    let home = HelmHome::new();
    let engine = engine(&store, &home).await;
    let req = request("demo", &ns, json!({}));
    let v1 = engine.install(&req, &no_wait()).await.unwrap();
    // Leave a pending-upgrade v2 as a dead `helm upgrade` would.
    let mut pending = v1.clone();
    pending.version = 2;
    pending.set_status(Status::PendingUpgrade, "Preparing upgrade");
    let t = chrono::Utc::now() - chrono::Duration::seconds(120);
    pending.info.as_mut().unwrap().last_deployed = Some(t);
    engine.storage().create(&pending).await.unwrap();

    let young = ApplyOptions {
        timeout: Duration::from_secs(600),
        ..no_wait()
    };
    let err = engine.upgrade(&req, &young).await.unwrap_err();
    assert!(err.to_string().contains("in progress since"), "{err}");

    let old = ApplyOptions {
        timeout: Duration::from_secs(60),
        ..no_wait()
    };
    let v3 = engine.upgrade(&req, &old).await.unwrap();
    assert_eq!((v3.version, v3.status()), (3, Status::Deployed));
    let st: Vec<Status> = engine
        .history("demo")
        .await
        .unwrap()
        .iter()
        .map(|r| r.status())
        .collect();
    assert_eq!(
        st,
        vec![Status::Superseded, Status::Failed, Status::Deployed]
    );
}

/// At most 10 revisions are kept; rollback writes a new revision with an
/// earlier revision's values, readable by helm.
#[tokio::test]
async fn history_is_capped_at_ten_and_rollback_reapplies_an_earlier_revision() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("cap").await;
    let home = HelmHome::new();
    let engine = engine(&store, &home).await;
    for i in 1..=11 {
        engine
            .install_or_upgrade(
                &request("demo", &ns, json!({"greeting": format!("n{i}")})),
                &no_wait(),
            )
            .await
            .unwrap();
    }
    let versions: Vec<u32> = engine
        .history("demo")
        .await
        .unwrap()
        .iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(versions, (2..=11).collect::<Vec<_>>());

    let rb = engine.rollback("demo", 5, &no_wait()).await.unwrap();
    assert_eq!((rb.version, rb.status()), (12, Status::Deployed));
    assert_eq!(rb.info.as_ref().unwrap().description, "Rollback to 5");
    let cm = Api::<ConfigMap>::namespaced(env.client().await, &ns)
        .get("demo-config")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["greeting"], "n5");
    assert_eq!(engine.history("demo").await.unwrap().len(), 10);
    for tool in HELMS {
        let values = home.json(tool, &["get", "values", "demo", "--namespace", &store]);
        assert_eq!(values["greeting"], "n5", "{tool:?}");
    }
}

/// Bad input gets a clear error and nothing is written: a chart that fails
/// to render (helm's message is passed on), and a chart with lifecycle hooks
/// (Ichor does not run hooks), leave no record and no object.
#[tokio::test]
async fn render_failures_and_hooks_write_nothing() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("bad").await;
    let home = HelmHome::new();
    let engine = engine(&store, &home).await;

    let err = engine
        .install(
            &request("demo", &ns, json!({"refuse": "no greeting"})),
            &no_wait(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Render { .. }), "{err}");
    let said = ichor_api::error_text::chain(&err);
    assert!(
        said.contains("demo refuses to render: no greeting"),
        "{said}"
    );

    let err = engine
        .install(&request("demo", &ns, json!({"hook": true})), &no_wait())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::HooksUnsupported { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("Job demo-hook (post-install,post-upgrade)"),
        "{err}"
    );

    let err = engine
        .install(
            &request("demo", &ns, json!(["not", "a", "map"])),
            &no_wait(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ValuesNotAMap { .. }), "{err}");

    assert!(engine.history("demo").await.unwrap().is_empty());
    let cms = Api::<ConfigMap>::namespaced(env.client().await, &ns);
    assert!(cms.get_opt("demo-config").await.unwrap().is_none());
}

/// Rendering works with helm v3 too, installs and upgrades (it needs the
/// cluster for `--dry-run=client`; see ADR 0005), and a release cannot move
/// namespace.
#[tokio::test]
async fn helm_v3_renders_too_and_the_release_namespace_is_fixed() {
    let env = TestEnv::shared();
    let store = env.namespace("store").await;
    let ns = env.namespace("v3").await;
    let home = HelmHome::new();
    let engine = ichor_helm::Engine::new(env.client().await, &store, home.renderer(Tool::Helm3));
    let rel = engine
        .install(&request("demo", &ns, json!({"greeting": "v3"})), &no_wait())
        .await
        .unwrap();
    assert_eq!(rel.status(), Status::Deployed);
    assert_eq!(rel.chart_name(), Some("demo"));
    let status = home.json(Tool::Helm4, &["status", "demo", "--namespace", &store]);
    assert_eq!(status["namespace"], ns.as_str());

    let up = engine
        .upgrade(
            &request("demo", &ns, json!({"greeting": "v3b"})),
            &no_wait(),
        )
        .await
        .unwrap();
    assert_eq!(up.version, 2);
    let seen: serde_json::Value =
        serde_json::from_str(&cm_release_json(&env.client().await, &ns).await).unwrap();
    assert_eq!(seen["isUpgrade"], true);
    assert_eq!(seen["revision"], 2);

    let other = env.namespace("elsewhere").await;
    let err = engine
        .upgrade(&request("demo", &other, json!({})), &no_wait())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NamespaceMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&format!("use {ns}")), "{err}");
}

async fn cm_release_json(client: &kube::Client, ns: &str) -> String {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("demo-config")
        .await
        .unwrap();
    cm.data.unwrap()["release.json"].clone()
}
