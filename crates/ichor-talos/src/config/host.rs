//! Typed multi-document kinds about the host rather than Kubernetes:
//! discovery's service, the resolver and the hostname.
//!
//! As in [`super::kube`], field names follow the YAML keys Talos writes, in
//! its order; each struct keeps the keys it does not model in `extra`.

use serde::{Deserialize, Serialize};

use super::Extra;

/// `DiscoveryServiceConfig`: one discovery service the node registers with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Service name (`default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The service's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `hostDNS`: Talos's caching DNS resolver on the host (in `ResolverConfig`
/// and the legacy `machine.features`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostDns {
    /// `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `forwardKubeDNSToHost`: the cluster's DNS forwards to the host's resolver.
    #[serde(
        rename = "forwardKubeDNSToHost",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub forward_kube_dns_to_host: Option<bool>,
    /// Fields Ichor does not model (`resolveMemberNames`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ResolverConfig`: the node's DNS resolution.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolverConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `hostDNS`.
    #[serde(rename = "hostDNS", default, skip_serializing_if = "Option::is_none")]
    pub host_dns: Option<HostDns>,
    /// Fields Ichor does not model (`nameservers`, `searchDomains`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `HostnameConfig`: the node's hostname, set or chosen by Talos.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostnameConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `auto`: how Talos chooses a hostname when none is set (`stable`, `off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<String>,
    /// Fields Ichor does not model (`hostname`: kept here so that an
    /// explicit `hostname: null` is written back as read).
    #[serde(flatten)]
    pub extra: Extra,
}
