//! Ichor's Talos client against the emulator: the calls, node targeting,
//! timeouts and the errors that must be clear (and write nothing).

use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use ichor_talemu::{ClientCertSpec, Emulator, Fault, NodeSpec, WriteAction};
use ichor_talos_client::resources;
use ichor_talos_client::{
    ApplyMode, ApplyRequest, ClientIdentity, ClientOptions, MachineType, TalosClient,
    WatchEventType,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn one_cp() -> Emulator {
    Emulator::start(vec![NodeSpec::new("cp-1", crate::common::cp_v112())])
        .await
        .unwrap()
}

fn quick() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// Version and Hostname over mutual TLS with an Ed25519 admin certificate.
#[tokio::test(flavor = "multi_thread")]
async fn version_and_hostname() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let v = c.version("").await.unwrap();
    assert_eq!(v.tag, "v1.13.9");
    assert!(v.rbac);
    assert_eq!(c.hostname("").await.unwrap(), "cp-1");
    // The node's own address in `node` metadata is served locally.
    let v = c.version("127.0.0.1").await.unwrap();
    assert_eq!(v.tag, "v1.13.9");
}

/// The live config is the exact bytes the node runs; the typed COSI helpers
/// read machine type, version, node name, KubePrism and bootstrap manifests.
/// Covers: R1.3b, R1.3d, R1.4b
#[tokio::test(flavor = "multi_thread")]
async fn cosi_reads_of_a_v112_control_plane() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    assert_eq!(
        c.machine_config("").await.unwrap(),
        crate::common::cp_v112()
    );
    assert_eq!(c.machine_type("").await.unwrap(), MachineType::ControlPlane);
    assert_eq!(c.version_resource("").await.unwrap().version, "v1.13.9");
    assert_eq!(c.nodename("").await.unwrap().nodename, "cp-1");
    let kp = c
        .kubeprism_config("")
        .await
        .unwrap()
        .expect("KubePrism is enabled");
    assert_eq!(kp.port, 7445);
    assert_eq!(kp.host, "127.0.0.1");
    let status = c.kubeprism_status("").await.unwrap().unwrap();
    assert!(status.healthy);
    let bm = c.bootstrap_manifests_config("").await.unwrap().unwrap();
    assert_eq!(bm.cni_name, "flannel");
    assert!(bm.flannel_enabled);
    assert!(bm.proxy_enabled);
    assert_eq!(bm.pod_cid_rs, vec!["10.244.0.0/16"]);

    let defs = c
        .cosi_list("", "meta", resources::RESOURCE_DEFINITION.r#type)
        .await
        .unwrap();
    assert!(
        defs.iter()
            .any(|d| d.id == "machineconfigs.config.talos.dev")
    );
    let mc = c
        .cosi_get("", "config", resources::MACHINE_CONFIG.r#type, "v1alpha1")
        .await
        .unwrap();
    assert_eq!(mc.version, "1");
    assert_eq!(mc.phase, "running");
    assert_eq!(
        mc.annotations
            .get("talos.dev/yaml-spec")
            .map(String::as_str),
        Some("1")
    );
}

/// A v1.14-shape config (KubePrismConfig, KubeNetworkConfig documents) on a
/// v1.14 node: the resources follow the documents.
/// Covers: R1.3b, R1.3d
#[tokio::test(flavor = "multi_thread")]
async fn cosi_reads_of_a_v114_control_plane() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v114()).with_version("v1.14.0"),
    ])
    .await
    .unwrap();
    let c = emu.admin_client(0).unwrap();
    assert_eq!(c.version("").await.unwrap().tag, "v1.14.0");
    assert_eq!(
        c.machine_config("").await.unwrap(),
        crate::common::cp_v114()
    );
    let text = String::from_utf8(crate::common::cp_v114()).unwrap();
    let kp = c.kubeprism_config("").await.unwrap();
    assert_eq!(kp.is_some(), text.contains("kind: KubePrismConfig"));
    let bm = c.bootstrap_manifests_config("").await.unwrap().unwrap();
    let flannel = text.contains("kind: KubeFlannelCNIConfig");
    assert_eq!(bm.cni_name, if flannel { "flannel" } else { "none" });
}

