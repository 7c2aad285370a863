//! Ichor's install manifest as data (pure): the objects the installer path
//! applies — namespace, CRDs, the controller's identity and Deployment, the
//! admission webhooks and their Service — and the IchorInstallation; plus the
//! Cilium network policies of the gate. One source: `dist/install.yaml` and
//! the chart's generated parts are generated from these functions.
//!
//! The webhooks' serving certificate cannot be a fixed part of a manifest:
//! [`webhook_certificate`] makes one (adopt creates its Secret once and keeps
//! it on a rerun) and [`set_ca_bundle`] puts its CA into the configuration.

use ichor_api::{DeploymentSpec, IchorInstallation, IchorInstallationSpec, Manager};
use serde_json::{Value, json};

/// The controller's name (Deployment, ServiceAccount, ClusterRole).
pub const CONTROLLER: &str = "ichor-controller";
/// The installer path's controller carries this `app.kubernetes.io/name`; the
/// chart's selector label is `ichor`, which marks a Helm install (R4.3a).
pub const INSTALLER_NAME_LABEL: &str = "ichor-controller";
/// The label the chart puts on the controller Deployment's selector: a
/// Deployment carrying it is a Helm install of Ichor (R4.3a).
pub const CHART_SELECTOR_LABEL: (&str, &str) = ("app.kubernetes.io/name", "ichor");
/// The identity of the ichor-cni Job.
pub const CNI_IDENTITY: &str = "ichor-cni";
/// The ServiceAccount of the installer Job a TalosOperation of kind `ichor`
/// runs: it applies Ichor's own install manifest (CRDs, RBAC, webhooks), which
/// takes cluster-admin rights the controller itself never holds.
pub const INSTALLER_IDENTITY: &str = "ichor-installer";
/// The controller image repository.
pub const CONTROLLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller";
/// The installer image repository (IchorInstallation default).
pub const INSTALLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-installer";

/// The webhooks' Service in `ichor-system` (the chart names it the same).
pub const WEBHOOK_SERVICE: &str = "ichor-webhook";
/// The `kubernetes.io/tls` Secret of the webhooks' serving certificate.
pub const WEBHOOK_CERT_SECRET: &str = "ichor-webhook-tls";
/// The ValidatingWebhookConfiguration (the chart names it the same).
pub const WEBHOOK_CONFIGURATION: &str = "ichor-validating-webhooks";
/// The MutatingWebhookConfiguration that stamps who changed a spec (the
/// chart names it the same).
pub const MUTATING_WEBHOOK_CONFIGURATION: &str = "ichor-mutating-webhooks";

/// Whether `kind` is one of the two webhook configuration kinds: applied
/// after the controller serves, with the certificate's CA, and deleted first.
pub fn is_webhook_configuration(kind: &Value) -> bool {
    kind == "ValidatingWebhookConfiguration" || kind == "MutatingWebhookConfiguration"
}
/// The container port the controller serves its webhooks on.
pub const WEBHOOK_PORT: u16 = 9443;
/// The container port of /healthz, /readyz and /metrics.
pub const HTTP_PORT: u16 = 8080;
/// How long the installer path's webhook certificate is valid (as the chart's
/// default `webhook.certValidityDays`); the controller reloads a renewed one.
pub const WEBHOOK_CERT_VALIDITY_DAYS: u32 = 3650;
/// The kinds Ichor's webhooks validate (lower case, as in their paths).
pub const WEBHOOK_KINDS: [&str; 3] = ["taloscluster", "talosmachine", "talosoperation"];

/// The controller image of Ichor `version`.
pub fn controller_image(version: &str) -> String {
    format!("{CONTROLLER_IMAGE}:{version}")
}

