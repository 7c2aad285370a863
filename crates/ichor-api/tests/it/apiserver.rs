//! The generated CRDs on a real kube-apiserver (the test control plane):
//! they are accepted and become Established, valid objects are stored, and
//! the CEL rules refuse invalid ones with the message a person reads.

use ichor_api::{
    CniPreset, CniSpec, IchorInstallation, IchorInstallationSpec, SecretsRef, TalosCluster,
    TalosClusterSpec, Tunnel,
};
use kube::api::{Api, PostParams};

async fn client_with_crds() -> kube::Client {
    let env = ichor_testenv::TestEnv::shared();
    let client = env.client().await;
    ichor_testenv::install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    client
}

fn cluster(name: &str) -> TalosCluster {
    TalosCluster::new(
        name,
        TalosClusterSpec {
            endpoint: "https://10.0.0.10:6443".into(),
            talos_version: "v1.12.1".into(),
            kubernetes_version: "v1.34.1".into(),
            network: Default::default(),
            cni: CniSpec::default(),
            secrets_ref: SecretsRef {
                name: "bundle".into(),
                key: None,
            },
            backup: None,
            maintenance_windows: Vec::new(),
            alertmanager: None,
            apply_mode: None,
            try_timeout: None,
            revisions_kept: None,
        },
    )
}

fn refusal(err: kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            status.message
        }
        other => panic!("expected the apiserver to refuse with 422, got {other}"),
    }
}

/// Covers: R1.4a
#[tokio::test]
async fn tunnel_is_immutable_once_set() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let api: Api<TalosCluster> = Api::namespaced(client, &ns);

    let created = api
        .create(&PostParams::default(), &cluster("c1"))
        .await
        .expect("a valid TalosCluster is stored");
    assert_eq!(
        created.spec.cni.tunnel,
        Tunnel::Vxlan,
        "the API default tunnel is vxlan"
    );
    assert_eq!(created.spec.cni.preset, CniPreset::Cilium);

    let mut changed = created.clone();
    changed.spec.cni.tunnel = Tunnel::Geneve;
    let err = api
        .replace("c1", &PostParams::default(), &changed)
        .await
        .expect_err("tunnel change must be refused");
    let msg = refusal(err);
    assert!(
        msg.contains("spec.cni.tunnel is immutable once set"),
        "message: {msg}"
    );

    // Other fields stay editable.
    let mut other = created;
    other.spec.kubernetes_version = "v1.34.2".into();
    api.replace("c1", &PostParams::default(), &other)
        .await
        .expect("changing the Kubernetes version is allowed");
}

/// Covers: R1.4c
#[tokio::test]
async fn ichor_owned_cilium_values_are_refused() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let api: Api<TalosCluster> = Api::namespaced(client, &ns);

    let mut c = cluster("owned");
    c.spec.cni.cilium = Some(ichor_api::CiliumSpec {
        values: Some(serde_json::json!({"tunnelProtocol": "geneve", "hubble": {"enabled": true}})),
    });
    let msg = refusal(
        api.create(&PostParams::default(), &c)
            .await
            .expect_err("owned key must be refused"),
    );
    assert!(
        msg.contains("spec.cni.cilium.values must not set"),
        "message: {msg}"
    );

    c.spec.cni.cilium = Some(ichor_api::CiliumSpec {
        values: Some(serde_json::json!({"hubble": {"enabled": true}, "operator": {"replicas": 1}})),
    });
    let stored = api
        .create(&PostParams::default(), &c)
        .await
        .expect("user values without owned keys are stored");
    let values = stored
        .spec
        .cni
        .cilium
        .and_then(|c| c.values)
        .expect("values kept");
    assert_eq!(
        values["operator"]["replicas"], 1,
        "free-form values are kept as given"
    );
}