/// A worker has no BootstrapManifestsConfig: the helper says `None`, not an error.
#[tokio::test(flavor = "multi_thread")]
async fn worker_has_no_bootstrap_manifests() {
    let emu = Emulator::start(vec![NodeSpec::new("w-1", crate::common::worker_v112())])
        .await
        .unwrap();
    let c = emu.admin_client(0).unwrap();
    assert_eq!(c.machine_type("").await.unwrap(), MachineType::Worker);
    assert!(c.bootstrap_manifests_config("").await.unwrap().is_none());
}

/// ApplyConfiguration: dry run writes nothing; no-reboot applies live and
/// persists; staged persists only; AUTO resolves as Talos v1.13 does.
#[tokio::test(flavor = "multi_thread")]
async fn apply_modes() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let original = crate::common::cp_v112();
    let changed = crate::common::edit(
        &original,
        "kubePrism:\n            enabled: true\n            port: 7445",
        "kubePrism:\n            enabled: true\n            port: 7446",
    );

    let mut dry = ApplyRequest::new(changed.clone(), ApplyMode::NoReboot);
    dry.dry_run = true;
    let r = c.apply_configuration("", &dry).await.unwrap();
    assert_eq!(r.mode, Some(ApplyMode::NoReboot));
    assert!(r.mode_details.starts_with("Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n"), "{}", r.mode_details);
    assert!(
        r.mode_details.contains("+            port: 7446"),
        "{}",
        r.mode_details
    );
    assert!(emu.writes().is_empty(), "a dry run writes nothing");
    assert_eq!(emu.active_config(0).unwrap(), original);

    let r = c
        .apply_configuration("", &ApplyRequest::new(changed.clone(), ApplyMode::NoReboot))
        .await
        .unwrap();
    assert_eq!(r.mode, Some(ApplyMode::NoReboot));
    assert_eq!(r.mode_details, "Applied configuration without a reboot");
    assert_eq!(c.machine_config("").await.unwrap(), changed);
    assert_eq!(c.kubeprism_config("").await.unwrap().unwrap().port, 7446);
    assert_eq!(emu.persistent_config(0).unwrap(), changed);

    // AUTO with a change that needs a reboot (machine.type) resolves to REBOOT on v1.13.
    let staged = crate::common::edit(&changed, "type: controlplane", "type: worker");
    let mut auto = ApplyRequest::new(staged.clone(), ApplyMode::Auto);
    auto.dry_run = true;
    let r = c.apply_configuration("", &auto).await.unwrap();
    assert_eq!(r.mode, Some(ApplyMode::Reboot));
    // NO_REBOOT refuses it.
    let err = c
        .apply_configuration("", &ApplyRequest::new(staged.clone(), ApplyMode::NoReboot))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(
        err.to_string()
            .contains("can't be applied in immediate mode"),
        "{err}"
    );

    let r = c
        .apply_configuration("", &ApplyRequest::new(staged.clone(), ApplyMode::Staged))
        .await
        .unwrap();
    assert_eq!(
        r.mode_details,
        "Staged configuration to be applied after the next reboot"
    );
    assert_eq!(c.machine_config("").await.unwrap(), changed);
    assert_eq!(c.persistent_machine_config("").await.unwrap(), staged);

    let writes = emu.writes();
    assert_eq!(writes.len(), 2);
    assert!(
        matches!(&writes[0].action, WriteAction::ApplyConfiguration { mode, .. } if mode == "no_reboot")
    );
    assert!(
        matches!(&writes[1].action, WriteAction::ApplyConfiguration { mode, .. } if mode == "staged")
    );
}

/// v1.14 rules: AUTO is always NO_REBOOT and REBOOT is refused.
#[tokio::test(flavor = "multi_thread")]
async fn apply_modes_of_v114() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_version("v1.14.0"),
    ])
    .await
    .unwrap();
    let c = emu.admin_client(0).unwrap();
    let other = crate::common::edit(
        &crate::common::cp_v112(),
        "type: controlplane",
        "type: worker",
    );
    let mut auto = ApplyRequest::new(other.clone(), ApplyMode::Auto);
    auto.dry_run = true;
    assert_eq!(
        c.apply_configuration("", &auto).await.unwrap().mode,
        Some(ApplyMode::NoReboot)
    );
    let err = c
        .apply_configuration("", &ApplyRequest::new(other, ApplyMode::Reboot))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented));
}

