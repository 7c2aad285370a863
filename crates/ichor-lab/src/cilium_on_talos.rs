//! Whether a Cilium agent, as rendered, would run on a Talos node: the
//! conditions of the Talos guide for Cilium (see
//! `docs/adr/0008-cilium-on-talos-in-the-lab.md` for each one and its
//! source), judged from the rendered agent DaemonSet and the `cilium-config`
//! ConfigMap. Pure: the node simulator reads the objects and asks here, and a
//! pod that is not Ready carries the answer in its status.

use std::collections::BTreeMap;

use serde_json::Value;

/// What the lab knows of a Talos node that matters to Cilium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TalosNode {
    /// kube-proxy runs on the cluster (`cluster.proxy.disabled: false`; its
    /// DaemonSet exists).
    pub kube_proxy: bool,
    /// KubePrism's port on the node (`machine.features.kubePrism`), `None`
    /// when KubePrism is off.
    pub kube_prism_port: Option<u16>,
}

/// Why the agent pod is not Ready, as the kubelet would show it: the
/// container that fails, whether it is an init container, the waiting
/// reason, and a message naming the value that breaks it on Talos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentNotReady {
    pub container: String,
    pub init: bool,
    /// The container's waiting reason (`CrashLoopBackOff`,
    /// `CreateContainerError`, `ContainerCreating`).
    pub reason: &'static str,
    pub message: String,
}

/// The capability Talos never grants to a workload.
pub const FORBIDDEN_CAPABILITY: &str = "SYS_MODULE";
/// Where Talos mounts the cgroup2 hierarchy.
pub const TALOS_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The agent's container in Cilium's DaemonSet.
pub const AGENT_CONTAINER: &str = "cilium-agent";

/// Judges the agent pod of `daemonset` (Cilium's agent DaemonSet, as JSON)
/// with `config` (the data of ConfigMap `cilium-config`, `None` when it does
/// not exist) on `node`. `Ok` when every condition holds; else the first
/// one that fails, in the order a kubelet would meet them (volumes, init
/// containers, containers).
pub fn judge_agent(
    daemonset: &Value,
    config: Option<&BTreeMap<String, String>>,
    node: &TalosNode,
) -> Result<(), AgentNotReady> {
    let pod = &daemonset["spec"]["template"]["spec"];
    let Some(config) = config else {
        return Err(AgentNotReady {
            container: AGENT_CONTAINER.into(),
            init: false,
            reason: "ContainerCreating",
            message: "MountVolume.SetUp failed for volume \"cilium-config-path\": configmap \"cilium-config\" not found".into(),
        });
    };
    judge_capabilities(pod)?;
    judge_cgroup_mount(pod)?;
    let agent = containers(pod, "containers")
        .into_iter()
        .find(|c| c["name"] == AGENT_CONTAINER)
        .ok_or_else(|| AgentNotReady {
            container: AGENT_CONTAINER.into(),
            init: false,
            reason: "CreateContainerError",
            message: format!("the DaemonSet has no container {AGENT_CONTAINER}"),
        })?;
    judge_config(config, node)?;
    judge_api_server_access(&agent, node)
}

/// The containers of one list (`initContainers`, `containers`) of a pod spec.
fn containers(pod: &Value, list: &str) -> Vec<Value> {
    pod[list].as_array().cloned().unwrap_or_default()
}

fn container_name(c: &Value) -> String {
    c["name"].as_str().unwrap_or_default().to_string()
}

/// The agent container crashing with `message`.
fn agent_crash(message: String) -> AgentNotReady {
    AgentNotReady {
        container: AGENT_CONTAINER.into(),
        init: false,
        reason: "CrashLoopBackOff",
        message,
    }
}

/// Capabilities: a container asking for SYS_MODULE is refused.
fn judge_capabilities(pod: &Value) -> Result<(), AgentNotReady> {
    for (list, init) in [("initContainers", true), ("containers", false)] {
        for c in containers(pod, list) {
            let privileged = c["securityContext"]["privileged"] == Value::Bool(true);
            let asks = c["securityContext"]["capabilities"]["add"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == FORBIDDEN_CAPABILITY));
            if asks && !privileged {
                return Err(AgentNotReady {
                    container: container_name(&c),
                    init,
                    reason: "CreateContainerError",
                    message: format!(
                        "container {} asks for capability {FORBIDDEN_CAPABILITY}, which Talos does not grant to workloads (kernel modules are part of the Talos image): remove it from securityContext.capabilities.ciliumAgent and .cleanCiliumState",
                        container_name(&c)
                    ),
                });
            }
        }
    }
    Ok(())
}