/// The controller's rights across the cluster, each one used (measured from
/// the API server's audit log by `crates/ichor/tests/it/least_privilege_e2e.rs`).
/// Secrets: `get` only, since the secrets bundle lives beside its TalosCluster
/// in any namespace and is named by the cluster's spec.
pub fn controller_cluster_rules() -> Value {
    json!([
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosclusters"], "verbs": ["get", "list", "watch"]},
        // TalosMachines: the membership and history finalizers (patch), and a replaced
        // control plane's spec.removal and deletion once its replacement
        // counts in etcd.
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosmachines"], "verbs": ["get", "list", "watch", "patch", "delete"]},
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosclusters/status", "talosmachines/status", "ichorinstallations/status"], "verbs": ["patch"]},
        {"apiGroups": [ichor_api::GROUP], "resources": ["ichorinstallations"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
        // TalosOperations: the finalizer, the status, and the drain before a
        // reboot (cordon, evictions that honour PodDisruptionBudgets).
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosoperations"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosoperations/status"], "verbs": ["patch"]},
        // Backups: the schedule creates TalosBackups and retention deletes
        // them; the reconciler records each one's progress in its status.
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosbackups"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosbackups/status"], "verbs": ["patch"]},
        // Nodes: cordoned before a drain; a removed machine's Node deleted.
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]},
        // The CNI hand-over's last step (R6.1): Talos's bootstrap-manifests
        // inventory (that one ConfigMap, in kube-system) loses the objects of
        // Ichor's Cilium release, and those objects lose Talos's
        // owning-inventory annotation (a merge patch of that key alone), so
        // `talosctl upgrade-k8s` cannot prune them. The kinds are those the
        // Cilium chart renders, Secrets and RBAC objects excepted (the
        // controller never writes a Secret, and may not update a role it does
        // not hold).
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [ichor_talos::bootstrap_inventory::INVENTORY_NAME], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["namespaces", "serviceaccounts", "configmaps", "services"], "verbs": ["patch"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments"], "verbs": ["patch"]},
        // A kubernetes-upgrade's last step, the bootstrap-manifests sync
        // (ADR 0014): each object of Talos's manifests of a kind it writes
        // is read first (to leave a missing one to Talos and one a Helm
        // release owns to Helm), then applied with the patch rights above.
        {"apiGroups": [""], "resources": ["serviceaccounts", "configmaps", "services"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
        // Health checks (spec.healthChecks of a TalosOperation) read the
        // workloads they name; another kind needs its own grant (a check
        // that may not read its target pauses the operation saying so).
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "daemonsets"], "verbs": ["get", "list"]},
        // The TalosOperation webhook asks whether an operation's creator may
        // read what its health checks read (a check they may not read is
        // refused: status would show them what it found).
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        // The controller asks once who it is, so that its own write carrying
        // out a rollback keeps the name of the user who asked for it (every
        // authenticated user may by default; granted here so that the
        // ClusterRole says all the controller does).
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}
    ])
}

/// The web UI's identity and Deployment name (`ichor ui`).
pub const UI: &str = "ichor-ui";
/// The web UI's image repository (the `ichor` binary, run as `ichor ui`).
pub const UI_IMAGE: &str = "ghcr.io/maeshinshin/ichor-ui";
/// The web UI's HTTPS port (`ichorUI.port`).
pub const UI_PORT: u16 = 8443;

/// The UI image of Ichor `version`.
pub fn ui_image(version: &str) -> String {
    format!("{UI_IMAGE}:{version}")
}

/// What the UI reads: reflector caches of Ichor's four kinds. This is all a
/// read-only UI (`settings.readOnly`) gets besides `system:auth-delegator`.
pub fn ui_read_rules() -> Value {
    json!([
        {"apiGroups": [ichor_api::GROUP], "resources": ["talosclusters", "talosmachines", "talosoperations", "ichorinstallations"], "verbs": ["get", "list", "watch"]}
    ])
}

