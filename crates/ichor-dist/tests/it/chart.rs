//! The chart with the real helm (v3 and v4), offline: lint, render, package.
//! The tests that install it on a cluster are in crates/ichor/tests/it/helm_e2e.rs.

use std::path::PathBuf;
use std::process::{Command, Output};

use ichor_testenv::Tool;
use ichor_testenv::tools::repo_root;

pub(crate) const HELMS: [Tool; 2] = [Tool::Helm3, Tool::Helm4];

pub(crate) fn chart() -> PathBuf {
    repo_root().join(ichor_dist::CHART_DIR)
}

pub(crate) fn helm(tool: Tool, home: &tempfile::TempDir, args: &[&str]) -> Output {
    Command::new(tool.path())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .args(args)
        .output()
        .expect("run helm")
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `helm template` of the chart into ichor-system with `extra` arguments.
pub(crate) fn template(tool: Tool, extra: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    let chart = chart();
    let kube = kube_version();
    let mut args = vec![
        "template",
        "ichor",
        chart.to_str().unwrap(),
        "--namespace",
        "ichor-system",
        "--kube-version",
        &kube,
    ];
    args.extend_from_slice(extra);
    helm(tool, &home, &args)
}

/// The Kubernetes version to render for: the test control plane's. (A helm
/// built from its Go module without release ldflags defaults to v1.20.)
fn kube_version() -> String {
    Tool::KubeApiserver.version()
}

pub(crate) fn docs(out: &Output) -> Vec<serde_yaml_ng::Value> {
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    s.split("\n---")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(d).ok())
        .filter(|v| v.get("kind").is_some())
        .collect()
}

pub(crate) fn kinds(docs: &[serde_yaml_ng::Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Covers: R4.1
#[test]
fn helm_lint_strict_passes_with_helm_3_and_4() {
    for tool in HELMS {
        let home = tempfile::tempdir().unwrap();
        let out = helm(
            tool,
            &home,
            &[
                "lint",
                "--strict",
                chart().to_str().unwrap(),
                "--namespace",
                "ichor-system",
            ],
        );
        assert!(out.status.success(), "{tool:?} lint: {}", text(&out));
    }
}

/// Covers: R4.1, R4.4a, R4.4d, R5.2
///
/// Offline `helm template` (lookup finds nothing, so the preflight is
/// skipped, F5) renders Ichor: CRDs kept on uninstall, the controller with
/// `--deployed-by helm` and the chart's selector label, webhooks with their
/// certificate, RBAC, the ichor-cni identity; no IchorInstallation, no
/// cluster object, no Cilium, no installer identity, no policies by default.
#[test]
fn helm_template_renders_ichor_and_nothing_else() {
    for tool in HELMS {
        let out = template(tool, &[]);
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        let docs = docs(&out);
        let kinds = kinds(&docs);
        for want in [
            "CustomResourceDefinition/talosclusters.ichor.maesh.dev",
            "CustomResourceDefinition/talosmachines.ichor.maesh.dev",
            "CustomResourceDefinition/ichorinstallations.ichor.maesh.dev",
            "CustomResourceDefinition/talosoperations.ichor.maesh.dev",
            "CustomResourceDefinition/talosbackups.ichor.maesh.dev",
            "Deployment/ichor-controller",
            "ServiceAccount/ichor-controller",
            "ClusterRole/ichor-controller",
            "ClusterRoleBinding/ichor-controller",
            "Role/ichor-controller",
            "RoleBinding/ichor-controller",
            "Secret/ichor-webhook-tls",
            "Service/ichor-webhook",
            "ValidatingWebhookConfiguration/ichor-validating-webhooks",
            "ServiceAccount/ichor-cni",
            "ClusterRoleBinding/ichor-cni",
        ] {
            assert!(
                kinds.contains(&want.to_string()),
                "{tool:?}: {want} missing from {kinds:?}"
            );
        }
        for absent in [
            "IchorInstallation",
            "TalosCluster",
            "TalosMachine",
            "CiliumNetworkPolicy",
            "DaemonSet",
            "Namespace",
        ] {
            assert!(
                !kinds.iter().any(|k| k.starts_with(&format!("{absent}/"))),
                "{tool:?}: {absent} rendered: {kinds:?}"
            );
        }
        assert!(
            !kinds
                .iter()
                .any(|k| k.contains("installer") || k.contains("cilium")),
            "{kinds:?}"
        );
        for crd in docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
        {
            assert_eq!(
                crd["metadata"]["annotations"]["helm.sh/resource-policy"],
                "keep"
            );
        }
        let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        assert_eq!(
            d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            "ichor"
        );
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/version"],
            "v0.1.0"
        );
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "ghcr.io/maeshinshin/ichor-controller:v0.1.0");
        let args: Vec<&str> = c["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2).any(|w| w == ["--deployed-by", "helm"]),
            "{args:?}"
        );
        // The rules are the installer path's (one source of RBAC).
        let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
        let rules: serde_json::Value = serde_json::to_value(&role["rules"]).unwrap();
        assert_eq!(rules, ichor_dist::controller_rules());
    }
}

