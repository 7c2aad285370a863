//! The drift classes and the path table: the one place that decides the
//! class of a difference between live and desired config. The definitions
//! and this same table are written in `docs/adr/0004-drift-classes.md`; a
//! test keeps the two in step.
//!
//! - **A** — nothing to do: the values are equal or mean the same (a default
//!   written out or left out), or the live value is what the spec adopted.
//! - **B** — Ichor applies it, in no-reboot mode, when the machine is not held:
//!   Talos applies the path live and it cannot cut the node off.
//! - **C** — Ichor never applies it on its own: it needs a reboot, is
//!   destructive, goes through another mechanism (an upgrade), or the path is
//!   unknown. A condition says why; the operator decides.

use ichor_api::DriftClass;
use serde_yaml_ng::Value;

use crate::path::ConfigPath;

/// One row of the path table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// A path pattern (see [`ConfigPath::is_under`]); the empty pattern matches every path.
    pub pattern: &'static str,
    /// The class of a difference at or under the pattern.
    pub class: DriftClass,
    /// Why, in words (shown in status).
    pub reason: &'static str,
}

const CNI: &str = "changing the CNI of a running cluster is destructive: pods lose their network until every node runs the new CNI";
const INLINE_CNI: &str = "Talos applies inline manifests without a reboot; Ichor's Cilium entry stays only until Ichor's Cilium release has taken over";
const INLINE: &str = "Talos applies inline and external manifests without a reboot";
const PROXY_SWITCH: &str = "turning kube-proxy off or on changes how every Service is reached; it is part of a planned CNI change, not an automatic apply";
const PROXY: &str = "kube-proxy settings reach the cluster only through talosctl upgrade-k8s (Talos creates bootstrap manifests once and never updates them)";
const KUBEPRISM: &str = "Talos starts and stops KubePrism without a reboot";
const NETWORK: &str =
    "pod and service subnets and the DNS domain cannot change on a running cluster";
const IDENTITY: &str = "the cluster's endpoint and name are in every certificate and kubeconfig; changing them is a migration";
const VERSION: &str =
    "a Kubernetes version change is an upgrade: use a TalosOperation of kind kubernetes-upgrade";
const INSTALL: &str = "install settings take effect only on the next install or upgrade (a reboot)";
const ROLE: &str = "a node's role cannot change in place; reinstall the node";
const SECRETS: &str = "cluster secrets and CAs: changing them breaks trust between the nodes";
const NODE_META: &str = "node labels, annotations and taints are applied without a reboot";
const KUBELET: &str = "Talos restarts the kubelet with the new settings, without a reboot";
const SYSCTL: &str = "sysctls are applied live";
const TIME: &str = "time sync settings are applied live";
const REGISTRY: &str = "registry settings apply to the next image pull, without a reboot";
const CERT_SANS: &str = "the Talos API certificate is reissued without a reboot";
const CONTROL_PLANE: &str =
    "Talos restarts the control-plane static pods with the new settings, without a reboot";
const UNKNOWN: &str =
    "Ichor does not know this path; it applies only paths it knows to be safe without a reboot";

use DriftClass::{B, C};