/// The web UI for Ichor `version`, running `image` in `ichor-system` under
/// its own ServiceAccount, HTTPS on [`UI_PORT`] with a self-signed
/// certificate (the installer path has no certificate to give it); with
/// `read_only`, `--read-only` and the read rules alone. Not part of
/// [`install_objects`]: the UI is opt-in, as in the chart (`ichorUI.enabled`).
pub fn ui_objects(version: &str, image: &str, read_only: bool) -> Vec<Value> {
    let ns = ichor_api::SYSTEM_NAMESPACE;
    let mut labels = installer_labels(version);
    labels["app.kubernetes.io/name"] = json!(UI);
    // Reads only, read-only or not: the UI's actions are made with the
    // signed-in user's own token, so its ServiceAccount writes nothing.
    let rules = ui_read_rules();
    let mut args = vec![
        json!("ui"),
        json!("--listen"),
        json!(format!("0.0.0.0:{UI_PORT}")),
    ];
    if read_only {
        args.push(json!("--read-only"));
    }
    let subject = json!([{"kind": "ServiceAccount", "name": UI, "namespace": ns}]);
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": UI, "namespace": ns, "labels": labels}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": UI, "labels": labels},
            "rules": rules
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": UI, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": UI},
            "subjects": subject
        }),
        // Sign-in (TokenReview) and the per-action checks (SubjectAccessReview).
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{UI}-auth-delegator"), "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
            "subjects": subject
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": UI, "namespace": ns, "labels": labels},
            "spec": {
                "selector": {"app.kubernetes.io/name": UI},
                "ports": [{"name": "https", "port": UI_PORT, "targetPort": "https"}]
            }
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": UI, "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": UI}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": UI,
                        "containers": [{
                            "name": "ui",
                            "image": image,
                            "args": args,
                            "ports": [{"name": "https", "containerPort": UI_PORT}],
                            "readinessProbe": {"httpGet": {"scheme": "HTTPS", "path": "/healthz", "port": "https"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
                        }]
                    }
                }
            }
        }),
    ]
}