/// cgroup: Talos mounts cgroup2 itself; the chart's mount-cgroup init
/// container (cgroup.autoMount.enabled) fails there.
fn judge_cgroup_mount(pod: &Value) -> Result<(), AgentNotReady> {
    if let Some(c) = containers(pod, "initContainers")
        .into_iter()
        .find(|c| c["name"] == "mount-cgroup")
    {
        return Err(AgentNotReady {
            container: container_name(&c),
            init: true,
            reason: "CrashLoopBackOff",
            message: format!(
                "init container mount-cgroup cannot mount cgroup2 on Talos, which mounts it at {TALOS_CGROUP_ROOT} already: set cgroup.autoMount.enabled=false and cgroup.hostRoot={TALOS_CGROUP_ROOT}"
            ),
        });
    }
    Ok(())
}

/// The values of `cilium-config` Talos needs: its cgroup root, Kubernetes
/// IPAM, and something that serves Services.
fn judge_config(config: &BTreeMap<String, String>, node: &TalosNode) -> Result<(), AgentNotReady> {
    let cgroup_root = config.get("cgroup-root").map(String::as_str);
    if cgroup_root != Some(TALOS_CGROUP_ROOT) {
        return Err(agent_crash(format!(
            "cilium-config cgroup-root is {}, but Talos mounts cgroup2 at {TALOS_CGROUP_ROOT}: set cgroup.hostRoot={TALOS_CGROUP_ROOT}",
            shown(cgroup_root)
        )));
    }

    // IPAM: Talos gives each node its pod CIDR through Kubernetes.
    let ipam = config.get("ipam").map(String::as_str);
    if ipam != Some("kubernetes") {
        return Err(agent_crash(format!(
            "cilium-config ipam is {}, but on Talos the nodes' pod CIDRs come from Kubernetes (cluster.network.podSubnets): set ipam.mode=kubernetes",
            shown(ipam)
        )));
    }

    // Services: kube-proxy serves them, or Cilium replaces it. (Both at once
    // runs: Cilium's service handling takes precedence over kube-proxy's
    // rules; the Talos guide pairs them the other way, and adopt refuses
    // that mismatch itself, R4.4c.)
    let kpr = config.get("kube-proxy-replacement").map(String::as_str);
    if kpr != Some("true") && !node.kube_proxy {
        return Err(agent_crash(format!(
            "cilium-config kube-proxy-replacement is {}, but kube-proxy is disabled on this Talos cluster (cluster.proxy.disabled: true), so nothing would serve Services: set kubeProxyReplacement=true",
            shown(kpr)
        )));
    }
    Ok(())
}

/// The API server: without kube-proxy the agent cannot use the
/// `kubernetes` Service and must reach KubePrism on the node itself.
fn judge_api_server_access(agent: &Value, node: &TalosNode) -> Result<(), AgentNotReady> {
    let env = |k: &str| {
        agent["env"].as_array().and_then(|a| {
            a.iter()
                .find(|e| e["name"] == k)
                .and_then(|e| e["value"].as_str().map(str::to_string))
        })
    };
    let host = env("KUBERNETES_SERVICE_HOST");
    let port = env("KUBERNETES_SERVICE_PORT");
    if host.is_none() && !node.kube_proxy {
        return Err(agent_crash(
            "the agent has no KUBERNETES_SERVICE_HOST, and without kube-proxy it cannot reach the API server through the kubernetes Service: set k8sServiceHost=localhost and k8sServicePort=7445 (KubePrism)".into(),
        ));
    }
    if let Some(host) = host {
        if host != "localhost" && host != "127.0.0.1" {
            return Err(agent_crash(format!(
                "k8sServiceHost is {host:?}; on Talos the agent reaches the API server through KubePrism on the node: set k8sServiceHost=localhost"
            )));
        }
        let Some(prism) = node.kube_prism_port else {
            return Err(agent_crash(
                "k8sServiceHost is localhost, but KubePrism is disabled on this Talos node (machine.features.kubePrism.enabled: false), so nothing listens there: enable KubePrism".into(),
            ));
        };
        if port.as_deref() != Some(prism.to_string().as_str()) {
            return Err(agent_crash(format!(
                "k8sServicePort is {}, but KubePrism listens on port {prism} on this Talos node: set k8sServicePort={prism}",
                shown(port.as_deref())
            )));
        }
    }
    Ok(())
}