/// An unknown preset is refused by the schema's enum.
#[tokio::test]
async fn unknown_preset_is_refused() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let api: Api<TalosCluster> = Api::namespaced(client, &ns);
    let mut obj = serde_json::to_value(cluster("badpreset")).expect("json");
    obj["spec"]["cni"]["preset"] = "calico".into();
    let obj: kube::api::DynamicObject = serde_json::from_value(obj).expect("dynamic");
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(
        api.into_client(),
        &ns,
        &kube::api::ApiResource::erase::<TalosCluster>(&()),
    );
    let msg = refusal(
        dynamic
            .create(&PostParams::default(), &obj)
            .await
            .expect_err("unknown preset"),
    );
    assert!(msg.contains("spec.cni.preset"), "message: {msg}");
}

/// The IchorInstallation is a singleton named ichor.
#[tokio::test]
async fn installation_is_a_singleton() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let api: Api<IchorInstallation> = Api::namespaced(client, &ns);
    let spec = IchorInstallationSpec {
        version: "v0.1.0".into(),
        deployment: Default::default(),
        installer_repository: None,
    };
    let msg = refusal(
        api.create(
            &PostParams::default(),
            &IchorInstallation::new("other", spec.clone()),
        )
        .await
        .expect_err("a second name is refused"),
    );
    assert!(msg.contains("must be named ichor"), "message: {msg}");
    api.create(
        &PostParams::default(),
        &IchorInstallation::new(ichor_api::INSTALLATION_NAME, spec),
    )
    .await
    .expect("the singleton is stored");
}

/// A TalosMachine cannot move to another cluster or change its role, and is
/// held unless told otherwise; a TalosOperation's spec is fixed and an
/// upgrade names its version.
/// Covers: R1.7a
#[tokio::test]
async fn machine_and_operation_rules() {
    use ichor_api::{
        ClusterRef, MachineRole, OperationKind, OperationTarget, TalosMachine, TalosOperation,
        TalosOperationSpec,
    };
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;

    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), &ns);
    let raw: TalosMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "cp-1"},
        "spec": {"clusterRef": {"name": "c1"}, "role": "controlplane", "address": "10.0.0.2"}
    }))
    .expect("machine");
    let stored = machines
        .create(&PostParams::default(), &raw)
        .await
        .expect("a valid TalosMachine is stored");
    assert!(stored.spec.hold, "machines are held unless released");
    let mut moved = stored.clone();
    moved.spec.cluster_ref = ClusterRef { name: "c2".into() };
    moved.spec.role = MachineRole::Worker;
    let msg = refusal(
        machines
            .replace("cp-1", &PostParams::default(), &moved)
            .await
            .expect_err("refused"),
    );
    assert!(
        msg.contains("spec.clusterRef is immutable") && msg.contains("spec.role is immutable"),
        "message: {msg}"
    );
    let mut released = stored;
    released.spec.hold = false;
    machines
        .replace("cp-1", &PostParams::default(), &released)
        .await
        .expect("releasing the hold is allowed");

    let ops: Api<TalosOperation> = Api::namespaced(client, &ns);
    let spec = TalosOperationSpec {
        kind: OperationKind::TalosUpgrade,
        target: OperationTarget {
            cluster_ref: ClusterRef { name: "c1".into() },
            machines: vec![],
        },
        version: None,
        concurrency: None,
        installer_image: None,
        dry_run: false,
        skip_backup: None,
        maintenance_windows: None,
        health_checks: Vec::new(),
        alertmanager: None,
        allow_downgrade: false,
    };
    let msg = refusal(
        ops.create(
            &PostParams::default(),
            &TalosOperation::new("up", spec.clone()),
        )
        .await
        .expect_err("refused"),
    );
    assert!(msg.contains("spec.version is required"), "message: {msg}");
    let with_version = TalosOperationSpec {
        version: Some("v1.12.2".into()),
        ..spec
    };
    let stored = ops
        .create(
            &PostParams::default(),
            &TalosOperation::new("up", with_version),
        )
        .await
        .expect("stored");
    let mut changed = stored;
    changed.spec.version = Some("v1.12.3".into());
    let msg = refusal(
        ops.replace("up", &PostParams::default(), &changed)
            .await
            .expect_err("refused"),
    );
    assert!(
        msg.contains("spec of a TalosOperation is immutable"),
        "message: {msg}"
    );
}

