//! The controller's own status writes, judged by kstatus
//! (sigs.k8s.io/cli-utils, through tools/testbin.sh's go-peers): what
//! Flux's `wait` and Helm 4's `--wait` would say of Ichor's objects.

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::*;
use ichor_api::conditions::flux;

/// kstatus's verdict on each object, as read from the API server now; each
/// also keeps Flux's checker rules.
fn kstatus(objects: &[serde_json::Value]) -> Vec<String> {
    for o in objects {
        let status = &o["status"];
        let cs: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> =
            serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
        let broken = flux::ichor_violations(
            o["metadata"]["generation"].as_i64(),
            status["observedGeneration"].as_i64(),
            &cs,
        );
        assert!(broken.is_empty(), "{}: {broken:?}", o["kind"]);
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let mut child = Command::new(Tool::GoPeers.path())
        .arg("kstatus")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("go-peers runs (tools/testbin.sh builds it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(list.to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("go-peers kstatus");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON verdict");
            v["status"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

fn value(o: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(o).expect("json")
}

/// With the controller running on emulated nodes: a released machine it
/// has read is Current; the cluster, its machine Ready, is InProgress while
/// its Cilium hand-over waits for the release and the DaemonSet; an
/// operation whose node comes back on its old version is Failed. (The
/// hand-over's end, Current, is judged in ichor-api's gitops test: here the
/// shared API server's Nodes, which other tests add, change the release's
/// desired values under it.)
/// Covers: R17.1c
#[tokio::test]
async fn kstatus_judges_what_the_controller_writes() {
    let s = setup("op-kstatus", &[("w-1", "worker")], &[], None, quick()).await;
    let clusters = Api::<TalosCluster>::namespaced(s.client.clone(), &s.ns);
    let machines = Api::<TalosMachine>::namespaced(s.client.clone(), &s.ns);
    let reconciling = |c: &TalosCluster| {
        c.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::RECONCILING))
    };
    wait_for("w-1 Ready and the hand-over under way", || async {
        let m = machines.get("w-1").await.unwrap();
        let ready = m
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::READY));
        ready && reconciling(&clusters.get("base").await.unwrap())
    })
    .await;
    let base = clusters.get("base").await.unwrap();
    let w1 = machines.get("w-1").await.unwrap();
    assert_eq!(
        kstatus(&[value(&base), value(&w1)]),
        ["InProgress", "Current"]
    );

    s.lab.emu.set_upgrade_fallback(0, true);
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "up", "talos-upgrade", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "up").await;
    assert_eq!(
        op.status.as_ref().unwrap().phase,
        Some(OperationPhase::Failed)
    );
    assert_eq!(kstatus(&[value(&op)]), ["Failed"]);
    s.running.stop().await.unwrap();
}
