//! What of a machine config may be shown: redaction by default.
//!
//! A value of a machine-config path is shown only when the path is on
//! [`PUBLIC_PATHS`], the allow-list of paths known to hold no secret, and its
//! own key is not one of [`SECRET_KEYS`]. Every other value — documents
//! Ichor does not model (their header aside), unknown fields, anything Talos
//! adds tomorrow — is shown as a
//! stable digest plus its length ([`digest`]), so a change stays visible and
//! the value does not. The table and its reasons are in
//! `docs/adr/0013-redaction-by-default.md`; a test keeps the two equal.

use serde_yaml_ng::{Mapping, Value};
use sha2::{Digest as _, Sha256};

use crate::path::{ConfigPath, Segment};

/// Paths whose values hold no secret (patterns as in
/// [`ConfigPath::is_under`]: a path at or under one is public).
#[rustfmt::skip]
pub const PUBLIC_PATHS: &[&str] = &[
    // Every document's header.
    "version", "debug", "persist",
    "*.apiVersion", "*.kind", "*.name", "*[*].apiVersion", "*[*].kind", "*[*].name",
    // v1alpha1: the machine.
    "machine.type",
    "machine.certSANs",
    "machine.ca.crt",
    "machine.acceptedCAs[*].crt",
    "machine.kubelet",
    "machine.network",
    "machine.install",
    "machine.files[*].path",
    "machine.files[*].permissions",
    "machine.files[*].op",
    "machine.time",
    "machine.sysctls",
    "machine.sysfs",
    "machine.registries.mirrors",
    "machine.registries.config.*.tls.insecureSkipVerify",
    "machine.registries.config.*.tls.ca",
    "machine.registries.config.*.tls.clientIdentity.crt",
    "machine.systemDiskEncryption.*.provider",
    "machine.systemDiskEncryption.*.cipher",
    "machine.systemDiskEncryption.*.keySize",
    "machine.systemDiskEncryption.*.blockSize",
    "machine.systemDiskEncryption.*.options",
    "machine.systemDiskEncryption.*.keys[*].slot",
    "machine.systemDiskEncryption.*.keys[*].nodeID",
    "machine.systemDiskEncryption.*.keys[*].tpm",
    "machine.systemDiskEncryption.*.keys[*].kms.endpoint",
    "machine.features",
    "machine.udev",
    "machine.logging",
    "machine.kernel",
    "machine.nodeLabels",
    "machine.nodeAnnotations",
    "machine.nodeTaints",
    "machine.controlPlane",
    "machine.seccompProfiles",
    "machine.disks",
    // v1alpha1: the cluster.
    "cluster.controlPlane",
    "cluster.clusterName",
    "cluster.network",
    "cluster.apiServer",
    "cluster.controllerManager",
    "cluster.proxy",
    "cluster.scheduler",
    "cluster.discovery",
    "cluster.etcd.image",
    "cluster.etcd.extraArgs",
    "cluster.etcd.advertisedSubnets",
    "cluster.etcd.listenSubnets",
    "cluster.etcd.ca.crt",
    "cluster.ca.crt",
    "cluster.aggregatorCA.crt",
    "cluster.acceptedCAs[*].crt",
    "cluster.coreDNS",
    "cluster.externalCloudProvider",
    "cluster.extraManifests",
    "cluster.inlineManifests[*].name",
    "cluster.adminKubeconfig",
    "cluster.allowSchedulingOnControlPlanes",
    "cluster.allowSchedulingOnMasters",
    // Multi-document kinds. A kind Ichor does not type
    // (`ichor_talos::config::Document`) shows its header only, whatever
    // Talos puts in it; a typed kind shows, one by one, the fields its
    // struct names that hold no secret, so a field Talos adds tomorrow is a
    // digest until it is listed here.
    "KubePrismConfig.port", "KubePrismConfig.tlsServerName",
    "KubeNetworkConfig.dnsDomain", "KubeNetworkConfig.podSubnets",
    "KubeNetworkConfig.serviceSubnets",
    "KubeFlannelCNIConfig.backendType", "KubeFlannelCNIConfig.backendPort",
    "KubeProxyConfig.enabled", "KubeProxyConfig.image", "KubeProxyConfig.mode",
    "KubeExternalManifestConfig[*].url", "KubeExternalManifestConfig.url",
    "KubeClusterConfig.clusterName", "KubeClusterConfig.endpoint",
    "KubeAPIServerCAConfig.issuingCA.cert", "KubeAPIServerCAConfig.acceptedCAs",
    "KubeAggregatorCAConfig.issuingCA.cert", "KubeAggregatorCAConfig.acceptedCAs",
    "KubeServiceAccountConfig.issuer.issuerURL",
    "KubeletConfig.image",
    "DiscoveryIdentityConfig.clusterID",
    "UnattendedInstallConfig.installer.image",
    "UnattendedInstallConfig.provisioning.diskSelector.match",
    "UnattendedInstallConfig.provisioning.wipe",
    // Untyped kinds whose one field Ichor writes: the image a Kubernetes
    // upgrade retags (so the version change stays readable in drift).
    "KubeAPIServerConfig.image", "KubeControllerManagerConfig.image",
    "KubeSchedulerConfig.image",
];