/// The API server itself refuses a TalosOperation version that is not a
/// version, and `allowDowngrade` on any kind but `ichor`.
/// Covers: R18.2
#[tokio::test]
async fn operation_versions_and_the_downgrade_flag_are_checked_by_the_api_server() {
    use ichor_api::{
        ClusterRef, OperationKind, OperationTarget, TalosOperation, TalosOperationSpec,
    };
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("op-version")
        .await;
    let ops: Api<TalosOperation> = Api::namespaced(client, &ns);
    let spec = |kind: OperationKind, version: &str, allow_downgrade: bool| TalosOperationSpec {
        kind,
        target: OperationTarget {
            cluster_ref: ClusterRef { name: "c1".into() },
            machines: vec![],
        },
        version: Some(version.into()),
        concurrency: None,
        installer_image: None,
        dry_run: false,
        skip_backup: None,
        maintenance_windows: None,
        health_checks: Vec::new(),
        alertmanager: None,
        allow_downgrade,
    };
    for (i, bad) in ["latest", "1.2.3", "v1.2", "v1.2.3;rm", "v1.2.3 "]
        .iter()
        .enumerate()
    {
        let msg = refusal(
            ops.create(
                &PostParams::default(),
                &TalosOperation::new(&format!("bad-{i}"), spec(OperationKind::Ichor, bad, false)),
            )
            .await
            .expect_err("refused"),
        );
        assert!(
            msg.contains("spec.version must look like v1.14.0"),
            "{bad}: {msg}"
        );
    }
    let msg = refusal(
        ops.create(
            &PostParams::default(),
            &TalosOperation::new(
                "talos-down",
                spec(OperationKind::TalosUpgrade, "v1.12.0", true),
            ),
        )
        .await
        .expect_err("refused"),
    );
    assert!(
        msg.contains("spec.allowDowngrade is only for kind ichor"),
        "{msg}"
    );
    for (name, version) in [("ok-1", "v0.1.0"), ("ok-2", "v1.14.0-rc.1")] {
        ops.create(
            &PostParams::default(),
            &TalosOperation::new(name, spec(OperationKind::Ichor, version, true)),
        )
        .await
        .expect("a version and the flag on kind ichor are stored");
    }
}

/// A recipient as age-keygen prints it (a real X25519 public key).
const RECIPIENT: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";

fn backup_spec() -> serde_json::Value {
    serde_json::json!({
        "destination": {"s3": {
            "endpoint": "https://s3.example:9000", "bucket": "ichor-backups",
            "credentialsSecretRef": {"name": "s3"}}},
        "recipients": [RECIPIENT],
        "schedule": {"cron": "30 2 * * *", "timeZone": "Europe/Berlin"},
        "retention": {"keepLast": 14, "maxAge": "30d"}
    })
}