/// Try mode applies live and reverts after its timeout.
#[tokio::test(flavor = "multi_thread")]
async fn apply_try_reverts() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let original = crate::common::cp_v112();
    let changed = crate::common::edit(&original, "port: 7445", "port: 7447");
    let mut req = ApplyRequest::new(changed.clone(), ApplyMode::Try);
    req.try_timeout = Some(Duration::from_millis(400));
    let r = c.apply_configuration("", &req).await.unwrap();
    assert!(
        r.mode_details
            .ends_with("automatically reverted back in 0.4s"),
        "{}",
        r.mode_details
    );
    assert_eq!(c.machine_config("").await.unwrap(), changed);
    // Wait (bounded) for the revert.
    let mut reverted = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if c.machine_config("").await.unwrap() == original {
            reverted = true;
            break;
        }
    }
    assert!(reverted, "the try config was not reverted within 10s");
    assert!(
        emu.writes()
            .iter()
            .any(|w| w.action == WriteAction::TryRollback)
    );
}

/// Reboot: an actor id, a short outage, a new boot id, the staged config active.
#[tokio::test(flavor = "multi_thread")]
async fn reboot_applies_staged_config() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let boot = emu.boot_id(0);
    let staged = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7448");
    c.apply_configuration("", &ApplyRequest::new(staged.clone(), ApplyMode::Staged))
        .await
        .unwrap();
    let actor = c.reboot("").await.unwrap();
    assert_eq!(actor.len(), 36);
    // Wait (bounded) for the node to come back.
    let mut back = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if emu.boot_id(0) != boot && c.version("").await.is_ok() {
            back = true;
            break;
        }
    }
    assert!(back, "the node did not come back within 5s");
    assert_eq!(c.machine_config("").await.unwrap(), staged);
}

/// COSI Watch of one resource and of a kind: the current state first, then changes.
#[tokio::test(flavor = "multi_thread")]
async fn cosi_watch_sees_an_apply() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let k = resources::KUBEPRISM_CONFIG;
    let mut one = Box::pin(
        c.cosi_watch("", k.namespace, k.r#type, Some(k.id))
            .await
            .unwrap(),
    );
    let first = one.next().await.unwrap().unwrap();
    assert_eq!(first.event_type, WatchEventType::Created);
    let mut kind = Box::pin(c.cosi_watch("", k.namespace, k.r#type, None).await.unwrap());
    let e = kind.next().await.unwrap().unwrap();
    assert_eq!(e.event_type, WatchEventType::Created);
    let e = kind.next().await.unwrap().unwrap();
    assert_eq!(e.event_type, WatchEventType::Bootstrapped);

    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7449");
    c.apply_configuration("", &ApplyRequest::new(changed, ApplyMode::NoReboot))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), one.next())
        .await
        .expect("an event within 5s")
        .unwrap()
        .unwrap();
    assert_eq!(next.event_type, WatchEventType::Updated);
    let r = next.resource.unwrap();
    assert_eq!(r.version, "2");
    let spec: ichor_talos_client::proto::ichor::specs::KubePrismConfigSpec =
        r.decode_spec().unwrap();
    assert_eq!(spec.port, 7449);
    let next = tokio::time::timeout(Duration::from_secs(5), kind.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.event_type, WatchEventType::Updated);
}

