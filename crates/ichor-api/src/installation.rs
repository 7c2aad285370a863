//! `IchorInstallation`: the singleton that records how Ichor itself is installed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The one name an IchorInstallation may have.
pub const SINGLETON_NAME: &str = "ichor";

/// How Ichor is installed in this cluster: its version and who manages the
/// install (Ichor's installer Job, or Helm). A singleton named `ichor` in
/// `ichor-system`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "IchorInstallation",
    doc = "The singleton (named ichor) that records how Ichor itself is installed.",
    plural = "ichorinstallations",
    singular = "ichorinstallation",
    shortname = "ichorinst",
    category = "ichor",
    namespaced,
    status = "IchorInstallationStatus",
    derive = "PartialEq",
    validation = Rule::new("self.metadata.name == 'ichor'").message("an IchorInstallation is a singleton and must be named ichor"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Manager", type_ = "string", json_path = ".spec.deployment.manager"),
    printcolumn(name = "Installed", type_ = "string", json_path = ".status.installedVersion"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct IchorInstallationSpec {
    /// The Ichor version that should run (for example v0.1.0).
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+.*$')").message("spec.version must look like v0.1.0"))]
    pub version: String,
    /// Who installs and upgrades Ichor.
    #[serde(default)]
    pub deployment: DeploymentSpec,
    /// The image repository of the installer Job (manager installer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_repository: Option<String>,
}

/// Who manages Ichor's own install.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    /// installer: Ichor's installer Job; helm: a Helm release of the ichor
    /// chart. Authoritative once the object exists.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.deployment.manager is immutable: it records how Ichor was installed"))]
    pub manager: Manager,
}

/// installer or helm.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Manager {
    #[default]
    Installer,
    Helm,
}

/// What the controller observes about Ichor's install.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IchorInstallationStatus {
    /// The Ichor version that runs now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,
    /// Ready, among others (see ichor_api::conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