/// The path table, most specific rows first: the first row whose pattern
/// matches a path decides its class. The last row matches everything.
#[rustfmt::skip]
pub const RULES: &[Rule] = &[
    // CNI (R1.6)
    Rule { pattern: "cluster.network.cni", class: C, reason: CNI },
    Rule { pattern: "KubeFlannelCNIConfig", class: C, reason: CNI },
    Rule { pattern: "KubeExternalManifestConfig[custom-cni]", class: C, reason: CNI },
    Rule { pattern: "cluster.inlineManifests[cilium]", class: B, reason: INLINE_CNI },
    Rule { pattern: "KubeInlineManifestConfig[cilium]", class: B, reason: INLINE_CNI },
    Rule { pattern: "cluster.inlineManifests", class: B, reason: INLINE },
    Rule { pattern: "KubeInlineManifestConfig", class: B, reason: INLINE },
    Rule { pattern: "cluster.extraManifests", class: B, reason: INLINE },
    Rule { pattern: "cluster.extraManifestHeaders", class: B, reason: INLINE },
    Rule { pattern: "KubeExternalManifestConfig", class: B, reason: INLINE },
    Rule { pattern: "cluster.proxy.disabled", class: C, reason: PROXY_SWITCH },
    Rule { pattern: "KubeProxyConfig.enabled", class: C, reason: PROXY_SWITCH },
    Rule { pattern: "cluster.proxy", class: C, reason: PROXY },
    Rule { pattern: "KubeProxyConfig", class: C, reason: PROXY },
    Rule { pattern: "machine.features.kubePrism", class: B, reason: KUBEPRISM },
    Rule { pattern: "KubePrismConfig", class: B, reason: KUBEPRISM },
    // Cluster shape and identity
    Rule { pattern: "cluster.network", class: C, reason: NETWORK },
    Rule { pattern: "KubeNetworkConfig", class: C, reason: NETWORK },
    Rule { pattern: "cluster.controlPlane", class: C, reason: IDENTITY },
    Rule { pattern: "cluster.clusterName", class: C, reason: IDENTITY },
    Rule { pattern: "KubeClusterConfig", class: C, reason: IDENTITY },
    // Versions
    Rule { pattern: "machine.kubelet.image", class: C, reason: VERSION },
    Rule { pattern: "KubeletConfig.image", class: C, reason: VERSION },
    Rule { pattern: "cluster.apiServer.image", class: C, reason: VERSION },
    Rule { pattern: "cluster.controllerManager.image", class: C, reason: VERSION },
    Rule { pattern: "cluster.scheduler.image", class: C, reason: VERSION },
    Rule { pattern: "KubeAPIServerConfig.image", class: C, reason: VERSION },
    Rule { pattern: "KubeControllerManagerConfig.image", class: C, reason: VERSION },
    Rule { pattern: "KubeSchedulerConfig.image", class: C, reason: VERSION },
    Rule { pattern: "machine.install", class: C, reason: INSTALL },
    Rule { pattern: "UnattendedInstallConfig", class: C, reason: INSTALL },
    Rule { pattern: "machine.type", class: C, reason: ROLE },
    // Secrets and CAs
    Rule { pattern: "machine.token", class: C, reason: SECRETS },
    Rule { pattern: "machine.ca", class: C, reason: SECRETS },
    Rule { pattern: "machine.acceptedCAs", class: C, reason: SECRETS },
    Rule { pattern: "cluster.id", class: C, reason: SECRETS },
    Rule { pattern: "cluster.secret", class: C, reason: SECRETS },
    Rule { pattern: "cluster.token", class: C, reason: SECRETS },
    Rule { pattern: "cluster.ca", class: C, reason: SECRETS },
    Rule { pattern: "cluster.acceptedCAs", class: C, reason: SECRETS },
    Rule { pattern: "cluster.aggregatorCA", class: C, reason: SECRETS },
    Rule { pattern: "cluster.serviceAccount", class: C, reason: SECRETS },
    Rule { pattern: "cluster.etcd.ca", class: C, reason: SECRETS },
    Rule { pattern: "cluster.secretboxEncryptionSecret", class: C, reason: SECRETS },
    Rule { pattern: "cluster.aescbcEncryptionSecret", class: C, reason: SECRETS },
    Rule { pattern: "KubeAPIServerCAConfig", class: C, reason: SECRETS },
    Rule { pattern: "KubeAggregatorCAConfig", class: C, reason: SECRETS },
    Rule { pattern: "KubeServiceAccountConfig", class: C, reason: SECRETS },
    Rule { pattern: "KubeEtcdEncryptionConfig", class: C, reason: SECRETS },
    Rule { pattern: "DiscoveryIdentityConfig", class: C, reason: SECRETS },
    // Safe live changes
    Rule { pattern: "machine.nodeLabels", class: B, reason: NODE_META },
    Rule { pattern: "machine.nodeAnnotations", class: B, reason: NODE_META },
    Rule { pattern: "machine.nodeTaints", class: B, reason: NODE_META },
    Rule { pattern: "KubeNodeConfig.labels", class: B, reason: NODE_META },
    Rule { pattern: "KubeNodeConfig.annotations", class: B, reason: NODE_META },
    Rule { pattern: "KubeNodeConfig.taints", class: B, reason: NODE_META },
    Rule { pattern: "machine.kubelet", class: B, reason: KUBELET },
    Rule { pattern: "KubeletConfig", class: B, reason: KUBELET },
    Rule { pattern: "machine.sysctls", class: B, reason: SYSCTL },
    Rule { pattern: "SysctlConfig", class: B, reason: SYSCTL },
    Rule { pattern: "machine.time", class: B, reason: TIME },
    Rule { pattern: "TimeSyncConfig", class: B, reason: TIME },
    Rule { pattern: "machine.registries", class: B, reason: REGISTRY },
    Rule { pattern: "RegistryMirrorConfig", class: B, reason: REGISTRY },
    Rule { pattern: "RegistryAuthConfig", class: B, reason: REGISTRY },
    Rule { pattern: "RegistryTLSConfig", class: B, reason: REGISTRY },
    Rule { pattern: "machine.certSANs", class: B, reason: CERT_SANS },
    Rule { pattern: "cluster.apiServer", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "cluster.controllerManager", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "cluster.scheduler", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeAPIServerConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeControllerManagerConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeSchedulerConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeAdmissionControlConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeAuditPolicyConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeAuthenticationConfig", class: B, reason: CONTROL_PLANE },
    Rule { pattern: "KubeAuthorizerConfig", class: B, reason: CONTROL_PLANE },
    // Everything else
    Rule { pattern: "", class: C, reason: UNKNOWN },
];

/// Reason of a class A entry whose values differ only in writing.
pub const SAME_MEANING: &str = "the values differ in writing only and mean the same to Talos";

/// The class of a difference at `path`, and why.
pub fn classify(
    path: &ConfigPath,
    live: Option<&Value>,
    desired: Option<&Value>,
) -> (DriftClass, &'static str) {
    if same_meaning(path, live, desired) {
        return (DriftClass::A, SAME_MEANING);
    }
    let rule = RULES
        .iter()
        .find(|r| path.is_under(r.pattern))
        .unwrap_or(&RULES[RULES.len() - 1]);
    (rule.class, rule.reason)
}

fn is_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Mapping(m)) => m.is_empty(),
        Some(Value::Sequence(s)) => s.is_empty(),
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    }
}