/// Keys whose values are secret wherever they stand, even under a public
/// path (a WireGuard `privateKey` under `machine.network`, say).
pub const SECRET_KEYS: &[&str] = &[
    "key",
    "privateKey",
    "password",
    "passphrase",
    "secret",
    "clusterSecret",
    "token",
    "identityToken",
    "auth",
    "presharedKey",
    "headers",
    // Environment variables carry proxy credentials and API keys (Talos's
    // documentation shows `env` for proxy settings on the control-plane
    // components and credential providers).
    "env",
];

/// How many hex digits of the SHA-256 a digest shows.
const DIGEST_HEX: usize = 12;

/// The redaction rules: the allow-list and the keys that are always secret.
/// [`Redactor::default`] is the shipped table; tests build others to prove
/// the leak test can fail.
#[derive(Debug, Clone, Copy)]
pub struct Redactor<'a> {
    pub public_paths: &'a [&'a str],
    pub secret_keys: &'a [&'a str],
}

impl Default for Redactor<'static> {
    fn default() -> Self {
        Redactor {
            public_paths: PUBLIC_PATHS,
            secret_keys: SECRET_KEYS,
        }
    }
}

impl Redactor<'_> {
    /// Whether a value at `path` may be shown as it is: under a public path,
    /// and under no secret key at any depth (`cluster.apiServer.env.X` is
    /// secret although `cluster.apiServer` is public).
    pub fn is_public(&self, path: &ConfigPath) -> bool {
        let under_secret_key = path
            .0
            .iter()
            .any(|s| matches!(s, Segment::Key(k) if self.secret_keys.contains(&k.as_str())));
        !under_secret_key && self.public_paths.iter().any(|p| path.is_under(p))
    }

    /// `value` with every scalar that is not public replaced by its digest;
    /// mapping keys and the shape stay, so the reader sees where it changed.
    pub fn redact(&self, path: &ConfigPath, value: &Value) -> Value {
        match value {
            Value::Mapping(m) => {
                let mut out = Mapping::new();
                for (k, v) in m {
                    let key = match k {
                        Value::String(s) => s.clone(),
                        other => crate::drift::value_text(other),
                    };
                    out.insert(k.clone(), self.redact(&path.key(&key), v));
                }
                Value::Mapping(out)
            }
            Value::Sequence(items) => Value::Sequence(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let name = item
                            .as_mapping()
                            .and_then(|m| m.get("name"))
                            .and_then(Value::as_str)
                            .map_or_else(|| format!("#{}", i + 1), str::to_string);
                        self.redact(&path.item(&name), item)
                    })
                    .collect(),
            ),
            Value::Tagged(t) => self.redact(path, &t.value),
            scalar
                if self.is_public(path)
                    && !matches!(scalar, Value::String(s) if carries_credentials(s)) =>
            {
                scalar.clone()
            }
            Value::Null => Value::Null,
            scalar => Value::String(digest(&crate::drift::value_text_full(scalar))),
        }
    }
}

/// Whether a text is a URL that can carry a credential: user information
/// (`https://user:pass@host`) or a query string (`?token=…`). Such a value
/// is a digest even on a public path (manifest URLs, log endpoints).
pub fn carries_credentials(text: &str) -> bool {
    let Some((_, rest)) = text.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.contains('@') || rest.contains('?')
}