/// The controller's rights in its own namespace: watching Secrets (its
/// Cilium release's records), its leader Lease, and the Jobs that run as
/// `ichor-cni` and `ichor-installer` — only here, where those identities
/// live, so no other namespace's Jobs can borrow them.
pub fn controller_namespace_rules() -> Value {
    json!([
        // create, update, delete: the machines' history Secrets (ADR 0022;
        // deleted with a machine outside this namespace).
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch", "create", "update", "delete"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ])
}

/// The annotation that lets a TalosCluster's `spec.cni.cilium.values` set
/// what would otherwise make a namespace's editors cluster-admin (images,
/// host paths, extra containers, ServiceAccounts). Only a user who may
/// `privileged-values` on talosclusters (an RBAC verb of Ichor's own;
/// cluster-admin has it) may set or change it: [`admission_policies`].
pub const PRIVILEGED_VALUES_ANNOTATION: &str = ichor_api::PRIVILEGED_VALUES_ANNOTATION;
/// The RBAC verb that allows setting [`PRIVILEGED_VALUES_ANNOTATION`].
pub const PRIVILEGED_VALUES_VERB: &str = "privileged-values";
/// The ValidatingAdmissionPolicy bounding the Jobs Ichor's controller creates.
pub const JOBS_POLICY: &str = "ichor-controller-jobs";
/// The ValidatingAdmissionPolicy bounding the Deployments and DaemonSets
/// the controller changes.
pub const WORKLOADS_POLICY: &str = "ichor-controller-workloads";
/// The ValidatingAdmissionPolicy guarding the privileged-values opt-in.
pub const OPT_IN_POLICY: &str = "ichor-privileged-opt-ins";
/// The ValidatingAdmissionPolicy guarding the any-installer-image opt-in.
pub const INSTALLER_OPT_IN_POLICY: &str = "ichor-upgrade-image-opt-in";
/// The RBAC verb that allows setting the any-installer-image annotation.
pub const ANY_INSTALLER_IMAGE_VERB: &str = "any-installer-image";

/// An image reference without its tag or digest
/// (`registry:5000/ichor:v1` → `registry:5000/ichor`).
pub fn image_repository(image: &str) -> &str {
    let name = image.split_once('@').map_or(image, |(name, _)| name);
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => name,
    }
}

/// Admission policies the API server itself enforces (CEL; no webhook, so
/// they hold even while Ichor's pod is down):
/// - the Jobs the controller's ServiceAccount creates in `ns` that run as
///   `ichor-cni` or `ichor-installer` run Ichor's own image (`image_repository`,
///   any tag) with Ichor's own arguments, one container, no init container
///   and no host path: the controller's token cannot become those identities
///   for anything else;
/// - a Deployment or DaemonSet the controller's ServiceAccount changes keeps
///   its `spec` unless it is in `kube-system` or carries Talos's
///   bootstrap-manifests inventory annotation (the kubernetes-upgrade's
///   sync brings only Talos's objects to Talos's manifests; the CNI
///   hand-over changes metadata alone), and the controller never stamps that
///   annotation on a workload: its token cannot rewrite an application's
///   pods;
/// - the privileged-values annotation on a TalosCluster, and the
///   any-installer-image annotation on a TalosOperation, are set or changed
///   only by a user the authorizer allows the matching verb
///   (`opt_in_policy`).
pub fn admission_policies(ns: &str, image_repository: &str) -> Vec<Value> {
    let controller = format!("system:serviceaccount:{ns}:{CONTROLLER}");
    let jobs = format!(
        "!(object.spec.template.spec.serviceAccountName in ['ichor-cni', 'ichor-installer']) || (\
         size(object.spec.template.spec.containers) == 1 && \
         !has(object.spec.template.spec.initContainers) && \
         (!has(object.spec.template.spec.volumes) || object.spec.template.spec.volumes.all(v, !has(v.hostPath))) && \
         object.spec.template.spec.containers.all(c, (c.image.startsWith('{image_repository}:') || c.image.startsWith('{image_repository}@')) && !has(c.command) && has(c.args) && \
           (object.spec.template.spec.serviceAccountName == 'ichor-cni' \
             ? (size(c.args) == 7 && c.args[0] == 'cni' && c.args[1] == 'helm' && c.args[2] == 'apply' && c.args[3] == '--cluster' && c.args[5] == '--namespace') \
             : (size(c.args) == 3 && c.args[0] == 'install' && c.args[1] == '--to'))))"
    );
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": JOBS_POLICY},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]},
                "matchConditions": [{"name": "made-by-ichor-controller", "expression": format!("request.userInfo.username == '{controller}'")}],
                "validations": [{"expression": jobs,
                    "message": "a Job that runs as ichor-cni or ichor-installer must run Ichor's own image with Ichor's own arguments (one container, no init container, no host path)"}]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": JOBS_POLICY},
            "spec": {"policyName": JOBS_POLICY, "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}
        }),
    ]
    .into_iter()
    .chain(workloads_policy(&controller))
    .chain(opt_in_policy(
        OPT_IN_POLICY,
        "talosclusters",
        PRIVILEGED_VALUES_ANNOTATION,
        PRIVILEGED_VALUES_VERB,
    ))
    .chain(opt_in_policy(
        INSTALLER_OPT_IN_POLICY,
        "talosoperations",
        ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION,
        ANY_INSTALLER_IMAGE_VERB,
    ))
    .collect()
}