/// The backup spec's schema rules, on the real API server: a valid spec is
/// stored with its defaults; a destination that is not exactly one kind,
/// no recipient, and a recipient that is not an age key are refused,
/// naming the field. (What CEL cannot read — the cron, the time zone, the
/// key's checksum, the retention age — the admission webhook refuses.)
/// Covers: R13.6
#[tokio::test]
async fn backup_spec_rules() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::erase::<TalosCluster>(&()),
    );
    let with_backup = |name: &str, backup: serde_json::Value| {
        let mut obj = serde_json::to_value(cluster(name)).expect("json");
        obj["spec"]["backup"] = backup;
        serde_json::from_value::<kube::api::DynamicObject>(obj).expect("dynamic")
    };
    let stored = dynamic
        .create(
            &PostParams::default(),
            &with_backup("backed-up", backup_spec()),
        )
        .await
        .expect("a valid backup spec is stored");
    let typed: TalosCluster = stored.try_parse().expect("typed");
    let backup = typed.spec.backup.expect("backup kept");
    assert_eq!(backup.destination.s3.expect("s3").region, "us-east-1");

    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "both",
            {
                let mut b = backup_spec();
                b["destination"]["volume"] = serde_json::json!({"claimName": "backups"});
                b
            },
            "exactly one of s3 or volume",
        ),
        (
            "neither",
            {
                let mut b = backup_spec();
                b["destination"] = serde_json::json!({});
                b
            },
            "exactly one of s3 or volume",
        ),
        (
            "no-recipient",
            {
                let mut b = backup_spec();
                b["recipients"] = serde_json::json!([]);
                b
            },
            "spec.backup.recipients",
        ),
        (
            "ssh-key",
            {
                let mut b = backup_spec();
                b["recipients"] = serde_json::json!([RECIPIENT, "ssh-ed25519 AAAAC3Nza"]);
                b
            },
            "spec.backup.recipients must be age X25519 recipients",
        ),
    ];
    for (name, backup, says) in cases {
        let msg = refusal(
            dynamic
                .create(&PostParams::default(), &with_backup(name, backup))
                .await
                .expect_err(name),
        );
        assert!(msg.contains(says), "{name}: message: {msg}");
    }
}

/// A TalosBackup's spec is a record of one request: immutable.
/// Covers: R13.1
#[tokio::test]
async fn a_backups_spec_is_immutable() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api")
        .await;
    let api: Api<ichor_api::TalosBackup> = Api::namespaced(client, &ns);
    let backup = ichor_api::TalosBackup::new(
        "one",
        ichor_api::TalosBackupSpec {
            cluster_ref: ichor_api::ClusterRef { name: "c".into() },
            reason: ichor_api::BackupReason::Manual,
            operation: None,
        },
    );
    let mut stored = api
        .create(&PostParams::default(), &backup)
        .await
        .expect("stored");
    stored.spec.cluster_ref.name = "other".into();
    let msg = refusal(
        api.replace("one", &PostParams::default(), &stored)
            .await
            .expect_err("changed spec"),
    );
    assert!(
        msg.contains("spec of a TalosBackup is immutable"),
        "message: {msg}"
    );
}

/// `applyMode` and `tryTimeout` as the API server stores and refuses them:
/// a Go duration from 1s to 10m; anything else is refused naming the field.
/// Covers: R16.3b
#[tokio::test]
async fn try_timeout_is_bounded_by_the_api_server() {
    let client = client_with_crds().await;
    let ns = ichor_testenv::TestEnv::shared()
        .namespace("ichor-api-try")
        .await;
    let api: Api<TalosCluster> = Api::namespaced(client, &ns);
    for (i, ok) in ["1s", "45s", "2m", "1m30s", "10m"].iter().enumerate() {
        let mut c = cluster(&format!("try-ok-{i}"));
        c.spec.apply_mode = Some(ichor_api::apply::ApplyMode::Try);
        c.spec.try_timeout = Some((*ok).into());
        let stored = api
            .create(&PostParams::default(), &c)
            .await
            .unwrap_or_else(|e| panic!("tryTimeout {ok} is stored: {e}"));
        assert_eq!(stored.spec.try_timeout.as_deref(), Some(*ok));
    }
    for (i, bad) in ["0s", "11m", "1h", "soon", "", "5"].iter().enumerate() {
        let mut c = cluster(&format!("try-bad-{i}"));
        c.spec.try_timeout = Some((*bad).into());
        let err = api
            .create(&PostParams::default(), &c)
            .await
            .expect_err("an out-of-bounds tryTimeout is refused");
        let msg = refusal(err);
        assert!(
            msg.contains("tryTimeout must be a duration from 1s to 10m"),
            "{bad}: {msg}"
        );
    }
}