/// Calls routed through a control-plane node with `node` metadata, concurrently
/// across nodes; a worker refuses to forward.
#[tokio::test(flavor = "multi_thread")]
async fn node_routing_and_concurrency() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(ip("127.0.0.11")),
        NodeSpec::new("w-1", crate::common::worker_v112()).with_address(ip("127.0.0.12")),
        NodeSpec::new("w-2", crate::common::worker_v112())
            .with_address(ip("127.0.0.13"))
            .with_version("v1.12.4"),
    ])
    .await
    .unwrap();
    let c = emu.admin_client(0).unwrap();
    let nodes: Vec<String> = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let results = c
        .on_nodes(&nodes, |c, node| async move { c.hostname(&node).await })
        .await;
    let names: Vec<String> = results.into_iter().map(|(_, r)| r.unwrap()).collect();
    assert_eq!(names, vec!["cp-1", "w-1", "w-2"]);
    assert_eq!(c.version("127.0.0.13").await.unwrap().tag, "v1.12.4");
    assert_eq!(c.machine_type("w-1").await.unwrap(), MachineType::Worker);

    let worker = emu.admin_client(1).unwrap();
    let err = worker.version("127.0.0.11").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied));
    assert_eq!(err.node(), Some("127.0.0.11"));
}

/// A slow node: the call times out and the error names the node and the call.
#[tokio::test(flavor = "multi_thread")]
async fn timeout_names_node_and_call() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(ip("127.0.0.21")),
        NodeSpec::new("w-1", crate::common::worker_v112()).with_address(ip("127.0.0.22")),
    ])
    .await
    .unwrap();
    emu.set_fault(1, Fault::Slow(Duration::from_secs(5)));
    let c = emu
        .client(
            0,
            &ClientCertSpec::admin(),
            ClientOptions {
                call_timeout: Duration::from_millis(300),
                ..ClientOptions::default()
            },
        )
        .unwrap();
    let err = c.version("127.0.0.22").await.unwrap_err();
    assert!(
        matches!(err, ichor_talos_client::Error::Timeout { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("127.0.0.22") && text.contains("Version"),
        "{text}"
    );
    // The other node still answers.
    assert_eq!(c.version("127.0.0.21").await.unwrap().tag, "v1.13.9");
}

/// A node that is down, and an unknown node: one clear error each.
#[tokio::test(flavor = "multi_thread")]
async fn down_and_unknown_nodes() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(ip("127.0.0.31")),
        NodeSpec::new("w-1", crate::common::worker_v112()).with_address(ip("127.0.0.32")),
    ])
    .await
    .unwrap();
    let c = emu.client(0, &ClientCertSpec::admin(), quick()).unwrap();
    emu.set_fault(1, Fault::Down);
    let err = c.version("127.0.0.32").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(
        err.to_string().starts_with("node 127.0.0.32: Version:"),
        "{err}"
    );
    let err = c.machine_config("10.9.9.9").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(
        err.to_string()
            .contains("node 10.9.9.9: COSI Get MachineConfigs.config.talos.dev/v1alpha1"),
        "{err}"
    );
    emu.set_fault(
        1,
        Fault::Refuse(tonic::Code::Unavailable, "maintenance window".into()),
    );
    let err = c.hostname("127.0.0.32").await.unwrap_err();
    assert!(err.to_string().contains("maintenance window"), "{err}");
    assert!(emu.writes().is_empty());
}

/// A client that trusts another CA is refused at the handshake, writing nothing.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_ca_is_refused() {
    let emu = one_cp().await;
    let other = Emulator::start(vec![NodeSpec::new("x", crate::common::cp_v112())])
        .await
        .unwrap();
    let cert = emu.issue_client_cert(&ClientCertSpec::admin()).unwrap();
    let identity = ClientIdentity::from_pem(other.ca_pem(), cert.cert_pem, cert.key_pem);
    let c = TalosClient::new(&emu.endpoint(0), &identity, quick()).unwrap();
    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7450");
    let err = c
        .apply_configuration("", &ApplyRequest::new(changed, ApplyMode::NoReboot))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(err.to_string().contains("ApplyConfiguration"), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    assert!(emu.writes().is_empty());
}

/// An expired client certificate is refused by the node.
#[tokio::test(flavor = "multi_thread")]
async fn expired_certificate_is_refused() {
    let emu = one_cp().await;
    let mut spec = ClientCertSpec::admin();
    spec.not_before = Some((2020, 1, 1));
    spec.not_after = Some((2021, 1, 1));
    let c = emu.client(0, &spec, quick()).unwrap();
    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7451");
    let err = c
        .apply_configuration("", &ApplyRequest::new(changed, ApplyMode::NoReboot))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("node 127.0.0.1:"), "{err}");
    assert!(err.to_string().contains("it has expired"), "{err}");
    assert!(emu.writes().is_empty());
}