/// The policy and binding of [`WORKLOADS_POLICY`] for the controller's
/// username.
fn workloads_policy(controller: &str) -> [Value; 2] {
    use ichor_talos::bootstrap_inventory::{
        INVENTORY_NAME, OWNING_INVENTORY_ANNOTATION, WORKLOADS_NAMESPACE,
    };
    let annotation = |o: &str| {
        format!(
            "(has({o}.metadata.annotations) && '{OWNING_INVENTORY_ANNOTATION}' in {o}.metadata.annotations \
             ? {o}.metadata.annotations['{OWNING_INVENTORY_ANNOTATION}'] : '')"
        )
    };
    let (old, new) = (annotation("oldObject"), annotation("object"));
    let spec = format!(
        "object.spec == oldObject.spec || object.metadata.namespace == '{WORKLOADS_NAMESPACE}' || {old} == '{INVENTORY_NAME}'"
    );
    let stamp = format!("{new} == '' || {new} == {old}");
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": WORKLOADS_POLICY},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["daemonsets", "deployments"]}]},
                "matchConditions": [{"name": "made-by-ichor-controller", "expression": format!("request.userInfo.username == '{controller}'")}],
                "validations": [
                    {"expression": spec,
                     "message": format!("Ichor's controller may change the spec of a Deployment or DaemonSet only in {WORKLOADS_NAMESPACE} or on one Talos's bootstrap manifests own (annotation {OWNING_INVENTORY_ANNOTATION}: {INVENTORY_NAME})")},
                    {"expression": stamp,
                     "message": format!("Ichor's controller may keep or remove the annotation {OWNING_INVENTORY_ANNOTATION} on a Deployment or DaemonSet, never set it")}
                ]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": WORKLOADS_POLICY},
            "spec": {"policyName": WORKLOADS_POLICY, "validationActions": ["Deny"]}
        }),
    ]
}

/// A policy and its binding: annotation `key` on Ichor's `resource` may be
/// set or changed only by a user the authorizer allows `verb` on that
/// resource in the object's namespace (an RBAC verb of Ichor's own, which
/// cluster-admin holds).
fn opt_in_policy(name: &str, resource: &str, key: &str, verb: &str) -> [Value; 2] {
    let group = ichor_api::GROUP;
    let expression = format!(
        "(!has(object.metadata.annotations) || !('{key}' in object.metadata.annotations)) || \
         (oldObject != null && has(oldObject.metadata.annotations) && '{key}' in oldObject.metadata.annotations && \
          oldObject.metadata.annotations['{key}'] == object.metadata.annotations['{key}']) || \
         authorizer.group('{group}').resource('{resource}').namespace(object.metadata.namespace).check('{verb}').allowed()"
    );
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"], "resources": [resource]}]},
                "validations": [{"expression": expression,
                    "message": format!("only a user allowed the '{verb}' verb on {resource}.{group} may set or change the annotation {key}")}]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}
        }),
    ]
}

/// Every object of the installer path for Ichor `version` (with its v), in
/// apply order, running `image`. The IchorInstallation is separate: it needs
/// the CRDs first.
pub fn install_objects(version: &str, image: &str) -> Vec<Value> {
    let ns = ichor_api::SYSTEM_NAMESPACE;
    let labels = installer_labels(version);
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"app.kubernetes.io/part-of": "ichor"}}
    })];
    objects.extend(
        ichor_api::crds::all()
            .into_iter()
            .map(|crd| serde_json::to_value(crd).expect("CRD serialises")),
    );
    objects.extend(controller_identity(ns, &labels));
    objects.extend(cni_identity(ns, &labels));
    objects.extend(installer_identity(ns, &labels));
    objects.push(controller_deployment(ns, &labels, image));
    objects.push(webhook_service(ns, &labels));
    objects.push(webhook_configuration(ns, &labels));
    objects.push(mutating_webhook_configuration(ns, &labels));
    objects.extend(admission_policies(ns, image_repository(image)));
    objects
}

/// The labels on every object of the installer path for Ichor `version`.
fn installer_labels(version: &str) -> Value {
    json!({
        "app.kubernetes.io/name": INSTALLER_NAME_LABEL,
        "app.kubernetes.io/part-of": "ichor",
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/managed-by": "ichor-installer",
    })
}

/// The controller's ServiceAccount in `ns` and the roles and bindings that
/// give it its rights (cluster-wide and in its own namespace).
fn controller_identity(ns: &str, labels: &Value) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": CONTROLLER, "labels": labels},
            "rules": controller_cluster_rules()
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels},
            "rules": controller_namespace_rules()
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER},
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": ns}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": CONTROLLER, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CONTROLLER},
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": ns}]
        }),
    ]
}