fn shown(v: Option<&str>) -> String {
    match v {
        Some(v) => format!("{v:?}"),
        None => "not set".into(),
    }
}

/// The pod status a kubelet would report for an agent pod with this verdict.
pub fn agent_pod_status(verdict: &Result<(), AgentNotReady>, now: &str) -> Value {
    match verdict {
        Ok(()) => serde_json::json!({
            "phase": "Running", "reason": null, "message": null,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": AGENT_CONTAINER, "image": "", "imageID": "", "ready": true,
                "restartCount": 0, "started": true, "state": {"running": {"startedAt": now}}}],
        }),
        Err(why) => {
            let waiting = serde_json::json!([{"name": why.container, "image": "", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": why.reason, "message": why.message}}}]);
            let (phase, list, initialized) = if why.init {
                ("Pending", "initContainerStatuses", "False")
            } else {
                ("Running", "containerStatuses", "True")
            };
            let pod_reason = if why.init {
                format!("Init:{}", why.reason)
            } else {
                why.reason.to_string()
            };
            let mut status = serde_json::json!({
                "phase": phase, "reason": pod_reason, "message": why.message,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": initialized, "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
                        "message": format!("containers with unready status: [{AGENT_CONTAINER}]"), "lastTransitionTime": now},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                        "message": why.message, "lastTransitionTime": now}],
            });
            status[list] = waiting;
            status
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A DaemonSet shaped as Cilium's chart renders it with Talos's values.
    fn talos_daemonset() -> Value {
        json!({"spec": {"template": {"spec": {
            "initContainers": [
                {"name": "config"},
                {"name": "clean-cilium-state", "securityContext": {"capabilities": {
                    "add": ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"], "drop": ["ALL"]}}}],
            "containers": [{"name": "cilium-agent",
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}],
                "securityContext": {"capabilities": {"add": ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW",
                    "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"],
                    "drop": ["ALL"]}}}]}}}})
    }

    fn talos_config(kpr: &str) -> BTreeMap<String, String> {
        [
            ("ipam", "kubernetes"),
            ("cgroup-root", "/sys/fs/cgroup"),
            ("kube-proxy-replacement", kpr),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    const WITH_PROXY: TalosNode = TalosNode {
        kube_proxy: true,
        kube_prism_port: Some(7445),
    };
    const WITHOUT_PROXY: TalosNode = TalosNode {
        kube_proxy: false,
        kube_prism_port: Some(7445),
    };

    fn reason(r: Result<(), AgentNotReady>) -> AgentNotReady {
        r.expect_err("the agent must not be Ready")
    }

    #[test]
    fn the_talos_guides_values_run_with_and_without_kube_proxy() {
        let ds = talos_daemonset();
        assert_eq!(
            judge_agent(&ds, Some(&talos_config("false")), &WITH_PROXY),
            Ok(())
        );
        assert_eq!(
            judge_agent(&ds, Some(&talos_config("true")), &WITHOUT_PROXY),
            Ok(())
        );
        // With kube-proxy the agent may also use the kubernetes Service.
        let mut no_env = ds.clone();
        no_env["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        assert_eq!(
            judge_agent(&no_env, Some(&talos_config("false")), &WITH_PROXY),
            Ok(())
        );
    }

    #[test]
    fn sys_module_is_refused_in_any_container() {
        let mut ds = talos_daemonset();
        ds["spec"]["template"]["spec"]["initContainers"][1]["securityContext"]["capabilities"]["add"] =
            json!(["NET_ADMIN", "SYS_MODULE"]);
        let why = reason(judge_agent(&ds, Some(&talos_config("false")), &WITH_PROXY));
        assert_eq!(
            (why.container.as_str(), why.init),
            ("clean-cilium-state", true)
        );
        assert_eq!(why.reason, "CreateContainerError");
        assert!(why.message.contains("SYS_MODULE"), "{}", why.message);

        let mut ds = talos_daemonset();
        ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
            .as_array_mut()
            .unwrap()
            .push(json!("SYS_MODULE"));
        let why = reason(judge_agent(&ds, Some(&talos_config("false")), &WITH_PROXY));
        assert_eq!((why.container.as_str(), why.init), ("cilium-agent", false));
    }

    #[test]
    fn cgroup_auto_mount_and_host_root_are_judged() {
        let mut ds = talos_daemonset();
        ds["spec"]["template"]["spec"]["initContainers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "mount-cgroup"}));
        let why = reason(judge_agent(&ds, Some(&talos_config("false")), &WITH_PROXY));
        assert_eq!((why.container.as_str(), why.init), ("mount-cgroup", true));
        assert!(why.message.contains("cgroup.autoMount.enabled=false"));

        let mut config = talos_config("false");
        config.insert("cgroup-root".into(), "/run/cilium/cgroupv2".into());
        let why = reason(judge_agent(&talos_daemonset(), Some(&config), &WITH_PROXY));
        assert!(
            why.message.contains("cgroup.hostRoot=/sys/fs/cgroup"),
            "{}",
            why.message
        );
        config.remove("cgroup-root");
        let why = reason(judge_agent(&talos_daemonset(), Some(&config), &WITH_PROXY));
        assert!(why.message.contains("not set"), "{}", why.message);
    }

    #[test]
    fn ipam_must_be_kubernetes() {
        let mut config = talos_config("false");
        config.insert("ipam".into(), "cluster-pool".into());
        let why = reason(judge_agent(&talos_daemonset(), Some(&config), &WITH_PROXY));
        assert_eq!(why.reason, "CrashLoopBackOff");
        assert!(
            why.message.contains("\"cluster-pool\"")
                && why.message.contains("ipam.mode=kubernetes")
        );
    }

    #[test]
    fn without_kube_proxy_cilium_must_replace_it() {
        let why = reason(judge_agent(
            &talos_daemonset(),
            Some(&talos_config("false")),
            &WITHOUT_PROXY,
        ));
        assert!(
            why.message.contains("kubeProxyReplacement=true"),
            "{}",
            why.message
        );
        let mut missing = talos_config("false");
        missing.remove("kube-proxy-replacement");
        let why = reason(judge_agent(
            &talos_daemonset(),
            Some(&missing),
            &WITHOUT_PROXY,
        ));
        assert!(why.message.contains("not set"), "{}", why.message);
        // Beside a running kube-proxy, a replacing Cilium still runs.
        assert_eq!(
            judge_agent(&talos_daemonset(), Some(&talos_config("true")), &WITH_PROXY),
            Ok(())
        );
    }

    #[test]
    fn without_kube_proxy_the_agent_needs_kube_prism() {
        let config = talos_config("true");
        let mut no_env = talos_daemonset();
        no_env["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        let why = reason(judge_agent(&no_env, Some(&config), &WITHOUT_PROXY));
        assert!(
            why.message.contains("k8sServiceHost=localhost"),
            "{}",
            why.message
        );

        let mut port = talos_daemonset();
        port["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] = json!("6443");
        let why = reason(judge_agent(&port, Some(&config), &WITHOUT_PROXY));
        assert!(
            why.message.contains("k8sServicePort=7445"),
            "{}",
            why.message
        );

        let mut host = talos_daemonset();
        host["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("10.0.0.1");
        let why = reason(judge_agent(&host, Some(&config), &WITHOUT_PROXY));
        assert!(why.message.contains("\"10.0.0.1\""), "{}", why.message);

        let no_prism = TalosNode {
            kube_proxy: false,
            kube_prism_port: None,
        };
        let why = reason(judge_agent(&talos_daemonset(), Some(&config), &no_prism));
        assert!(
            why.message.contains("KubePrism is disabled"),
            "{}",
            why.message
        );
    }

    #[test]
    fn a_missing_config_map_keeps_the_pod_creating() {
        let why = reason(judge_agent(&talos_daemonset(), None, &WITH_PROXY));
        assert_eq!(why.reason, "ContainerCreating");
        assert!(why.message.contains("cilium-config"));
    }

    #[test]
    fn pod_status_says_why() {
        let ok = agent_pod_status(&Ok(()), "t");
        assert_eq!(ok["phase"], "Running");
        assert_eq!(ok["conditions"][3]["status"], "True");
        let why = AgentNotReady {
            container: "mount-cgroup".into(),
            init: true,
            reason: "CrashLoopBackOff",
            message: "m".into(),
        };
        let s = agent_pod_status(&Err(why), "t");
        assert_eq!(s["phase"], "Pending");
        assert_eq!(s["reason"], "Init:CrashLoopBackOff");
        assert_eq!(s["message"], "m");
        assert_eq!(s["conditions"][3]["type"], "Ready");
        assert_eq!(s["conditions"][3]["status"], "False");
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["waiting"]["reason"],
            "CrashLoopBackOff"
        );
    }
}