/// A client certificate from another CA is refused by the node.
#[tokio::test(flavor = "multi_thread")]
async fn client_certificate_from_another_ca_is_refused() {
    let emu = one_cp().await;
    let other = Emulator::start(vec![NodeSpec::new("x", crate::common::cp_v112())])
        .await
        .unwrap();
    let cert = other.issue_client_cert(&ClientCertSpec::admin()).unwrap();
    let identity = ClientIdentity::from_pem(emu.ca_pem(), cert.cert_pem, cert.key_pem);
    let c = TalosClient::new(&emu.endpoint(0), &identity, quick()).unwrap();
    let err = c.version("").await.unwrap_err();
    assert!(
        err.to_string().contains("refused the client certificate"),
        "{err}"
    );
    assert!(emu.writes().is_empty());
}

/// A client certificate with EKU ServerAuth as well is refused (apid wants exactly ClientAuth).
#[tokio::test(flavor = "multi_thread")]
async fn client_eku_must_be_client_auth_only() {
    let emu = one_cp().await;
    let mut spec = ClientCertSpec::admin();
    spec.ext_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    ];
    let c = emu.client(0, &spec, quick()).unwrap();
    assert!(c.version("").await.is_err());
}

/// A reader may read versions but not the (sensitive) machine config, nor apply.
#[tokio::test(flavor = "multi_thread")]
async fn reader_role_limits() {
    let emu = one_cp().await;
    let c = emu
        .client(0, &ClientCertSpec::with_roles(["os:reader"]), quick())
        .unwrap();
    assert_eq!(c.version("").await.unwrap().tag, "v1.13.9");
    assert!(c.kubeprism_config("").await.unwrap().is_some());
    let err = c.machine_config("").await.unwrap_err();
    assert!(err.is_permission_denied(), "{err}");
    assert!(
        err.to_string()
            .contains("COSI Get MachineConfigs.config.talos.dev/v1alpha1"),
        "{err}"
    );
    let err = c
        .apply_configuration(
            "",
            &ApplyRequest::new(crate::common::cp_v112(), ApplyMode::NoReboot),
        )
        .await
        .unwrap_err();
    assert!(err.is_permission_denied(), "{err}");
    let err = c.reboot("").await.unwrap_err();
    assert!(err.is_permission_denied(), "{err}");
    assert!(emu.writes().is_empty());
}

/// Maintenance mode: an insecure connection, no client certificate; an apply configures the node.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_mode() {
    let emu = Emulator::start(vec![NodeSpec::maintenance("fresh")])
        .await
        .unwrap();
    let c = TalosClient::maintenance(&emu.endpoint(0), quick()).unwrap();
    let v = c.version("").await.unwrap();
    assert!(!v.rbac, "no RBAC before a config is loaded");
    let r = c
        .apply_configuration(
            "",
            &ApplyRequest::new(crate::common::cp_v112(), ApplyMode::Auto),
        )
        .await
        .unwrap();
    assert_eq!(r.mode, Some(ApplyMode::NoReboot));
    assert_eq!(emu.active_config(0).unwrap(), crate::common::cp_v112());
    // Now configured: the node wants mutual TLS.
    let admin = emu.admin_client(0).unwrap();
    assert_eq!(
        admin.machine_type("").await.unwrap(),
        MachineType::ControlPlane
    );
}

/// Invalid YAML is refused with InvalidArgument and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_config_is_refused() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let err = c
        .apply_configuration(
            "",
            &ApplyRequest::new(b"machine: [\n".to_vec(), ApplyMode::NoReboot),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    let err = c
        .apply_configuration(
            "",
            &ApplyRequest::new(
                b"apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n".to_vec(),
                ApplyMode::NoReboot,
            ),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("doesn't contain v1alpha1 config"),
        "{err}"
    );
    assert!(emu.writes().is_empty());
}