/// The ichor-cni identity in `ns`: the Job that applies Ichor's Cilium
/// release needs cluster-admin-equivalent rights the controller itself never
/// holds.
fn cni_identity(ns: &str, labels: &Value) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": CNI_IDENTITY, "namespace": ns, "labels": labels}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": CNI_IDENTITY, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": CNI_IDENTITY, "namespace": ns}]
        }),
    ]
}

/// The installer identity in `ns` ([`INSTALLER_IDENTITY`]), bound to
/// cluster-admin: the installer Job replaces Ichor's own RBAC and CRDs.
fn installer_identity(ns: &str, labels: &Value) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": INSTALLER_IDENTITY, "namespace": ns, "labels": labels}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": INSTALLER_IDENTITY, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": INSTALLER_IDENTITY, "namespace": ns}]
        }),
    ]
}

/// The controller's Deployment in `ns`, running `image` (which is also the
/// ichor-cni Job's image).
fn controller_deployment(ns: &str, labels: &Value, image: &str) -> Value {
    json!({
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
                        "args": ["controller", "--deployed-by", "installer", "--cni-job-image", image,
                            "--http-addr", format!("0.0.0.0:{HTTP_PORT}"),
                            "--webhook-addr", format!("0.0.0.0:{WEBHOOK_PORT}"),
                            "--webhook-cert-secret", WEBHOOK_CERT_SECRET],
                        // Operations reboot the controller's own node last.
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "ports": [{"name": "webhook", "containerPort": WEBHOOK_PORT}, {"name": "metrics", "containerPort": HTTP_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
                    }]
                }
            }
        }
    })
}

/// The webhooks' Service [`WEBHOOK_SERVICE`] in `ns`, in front of the
/// controller's webhook port.
fn webhook_service(ns: &str, labels: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": WEBHOOK_SERVICE, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"app.kubernetes.io/name": INSTALLER_NAME_LABEL},
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook"}]
        }
    })
}

/// The ValidatingWebhookConfiguration calling the Service in `ns`. No
/// caBundle here: adopt sets the CA of the certificate it made
/// (`set_ca_bundle`); until then the API server cannot call the webhooks.
fn webhook_configuration(ns: &str, labels: &Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION, "labels": labels},
        "webhooks": webhooks(ns, None, "Fail", 10)
    })
}

/// Ichor's validating webhooks, called through the Service
/// [`WEBHOOK_SERVICE`] in `namespace` (`ca_bundle`: its CA, base64 as the
/// configuration carries it). The chart renders the same list.
pub fn webhooks(
    namespace: &str,
    ca_bundle: Option<&str>,
    failure_policy: &str,
    timeout_seconds: u32,
) -> Vec<Value> {
    WEBHOOK_KINDS
        .iter()
        .map(|kind| {
            let mut client_config = json!({"service": {
                "name": WEBHOOK_SERVICE, "namespace": namespace,
                "path": format!("/validate-ichor-maesh-dev-v1alpha1-{kind}"), "port": 443}});
            if let Some(ca) = ca_bundle {
                client_config["caBundle"] = json!(ca);
            }
            json!({
                "name": format!("{kind}.{}", ichor_api::GROUP),
                "clientConfig": client_config,
                "rules": [{"apiGroups": [ichor_api::GROUP], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"], "resources": [format!("{kind}s")]}],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": failure_policy,
                "timeoutSeconds": timeout_seconds
            })
        })
        .collect()
}

/// The MutatingWebhookConfiguration calling the Service in `ns`.
fn mutating_webhook_configuration(ns: &str, labels: &Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": MUTATING_WEBHOOK_CONFIGURATION, "labels": labels},
        "webhooks": mutating_webhooks(ns, None, 10)
    })
}