/// Differences that are only a default written out or left out.
fn same_meaning(path: &ConfigPath, live: Option<&Value>, desired: Option<&Value>) -> bool {
    if is_empty(live) && is_empty(desired) {
        return true;
    }
    let is = |v: Option<&Value>, want: &Value| v == Some(want);
    let either_absent_and_other = |want: Value| {
        (live.is_none() && is(desired, &want)) || (desired.is_none() && is(live, &want))
    };
    let p = path.to_string();
    match p.as_str() {
        "KubeProxyConfig.enabled" => either_absent_and_other(Value::Bool(true)),
        "cluster.proxy.disabled" => either_absent_and_other(Value::Bool(false)),
        "cluster.network.cni.name" => either_absent_and_other(Value::String("flannel".into())),
        "machine.features.kubePrism.port" => {
            let port = |v: Option<&Value>| match v {
                None => Some(7445),
                Some(v) => v.as_u64().map(|p| if p == 0 { 7445 } else { p }),
            };
            port(live).is_some() && port(live) == port(desired)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[&str]) -> ConfigPath {
        ConfigPath(
            s.iter()
                .map(|k| crate::path::Segment::Key((*k).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn first_matching_row_wins() {
        assert_eq!(
            classify(&p(&["cluster", "network", "cni", "name"]), None, None).0,
            DriftClass::A
        );
        let v = Value::String("none".into());
        let f = Value::String("custom".into());
        assert_eq!(
            classify(
                &p(&["cluster", "network", "cni", "name"]),
                Some(&f),
                Some(&v)
            )
            .0,
            DriftClass::C
        );
        assert_eq!(
            classify(
                &p(&["cluster", "network", "podSubnets"]),
                Some(&f),
                Some(&v)
            )
            .0,
            DriftClass::C
        );
        assert_eq!(
            classify(&p(&["machine", "kubelet", "image"]), Some(&f), Some(&v)).1,
            VERSION
        );
        assert_eq!(
            classify(&p(&["machine", "kubelet", "extraArgs"]), Some(&f), Some(&v)).0,
            DriftClass::B
        );
        assert_eq!(
            classify(&p(&["machine", "somethingNew"]), Some(&f), Some(&v)),
            (DriftClass::C, UNKNOWN)
        );
        let inline = ConfigPath::default()
            .key("cluster")
            .key("inlineManifests")
            .item("cilium");
        assert_eq!(
            classify(&inline, Some(&f), None),
            (DriftClass::B, INLINE_CNI)
        );
    }

    #[test]
    fn defaults_mean_the_same() {
        let t = Value::Bool(true);
        assert_eq!(
            classify(&p(&["KubeProxyConfig", "enabled"]), None, Some(&t)).0,
            DriftClass::A
        );
        let f = Value::Bool(false);
        assert_eq!(
            classify(&p(&["KubeProxyConfig", "enabled"]), None, Some(&f)).0,
            DriftClass::C
        );
        let zero = Value::Number(0.into());
        let port = Value::Number(7445.into());
        assert_eq!(
            classify(
                &p(&["machine", "features", "kubePrism", "port"]),
                Some(&zero),
                Some(&port)
            )
            .0,
            DriftClass::A
        );
    }
}