/// Whether `text` is exactly a digest as [`digest`] writes it (and so shows
/// nothing): `sha256:` and 12 hex digits, `… (`, a length, ` bytes)`. A value
/// that merely starts with `sha256:` is not one.
pub fn is_digest(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("sha256:") else {
        return false;
    };
    let Some((hex, rest)) = rest.split_at_checked(DIGEST_HEX) else {
        return false;
    };
    let Some(len) = rest
        .strip_prefix("… (")
        .and_then(|r| r.strip_suffix(" bytes)"))
    else {
        return false;
    };
    hex.bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && !len.is_empty()
        && len.bytes().all(|b| b.is_ascii_digit())
}

/// A value that must not be shown, as `sha256:<12 hex>… (<n> bytes)`: equal
/// values give equal digests, so "changed" stays visible.
pub fn digest(text: &str) -> String {
    let hex = hex::encode(Sha256::digest(text.as_bytes()));
    format!("sha256:{}… ({} bytes)", &hex[..DIGEST_HEX], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(keys: &[&str]) -> ConfigPath {
        ConfigPath(keys.iter().map(|k| Segment::Key(k.to_string())).collect())
    }

    #[test]
    fn public_paths_pass_and_everything_else_is_a_digest() {
        let r = Redactor::default();
        assert!(r.is_public(&p(&["cluster", "network", "podSubnets"])));
        assert!(r.is_public(&p(&["cluster", "ca", "crt"])));
        assert!(!r.is_public(&p(&["cluster", "ca", "key"])));
        assert!(!r.is_public(&p(&["cluster", "secret"])));
        assert!(!r.is_public(&p(&["machine", "somethingNew"])));
        assert!(!r.is_public(&p(&["SomeFutureConfig", "field"])));
        let shown = r.redact(
            &p(&["cluster", "secret"]),
            &Value::String("c2VjcmV0".into()),
        );
        assert_eq!(shown, Value::String(digest("c2VjcmV0")));
        assert!(digest("c2VjcmV0").starts_with("sha256:"));
        assert!(digest("c2VjcmV0").ends_with("(8 bytes)"));
    }

    #[test]
    fn a_secret_key_under_a_public_path_is_hidden_inside_a_shown_value() {
        let r = Redactor::default();
        let interfaces: Value = serde_yaml_ng::from_str(
            "- interface: wg0\n  wireguard:\n    privateKey: SECRETMARKER\n    listenPort: 51820\n",
        )
        .unwrap();
        let shown = r.redact(&p(&["machine", "network", "interfaces"]), &interfaces);
        let text = serde_yaml_ng::to_string(&shown).unwrap();
        assert!(!text.contains("SECRETMARKER"), "{text}");
        assert!(text.contains("51820"), "{text}");
        assert!(text.contains("privateKey: sha256:"), "{text}");
    }

    /// Covers: R8.1
    #[test]
    fn a_secret_key_hides_everything_under_it_at_any_depth() {
        let r = Redactor::default();
        assert!(r.is_public(&p(&["cluster", "apiServer", "image"])));
        assert!(!r.is_public(&p(&["cluster", "apiServer", "env", "HTTPS_PROXY"])));
        assert!(!r.is_public(&p(&[
            "machine",
            "kubelet",
            "credentialProviderConfig",
            "env"
        ])));
        assert!(!r.is_public(&p(&["KubeletConfig", "auth", "username"])));
    }

    /// Covers: R8.1
    #[test]
    fn a_document_kind_ichor_does_not_model_shows_its_header_only() {
        let r = Redactor::default();
        let named = |kind: &str, name: &str, keys: &[&str]| {
            let mut path = ConfigPath::default().key(kind).item(name);
            for k in keys {
                path = path.key(k);
            }
            path
        };
        // Unmodelled kinds: the header, nothing else.
        assert!(r.is_public(&p(&["KubeAPIServerConfig", "apiVersion"])));
        assert!(r.is_public(&p(&["KubeAPIServerConfig", "kind"])));
        assert!(!r.is_public(&p(&["KubeAPIServerConfig", "extraArgs", "oidc-client-id"])));
        assert!(!r.is_public(&p(&["KubeAPIServerConfig", "certExtraSANs"])));
        assert!(!r.is_public(&p(&["EventSinkConfig", "endpoint"])));
        assert!(!r.is_public(&p(&["KubeCredentialProviderConfig", "configuration"])));
        assert!(!r.is_public(&p(&["HostnameConfig", "hostname"])));
        assert!(r.is_public(&named("LinkConfig", "eth0", &["name"])));
        assert!(!r.is_public(&named("LinkConfig", "eth0", &["addresses"])));
        assert!(!r.is_public(&named("RegistryTLSConfig", "ghcr.io", &["ca"])));
        // The one field Ichor writes in an untyped kind.
        assert!(r.is_public(&p(&["KubeAPIServerConfig", "image"])));
        // Modelled kinds: their listed fields, not a field Talos adds.
        assert!(r.is_public(&p(&["KubePrismConfig", "port"])));
        assert!(!r.is_public(&p(&["KubePrismConfig", "futureField"])));
        assert!(r.is_public(&p(&["KubeletConfig", "image"])));
        assert!(!r.is_public(&p(&["KubeletConfig", "extraArgs", "node-ip"])));
        assert!(!r.is_public(&p(&["KubeletConfig", "clusterDNS"])));
        assert!(!r.is_public(&named("KubeInlineManifestConfig", "cilium", &["manifest"])));
        assert!(r.is_public(&named("KubeExternalManifestConfig", "m", &["url"])));
        assert!(!r.is_public(&named("KubeExternalManifestConfig", "m", &["headers"])));
    }

    /// The allow-list names no multi-document kind whole, and a field only
    /// of a kind Ichor types (or the image Ichor writes into a control-plane
    /// component's kind): widening it back is caught here as well as by the
    /// leak test.
    /// Covers: R8.1
    #[test]
    fn every_listed_document_field_belongs_to_a_kind_ichor_models() {
        use ichor_talos::config::DocumentKind;
        const WRITTEN_IMAGES: &[&str] = &[
            "KubeAPIServerConfig.image",
            "KubeControllerManagerConfig.image",
            "KubeSchedulerConfig.image",
        ];
        for entry in PUBLIC_PATHS
            .iter()
            .filter(|e| e.starts_with(|c: char| c.is_ascii_uppercase()))
        {
            let kind_end = entry.find(['.', '[']).unwrap_or(entry.len());
            let (kind, field) = entry.split_at(kind_end);
            let field = field.strip_prefix("[*]").unwrap_or(field);
            assert!(
                field.len() > 1 && field.starts_with('.'),
                "{entry}: a document kind is listed whole"
            );
            assert!(
                DocumentKind::from_kind_name(kind) != DocumentKind::Other
                    || WRITTEN_IMAGES.contains(entry),
                "{entry}: {kind} is not a kind Ichor models, so only its header is public"
            );
        }
    }

    /// Covers: R8.1
    #[test]
    fn only_a_real_digest_is_taken_for_one() {
        assert!(is_digest(&digest("c2VjcmV0")));
        assert!(is_digest(&digest("")));
        for not in [
            "sha256:",
            "sha256:c2VjcmV0",
            "sha256:0123456789ab… (8 bytes) and the secret",
            "sha256:0123456789AB… (8 bytes)",
            "sha256:0123456789ab (8 bytes)",
            "sha256:0123456789ab… ( bytes)",
        ] {
            assert!(!is_digest(not), "{not}");
        }
    }

    /// Covers: R8.1
    #[test]
    fn urls_with_credentials_or_queries_are_digests_on_public_paths() {
        let r = Redactor::default();
        let at = p(&["cluster", "extraManifests"]);
        for (url, shown) in [
            ("https://example.com/a.yaml", true),
            ("https://example.com/a.yaml?token=T0K3N", false),
            ("https://user:pw@example.com/a.yaml", false),
            ("https://example.com/a@b.yaml", true),
            ("not a url?x", true),
        ] {
            let v = Value::String(url.into());
            assert_eq!(r.redact(&at, &v) == v, shown, "{url}");
        }
    }
}