/// Ichor's mutating webhook: the changed-by stamp on every create and spec
/// change of a TalosCluster or TalosMachine. It fails closed, as the
/// validating ones do: a spec written while it is down would carry the
/// previous writer's name (docs/adr/0022-config-history.md).
pub fn mutating_webhooks(
    namespace: &str,
    ca_bundle: Option<&str>,
    timeout_seconds: u32,
) -> Vec<Value> {
    let mut client_config = json!({"service": {
        "name": WEBHOOK_SERVICE, "namespace": namespace, "path": ichor_api::history::CHANGED_BY_WEBHOOK_PATH, "port": 443}});
    if let Some(ca) = ca_bundle {
        client_config["caBundle"] = json!(ca);
    }
    vec![json!({
        "name": format!("changed-by.{}", ichor_api::GROUP),
        "clientConfig": client_config,
        "rules": [{"apiGroups": [ichor_api::GROUP], "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["talosclusters", "talosmachines"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": timeout_seconds
    })]
}

/// Puts `ca_pem` (the webhook certificate's CA) into every webhook of a
/// Validating- or MutatingWebhookConfiguration object.
pub fn set_ca_bundle(configuration: &mut Value, ca_pem: &[u8]) {
    let encoded =
        serde_json::to_value(k8s_openapi::ByteString(ca_pem.to_vec())).expect("bytes serialise");
    if let Some(list) = configuration["webhooks"].as_array_mut() {
        for w in list {
            w["clientConfig"]["caBundle"] = encoded.clone();
        }
    }
}

/// A serving certificate for the webhooks' Service, as the `kubernetes.io/tls`
/// Secret [`WEBHOOK_CERT_SECRET`] (its own CA in `ca.crt`). Not pure: the keys
/// are new each call; adopt creates the Secret once and keeps it.
pub fn webhook_certificate(namespace: &str) -> Value {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = std::time::SystemTime::now();
    let until = now + std::time::Duration::from_secs(u64::from(WEBHOOK_CERT_VALIDITY_DAYS) * 86400);
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "ichor-webhook-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now.into();
    ca.not_after = until.into();
    let ca_key = KeyPair::generate().expect("generate the webhook CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("self-sign the webhook CA");
    let issuer = Issuer::new(ca, ca_key);
    let host = format!("{WEBHOOK_SERVICE}.{namespace}.svc");
    let names = vec![
        host.clone(),
        format!("{host}.cluster.local"),
        format!("{WEBHOOK_SERVICE}.{namespace}"),
        WEBHOOK_SERVICE.to_string(),
    ];
    let mut leaf = CertificateParams::new(names).expect("the Service's names are DNS names");
    leaf.distinguished_name.push(DnType::CommonName, host);
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.not_before = now.into();
    leaf.not_after = until.into();
    let key = KeyPair::generate().expect("generate the webhook key");
    let cert = leaf
        .signed_by(&key, &issuer)
        .expect("sign the webhook certificate");
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": WEBHOOK_CERT_SECRET, "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ichor", "app.kubernetes.io/component": "webhook"}},
        "type": "kubernetes.io/tls",
        "stringData": {"ca.crt": ca_cert.pem(), "tls.crt": cert.pem(), "tls.key": key.serialize_pem()}
    })
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
/// webhooks. Applied only when the gate says so (R2.1a).
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
            CHART_SELECTOR_LABEL.1
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
            5
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

    #[test]
    fn the_read_only_ui_may_only_read() {
        let objects = ui_objects("v0.1.0", &ui_image("v0.1.0"), true);
        let role = objects.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{rule}");
        }
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], UI);
        assert_eq!(
            pod["containers"][0]["args"],
            json!(["ui", "--listen", "0.0.0.0:8443", "--read-only"])
        );
        // Read-write too: the actions carry the user's token, not the UI's.
        let rw = ui_objects("v0.1.0", "x", false);
        let role = rw.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{rule}");
        }
    }
}