/// Covers: R4.1
///
/// Values: the Cilium policies follow networkPolicy.cilium.enabled (null,
/// false: none; true: the generated ones); crd.keep=false drops the keep
/// annotation; installer.enabled=true adds its identity; cniHelm.enabled=false
/// drops ichor-cni.
#[test]
fn values_switch_what_is_rendered() {
    for tool in HELMS {
        for (set, policies) in [
            (None, 0),
            (Some("networkPolicy.cilium.enabled=false"), 0),
            (Some("networkPolicy.cilium.enabled=true"), 1),
        ] {
            let extra: Vec<&str> = set.map(|s| vec!["--set", s]).unwrap_or_default();
            let out = template(tool, &extra);
            assert!(out.status.success(), "{tool:?} {set:?}: {}", text(&out));
            let docs = docs(&out);
            let cnps: Vec<_> = docs
                .iter()
                .filter(|d| d["kind"] == "CiliumNetworkPolicy")
                .collect();
            assert_eq!(cnps.len(), policies, "{tool:?} {set:?}");
            if let Some(p) = cnps.first() {
                assert_eq!(
                    p["spec"]["endpointSelector"]["matchLabels"]["app.kubernetes.io/name"],
                    "ichor"
                );
            }
        }
        let out = template(
            tool,
            &[
                "--set",
                "crd.keep=false",
                "--set",
                "installer.enabled=true",
                "--set",
                "cniHelm.enabled=false",
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
        let docs = docs(&out);
        assert!(
            docs.iter()
                .filter(|d| d["kind"] == "CustomResourceDefinition")
                .all(|d| d["metadata"].get("annotations").is_none_or(|a| a.is_null()))
        );
        let kinds = kinds(&docs);
        assert!(
            kinds.contains(&"ServiceAccount/ichor-installer".to_string()),
            "{kinds:?}"
        );
        assert!(
            !kinds.contains(&"ServiceAccount/ichor-cni".to_string()),
            "{kinds:?}"
        );
    }
}

/// Covers: R20.10
///
/// `backup.volume.claimName` mounts that claim into the controller at
/// /var/lib/ichor/backups and tells the controller its name; without it
/// the Deployment has no volume.
#[test]
fn the_backup_volume_value_mounts_its_claim_into_the_controller() {
    for tool in HELMS {
        let controller = |extra: &[&str]| {
            let out = template(tool, extra);
            assert!(out.status.success(), "{tool:?}: {}", text(&out));
            docs(&out)
                .into_iter()
                .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ichor-controller")
                .expect("the controller Deployment")
        };
        let plain = controller(&[]);
        assert!(
            plain["spec"]["template"]["spec"]["volumes"].is_null(),
            "{tool:?}"
        );
        let d = controller(&["--set", "backup.volume.claimName=nas"]);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "nas"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/var/lib/ichor/backups");
        assert_eq!(c["volumeMounts"][0]["name"], pod["volumes"][0]["name"]);
        let args: Vec<&str> = c["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let at = args
            .iter()
            .position(|a| *a == "--backup-volume-claim")
            .expect("the flag");
        assert_eq!(args[at + 1], "nas", "{args:?}");
    }
}

/// Covers: R5.3
///
/// The UI values: port 8443 by default, plaintextPort opt-in and marked
/// deprecated in NOTES, bad values refused; ichorUI.enabled=true deploys the
/// UI under its own ServiceAccount, which only reads (R18.3), over HTTPS,
/// read-only when asked.
#[test]
fn ui_values_are_checked_and_the_ui_is_deployed() {
    for tool in HELMS {
        let out = template(tool, &["--set", "ichorUI.enabled=true"]);
        assert!(out.status.success(), "{}", text(&out));
        let rendered = docs(&out);
        let kinds = kinds(&rendered);
        for k in [
            "ServiceAccount/ichor-ui",
            "ClusterRole/ichor-ui",
            "ClusterRoleBinding/ichor-ui",
            "ClusterRoleBinding/ichor-ui-auth-delegator",
            "Service/ichor-ui",
            "Deployment/ichor-ui",
        ] {
            assert!(kinds.contains(&k.to_string()), "{k} missing: {kinds:?}");
        }
        let deployment = rendered
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ichor-ui")
            .unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "ichor-ui");
        let args: Vec<&str> = pod["containers"][0]["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(&args[..3], ["ui", "--listen", "0.0.0.0:8443"]);
        assert!(!args.contains(&"--read-only"));
        assert!(!args.contains(&"--plaintext-listen"));
        // Read-write too, the UI's ServiceAccount only reads: its actions
        // are made with the signed-in user's token (R18.3).
        let role = rendered
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "ichor-ui")
            .unwrap();
        for rule in role["rules"].as_sequence().unwrap() {
            let verbs: Vec<&str> = rule["verbs"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(verbs, ["get", "list", "watch"], "the UI may only read");
        }
        let out = template(
            tool,
            &[
                "--set",
                "ichorUI.enabled=true",
                "--set",
                "settings.readOnly=true",
                "--set",
                "ichorUI.tls.certSecret=ui-tls",
                "--set",
                "ichorUI.plaintextPort=8080",
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
        let rendered = docs(&out);
        let role = rendered
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "ichor-ui")
            .unwrap();
        for rule in role["rules"].as_sequence().unwrap() {
            let verbs: Vec<&str> = rule["verbs"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(
                verbs,
                ["get", "list", "watch"],
                "read-only UI may only read"
            );
        }
        let deployment = rendered
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ichor-ui")
            .unwrap();
        let args = format!(
            "{:?}",
            deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        );
        for a in [
            "--read-only",
            "--tls-cert",
            "/etc/ichor-ui/tls/tls.crt",
            "--plaintext-listen",
        ] {
            assert!(args.contains(a), "{a} missing: {args}");
        }
        let out = template(tool, &["--set", "ichorUI.port=70000"]);
        assert!(!out.status.success());
        assert!(
            text(&out).contains("ichorUI.port 70000 is not a TCP port"),
            "{}",
            text(&out)
        );
        let out = template(
            tool,
            &[
                "--set",
                "ichorUI.tls.caConfigMap=a",
                "--set",
                "ichorUI.tls.caSecret=b",
            ],
        );
        assert!(!out.status.success());
        // The values schema refuses it first; the chart's own check still
        // does when the schema is skipped.
        let out = template(tool, &["--set", "networkPolicy.cilium.enabled=maybe"]);
        assert!(
            text(&out)
                .contains("at '/networkPolicy/cilium/enabled': got string, want null or boolean"),
            "{}",
            text(&out)
        );
        let out = template(
            tool,
            &[
                "--set",
                "networkPolicy.cilium.enabled=maybe",
                "--skip-schema-validation",
            ],
        );
        assert!(
            text(&out).contains("use true, false or null"),
            "{}",
            text(&out)
        );
        let out = template(
            tool,
            &[
                "--set",
                "ichorUI.plaintextPort=8080",
                "--set",
                "settings.readOnly=true",
                "--show-only",
                "templates/controller.yaml",
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    assert_eq!(values["ichorUI"]["port"], 8443);
    assert!(values["ichorUI"]["plaintextPort"].is_null());
    assert_eq!(values["ichorUI"]["enabled"], false);
    assert_eq!(values["settings"]["readOnly"], false);
    assert_eq!(values["cniHelm"]["enabled"], true);
    assert_eq!(values["installer"]["enabled"], false);
    assert!(values["networkPolicy"]["cilium"]["enabled"].is_null());
    assert_eq!(values["preflight"]["cni"], true);
    assert_eq!(values["crd"]["keep"], true);
    let notes = std::fs::read_to_string(chart().join("templates/NOTES.txt")).unwrap();
    assert!(notes.contains("ichorUI.plaintextPort is deprecated"));
    assert!(notes.contains("svc/ichor-ui"));
}

/// Covers: R4.1
///
/// A chart outside ichor-system would split Ichor from its objects: refused.
#[test]
fn another_namespace_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let out = helm(
        Tool::Helm4,
        &home,
        &[
            "template",
            "ichor",
            chart().to_str().unwrap(),
            "--namespace",
            "default",
            "--kube-version",
            &kube_version(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("Ichor runs in the namespace ichor-system, not default"),
        "{}",
        text(&out)
    );
}

/// Covers: R4.5, R5.4
///
/// The chart's own version has no v and its appVersion has it; the real
/// image repositories are the defaults; `helm package --version X
/// --app-version vX` (what the release does) gives an archive whose
/// metadata keeps that split.
#[test]
fn versions_and_images_follow_the_release_rules() {
    let meta: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    let version = meta["version"].as_str().unwrap();
    let app_version = meta["appVersion"].as_str().unwrap();
    assert!(!version.starts_with('v'));
    assert_eq!(app_version, format!("v{version}"));
    assert_eq!(
        app_version,
        ichor_dist::workspace_version(),
        "the chart follows the workspace version"
    );
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    for repo in [
        "ghcr.io/maeshinshin/ichor-controller",
        "ghcr.io/maeshinshin/ichor-ui",
        "ghcr.io/maeshinshin/ichor-installer",
    ] {
        assert!(values.contains(&format!("repository: {repo}\n")), "{repo}");
    }
    for tool in HELMS {
        let home = tempfile::tempdir().unwrap();
        let dest = home.path().join("out");
        let out = helm(
            tool,
            &home,
            &[
                "package",
                chart().to_str().unwrap(),
                "--version",
                "1.2.3",
                "--app-version",
                "v1.2.3",
                "--destination",
                dest.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        let archive = dest.join("ichor-1.2.3.tgz");
        assert!(archive.is_file(), "{}", text(&out));
        let out = helm(tool, &home, &["show", "chart", archive.to_str().unwrap()]);
        let shown: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
        assert_eq!(shown["version"], "1.2.3");
        assert_eq!(shown["appVersion"], "v1.2.3");
        let out = helm(
            tool,
            &home,
            &[
                "template",
                "ichor",
                archive.to_str().unwrap(),
                "--namespace",
                "ichor-system",
                "--kube-version",
                &kube_version(),
                "--show-only",
                "templates/controller.yaml",
            ],
        );
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .contains("image: ghcr.io/maeshinshin/ichor-controller:v1.2.3"),
            "{}",
            text(&out)
        );
    }
}
