//! Ichor's install manifest as data (pure): the objects the installer path
//! applies — namespace, CRDs, the controller's identity and Deployment — and
//! the IchorInstallation; plus the Cilium network policies of the gate.
//! One source: `dist/install.yaml` is to be generated from [`install_objects`].

use ichor_api::{DeploymentSpec, IchorInstallation, IchorInstallationSpec, Manager};
use serde_json::{Value, json};

/// The controller's name (Deployment, ServiceAccount, ClusterRole).
pub const CONTROLLER: &str = "ichor-controller";
/// The installer path's controller carries this `app.kubernetes.io/name`; the
/// chart's selector label is `ichor`, which marks a Helm install (spec 4.3).
pub const INSTALLER_NAME_LABEL: &str = "ichor-controller";
/// The identity of the ichor-cni Job.
pub const CNI_IDENTITY: &str = "ichor-cni";
/// The controller image repository.
pub const CONTROLLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller";
/// The installer image repository (IchorInstallation default).
pub const INSTALLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-installer";

/// The controller image of Ichor `version`.
pub fn controller_image(version: &str) -> String {
    format!("{CONTROLLER_IMAGE}:{version}")
}

/// Every object of the installer path for Ichor `version` (with its v), in
/// apply order, running `image`. The IchorInstallation is separate: it needs
/// the CRDs first.
pub fn install_objects(version: &str, image: &str) -> Vec<Value> {
    let ns = ichor_api::SYSTEM_NAMESPACE;
    let labels = json!({
        "app.kubernetes.io/name": INSTALLER_NAME_LABEL,
        "app.kubernetes.io/part-of": "ichor",
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/managed-by": "ichor-installer",
    });
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"app.kubernetes.io/part-of": "ichor"}}
    })];
    objects.extend(
        ichor_api::crds::all()
            .into_iter()
            .map(|crd| serde_json::to_value(crd).expect("CRD serialises")),
    );
    objects.push(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels}
    }));
    objects.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": CONTROLLER, "labels": labels},
        "rules": [
            {"apiGroups": [ichor_api::GROUP], "resources": ["*"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
        ]
    }));
    objects.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": CONTROLLER, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CONTROLLER},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": ns}]
    }));
    // The ichor-cni identity: the Job that applies Ichor's Cilium release
    // needs cluster-admin-equivalent rights the controller itself never holds.
    objects.push(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": CNI_IDENTITY, "namespace": ns, "labels": labels}
    }));
    objects.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": CNI_IDENTITY, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": CNI_IDENTITY, "namespace": ns}]
    }));
    objects.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": INSTALLER_NAME_LABEL}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": CONTROLLER,
                    "containers": [{
                        "name": "controller",
                        "image": image,
                        "args": ["controller", "--deployed-by", "installer", "--cni-job-image", image],
                        "ports": [{"name": "webhook", "containerPort": 9443}, {"name": "metrics", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
                    }]
                }
            }
        }
    }));
    objects
}

/// The IchorInstallation singleton of the installer path.
pub fn installation(version: &str) -> IchorInstallation {
    let mut inst = IchorInstallation::new(
        ichor_api::INSTALLATION_NAME,
        IchorInstallationSpec {
            version: version.to_string(),
            deployment: DeploymentSpec {
                manager: Manager::Installer,
            },
            installer_repository: Some(INSTALLER_IMAGE.to_string()),
        },
    );
    inst.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.to_string());
    inst
}

/// Ichor's CiliumNetworkPolicies for `ichor-system`: the controller may reach
/// the API server and the nodes' Talos API; the API server may reach the
/// webhooks. Applied only when the gate says so (spec 2.1).
pub fn cilium_policies() -> Vec<Value> {
    let ns = ichor_api::SYSTEM_NAMESPACE;
    vec![json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": CONTROLLER, "namespace": ns, "labels": {"app.kubernetes.io/part-of": "ichor"}},
        "spec": {
            "endpointSelector": {"matchLabels": {"app.kubernetes.io/name": INSTALLER_NAME_LABEL}},
            "ingress": [{"fromEntities": ["kube-apiserver", "host", "remote-node"],
                "toPorts": [{"ports": [{"port": "9443", "protocol": "TCP"}, {"port": "8080", "protocol": "TCP"}]}]}],
            "egress": [
                {"toEntities": ["kube-apiserver"]},
                {"toEntities": ["host", "remote-node"], "toPorts": [{"ports": [{"port": "50000", "protocol": "TCP"}]}]},
                {"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s-app": "kube-dns"}}],
                    "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}]}]}
            ]
        }
    })]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installer_controller_is_not_mistaken_for_a_helm_install() {
        let objects = install_objects("v0.1.0", &controller_image("v0.1.0"));
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_ne!(
            deployment["metadata"]["labels"]["app.kubernetes.io/name"],
            crate::inspect::CHART_SELECTOR_LABEL.1
        );
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "ghcr.io/maeshinshin/ichor-controller:v0.1.0"
        );
        assert_eq!(objects[0]["kind"], "Namespace");
        assert_eq!(
            objects
                .iter()
                .filter(|o| o["kind"] == "CustomResourceDefinition")
                .count(),
            4
        );
    }

    #[test]
    fn the_installation_is_the_installer_path_singleton() {
        let i = installation("v0.1.0");
        assert_eq!(i.spec.deployment.manager, Manager::Installer);
        assert_eq!(
            i.metadata.name.as_deref(),
            Some(ichor_api::INSTALLATION_NAME)
        );
    }
}