/// `on_nodes` never runs more calls at once than the concurrency bound.
#[tokio::test(flavor = "multi_thread")]
async fn on_nodes_respects_the_concurrency_bound() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let mut specs =
        vec![NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(ip("127.0.0.71"))];
    for i in 2..=8 {
        specs.push(
            NodeSpec::new(format!("w-{i}"), crate::common::worker_v112())
                .with_address(ip(&format!("127.0.0.7{i}"))),
        );
    }
    let emu = Emulator::start(specs).await.unwrap();
    for i in 1..8 {
        emu.set_fault(i, Fault::Slow(Duration::from_millis(50)));
    }
    let options = ClientOptions {
        concurrency: 3,
        ..quick()
    };
    let c = emu.client(0, &ClientCertSpec::admin(), options).unwrap();
    let nodes: Vec<String> = emu.nodes().iter().map(|n| n.address.to_string()).collect();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let results = c
        .on_nodes(&nodes, |c, node| {
            let in_flight = Arc::clone(&in_flight);
            let max = Arc::clone(&max);
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(now, Ordering::SeqCst);
                let r = c.version(&node).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                r
            }
        })
        .await;
    assert_eq!(results.len(), 8);
    assert!(results.iter().all(|(_, r)| r.is_ok()));
    let order: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order, nodes.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(max.load(Ordering::SeqCst) <= 3);
}

/// An out-of-band config change (drift) shows in the next read and writes
/// nothing to the log.
#[tokio::test(flavor = "multi_thread")]
async fn out_of_band_config_change_is_read_back() {
    let emu = one_cp().await;
    let c = emu.admin_client(0).unwrap();
    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7460");
    emu.set_config(0, changed.clone());
    assert_eq!(c.machine_config("").await.unwrap(), changed);
    assert_eq!(c.kubeprism_config("").await.unwrap().unwrap().port, 7460);
    assert!(emu.writes().is_empty());
}

/// A watch outlives the per-call timeout (only its setup is bounded).
#[tokio::test(flavor = "multi_thread")]
async fn watch_outlives_the_call_timeout() {
    let emu = one_cp().await;
    let options = ClientOptions {
        call_timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    };
    let c = emu.client(0, &ClientCertSpec::admin(), options).unwrap();
    let k = resources::MACHINE_CONFIG;
    let mut w = Box::pin(
        c.cosi_watch("", k.namespace, k.r#type, Some(k.id))
            .await
            .unwrap(),
    );
    assert_eq!(
        w.next().await.unwrap().unwrap().event_type,
        WatchEventType::Created
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7461");
    emu.set_config(0, changed.clone());
    let e = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("an event within 5s")
        .unwrap()
        .unwrap();
    assert_eq!(e.event_type, WatchEventType::Updated);
    let spec: ichor_talos_client::proto::ichor::specs::MachineConfigSpec =
        e.resource.unwrap().decode_spec().unwrap();
    assert_eq!(spec.yaml_marshalled, changed);
}

/// Several endpoints: a connection goes to the first one that answers.
#[tokio::test(flavor = "multi_thread")]
async fn endpoint_failover() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(ip("127.0.0.81")),
        NodeSpec::new("cp-2", crate::common::cp_v112()).with_address(ip("127.0.0.82")),
    ])
    .await
    .unwrap();
    emu.set_fault(0, Fault::Down);
    let identity = emu.client_identity(&ClientCertSpec::admin()).unwrap();
    let endpoints = vec![emu.endpoint(0), emu.endpoint(1)];
    let c = TalosClient::with_endpoints(&endpoints, &identity, quick()).unwrap();
    assert_eq!(c.hostname("").await.unwrap(), "cp-2");
    assert!(c.endpoint().contains(','), "{}", c.endpoint());
    // Every endpoint down: the error names them.
    emu.set_fault(1, Fault::Down);
    let fresh = TalosClient::with_endpoints(&endpoints, &identity, quick()).unwrap();
    let err = fresh.hostname("").await.unwrap_err();
    assert!(err.to_string().contains(&emu.endpoint(0)), "{err}");
}
