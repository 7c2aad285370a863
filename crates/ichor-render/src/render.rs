//! The desired config of one node.
//!
//! desired = the node's live config (the base: every path Ichor does not own
//! is kept as it is) + the paths Ichor owns, from the TalosCluster and the
//! TalosMachine + the machine's patches, in order. Pure and deterministic:
//! the same input always gives the same bytes.

use ichor_api::conditions::{self, types};
use ichor_api::{
    MachinePatch, MachineRole, TalosCluster, TalosClusterSpec, TalosMachine, TalosMachineSpec,
};
use ichor_talos::config::MachineConfig;
use ichor_talos::patch::{ConfigPatch, PatchError};
use serde_yaml_ng::{Mapping, Value};
use sha2::{Digest, Sha256};

use crate::Error;
use crate::cni::{self, CniInput};
use crate::drift::{Drift, compare_documents};
use crate::path::{get, is_v1alpha1, kind_of, set, set_existing};
use crate::redact::Redactor;

/// Everything a render needs. Build it with [`RenderInput::from_objects`] or by hand.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The TalosMachine's name (for messages).
    pub machine_name: &'a str,
    /// The cluster's spec.
    pub cluster: &'a TalosClusterSpec,
    /// Whether the cluster has `CNIHandover=True`.
    pub cni_handover: bool,
    /// The machine's spec.
    pub machine: &'a TalosMachineSpec,
    /// The config the node runs now.
    pub live: &'a MachineConfig,
    /// Ichor's Cilium manifest to keep inline until the hand-over (ichor init); `None` keeps what the node has.
    pub inline_cni: Option<&'a str>,
    /// The name of an inline CNI manifest taken over from the user, removed at the hand-over.
    pub taken_over_inline: Option<&'a str>,
}

impl<'a> RenderInput<'a> {
    /// The input for a machine of a cluster; the hand-over comes from the
    /// cluster's `CNIHandover` condition and the taken-over inline manifest
    /// from the annotation [`ichor_api::TAKEN_OVER_INLINE_MANIFEST_ANNOTATION`].
    pub fn from_objects(
        cluster: &'a TalosCluster,
        machine: &'a TalosMachine,
        live: &'a MachineConfig,
    ) -> Self {
        let handover = cluster
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER));
        RenderInput {
            machine_name: machine.metadata.name.as_deref().unwrap_or("<unnamed>"),
            cluster: &cluster.spec,
            cni_handover: handover,
            machine: &machine.spec,
            live,
            inline_cni: None,
            taken_over_inline: cluster
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ichor_api::TAKEN_OVER_INLINE_MANIFEST_ANNOTATION))
                .map(String::as_str),
        }
    }
}

/// A rendered desired config.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The desired config.
    pub config: MachineConfig,
}

impl Rendered {
    /// The desired config as the YAML Ichor applies.
    pub fn yaml(&self) -> Result<String, Error> {
        self.config.to_yaml().map_err(|source| Error::Serialise {
            what: "desired",
            source,
        })
    }

    /// The digest of the desired config, hex (for `status.configHash`):
    /// [`config_digest`] of its documents.
    pub fn hash(&self) -> Result<String, Error> {
        let docs = self
            .config
            .to_mappings()
            .map_err(|source| Error::Serialise {
                what: "desired",
                source,
            })?;
        Ok(config_digest(&docs))
    }
}

/// SHA-256, hex, of the desired config's documents in an unambiguous
/// binary form (each value's type, length and content, keys in the order
/// they are written): documents that differ have different digests.
/// Computing it costs a walk of the documents, not the YAML text, which a
/// reconcile needs only when it applies.
pub fn config_digest(docs: &[Mapping]) -> String {
    let mut h = Sha256::new();
    h.update((docs.len() as u64).to_le_bytes());
    for doc in docs {
        digest_mapping(&mut h, doc);
    }
    hex::encode(h.finalize())
}

fn digest_bytes(h: &mut Sha256, tag: u8, bytes: &[u8]) {
    h.update([tag]);
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn digest_mapping(h: &mut Sha256, m: &Mapping) {
    h.update([b'm']);
    h.update((m.len() as u64).to_le_bytes());
    for (k, v) in m {
        digest_value(h, k);
        digest_value(h, v);
    }
}

fn digest_value(h: &mut Sha256, v: &Value) {
    match v {
        Value::Null => h.update([b'n']),
        Value::Bool(b) => h.update([b'b', u8::from(*b)]),
        Value::Number(n) => digest_bytes(h, b'#', n.to_string().as_bytes()),
        Value::String(s) => digest_bytes(h, b's', s.as_bytes()),
        Value::Sequence(items) => {
            h.update([b'l']);
            h.update((items.len() as u64).to_le_bytes());
            for item in items {
                digest_value(h, item);
            }
        }
        Value::Mapping(m) => digest_mapping(h, m),
        Value::Tagged(t) => {
            digest_bytes(h, b't', t.tag.to_string().as_bytes());
            digest_value(h, &t.value);
        }
    }
}

/// Renders the desired config of one node.
pub fn render(input: &RenderInput<'_>) -> Result<Rendered, Error> {
    let live = live_mappings(input.live)?;
    let config = desired_config(input, live)?;
    Ok(Rendered { config })
}

/// One machine's render as a reconcile uses it: the desired config, its
/// digest, the drift from the live config, and the YAML Ichor applies
/// (written only when asked: most reconciles apply nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct MachineRender {
    /// The desired config.
    pub rendered: Rendered,
    /// The desired config's documents, as [`MachineConfig::to_mappings`] gives them.
    pub desired: Vec<Mapping>,
    /// [`Rendered::hash`] (for `status.configHash`).
    pub hash: String,
    /// [`crate::compare`] of the live config with the desired one.
    pub drift: Drift,
}

impl MachineRender {
    /// [`Rendered::yaml`], from the documents already at hand.
    pub fn yaml(&self) -> Result<String, Error> {
        ichor_talos::config::mappings_to_yaml(&self.desired).map_err(|source| Error::Serialise {
            what: "desired",
            source,
        })
    }
}

/// [`render`], [`Rendered::hash`] and [`crate::compare`] in one pass: the
/// live config is turned into YAML mappings once, the rules and every patch
/// work on those mappings, the result is decoded into the typed config once,
/// and its mappings give both the digest and the drift (the same values the
/// separate calls give; a test holds them equal).
pub fn render_machine(input: &RenderInput<'_>) -> Result<MachineRender, Error> {
    let live = live_mappings(input.live)?;
    let config = desired_config(input, live.clone())?;
    let desired = config.to_mappings().map_err(|source| Error::Serialise {
        what: "desired",
        source,
    })?;
    let hash = config_digest(&desired);
    let drift = compare_documents(&live, &desired, &Redactor::default());
    Ok(MachineRender {
        rendered: Rendered { config },
        desired,
        hash,
        drift,
    })
}

fn live_mappings(live: &MachineConfig) -> Result<Vec<Mapping>, Error> {
    live.to_mappings().map_err(|source| Error::Serialise {
        what: "live",
        source,
    })
}

/// The live config's mappings with Ichor's paths and the machine's patches,
/// decoded once at the end. Should that decode fail, the render is done
/// again a step at a time, decoding after Ichor's paths and after each
/// patch, so the error names the step that broke the config.
fn desired_config(input: &RenderInput<'_>, mut docs: Vec<Mapping>) -> Result<MachineConfig, Error> {
    owned_paths(&mut docs, input);
    let origin = format!("the render of TalosMachine {}", input.machine_name);
    if input.machine.patches.is_empty() {
        return MachineConfig::from_mappings(docs, &origin).map_err(|source| Error::Rendered {
            machine: input.machine_name.to_owned(),
            source,
        });
    }
    for patch in &input.machine.patches {
        let (parsed, patch_origin) = parse_patch(input, patch)?;
        parsed
            .apply_to_mappings(&mut docs, &patch_origin)
            .map_err(|source| patch_error(input, patch, source))?;
    }
    match MachineConfig::from_mappings(docs, &origin) {
        Ok(config) => Ok(config),
        Err(_) => render_stepwise(input).map(|r| r.config),
    }
}

/// [`render`] a step at a time: the config is decoded after Ichor's paths
/// and after each patch, so an error names the step that broke it. Slower;
/// [`render`] gives the same config (a test holds the two equal) and falls
/// back to this one only to name an error.
pub fn render_stepwise(input: &RenderInput<'_>) -> Result<Rendered, Error> {
    let mut docs = live_mappings(input.live)?;
    owned_paths(&mut docs, input);
    let origin = format!("the render of TalosMachine {}", input.machine_name);
    let mut config =
        MachineConfig::from_mappings(docs, &origin).map_err(|source| Error::Rendered {
            machine: input.machine_name.to_owned(),
            source,
        })?;
    for patch in &input.machine.patches {
        let (parsed, patch_origin) = parse_patch(input, patch)?;
        config = parsed
            .apply(&config, &patch_origin)
            .map_err(|source| patch_error(input, patch, source))?;
    }
    Ok(Rendered { config })
}

/// The paths Ichor owns: the cluster's, the machine's, the CNI rules.
fn owned_paths(docs: &mut Vec<Mapping>, input: &RenderInput<'_>) {
    cluster_paths(docs, input.cluster);
    machine_paths(docs, input.machine);
    cni::apply(
        docs,
        &CniInput {
            preset: input.cluster.cni.preset,
            kube_proxy: input.cluster.cni.kube_proxy,
            handover: input.cni_handover,
            control_plane: input.machine.role == MachineRole::Controlplane,
            inline_cni: input.inline_cni,
            taken_over_inline: input.taken_over_inline,
        },
    );
}

fn parse_patch(
    input: &RenderInput<'_>,
    patch: &MachinePatch,
) -> Result<(ConfigPatch, String), Error> {
    let origin = format!("{:?} of TalosMachine {}", patch.name, input.machine_name);
    let parsed = ConfigPatch::parse(&patch.inline, &origin)
        .map_err(|source| patch_error(input, patch, source))?;
    Ok((parsed, origin))
}

fn patch_error(input: &RenderInput<'_>, patch: &MachinePatch, source: PatchError) -> Error {
    Error::Patch {
        machine: input.machine_name.to_owned(),
        patch: patch.name.clone(),
        source: Box::new(source),
    }
}

/// The image paths that carry the Kubernetes version: (legacy keys, multi-document kind).
const VERSIONED_IMAGES: &[(&[&str], &str)] = &[
    (&["machine", "kubelet", "image"], "KubeletConfig"),
    (&["cluster", "apiServer", "image"], "KubeAPIServerConfig"),
    (
        &["cluster", "controllerManager", "image"],
        "KubeControllerManagerConfig",
    ),
    (&["cluster", "scheduler", "image"], "KubeSchedulerConfig"),
    (&["cluster", "proxy", "image"], "KubeProxyConfig"),
];

/// Ichor-owned cluster paths, written only where the node's config has them
/// (a worker's v1.14 config, for example, carries no cluster-wide settings).
fn cluster_paths(docs: &mut [Mapping], spec: &TalosClusterSpec) {
    let endpoint = Value::String(spec.endpoint.clone());
    let subnets =
        |v: &[String]| Value::Sequence(v.iter().map(|s| Value::String(s.clone())).collect());
    for doc in docs.iter_mut() {
        if is_v1alpha1(doc) {
            set_existing(
                doc,
                &["cluster", "controlPlane", "endpoint"],
                endpoint.clone(),
            );
            if !spec.network.pod_subnets.is_empty() {
                set_existing(
                    doc,
                    &["cluster", "network", "podSubnets"],
                    subnets(&spec.network.pod_subnets),
                );
            }
            if !spec.network.service_subnets.is_empty() {
                set_existing(
                    doc,
                    &["cluster", "network", "serviceSubnets"],
                    subnets(&spec.network.service_subnets),
                );
            }
            for (keys, _) in VERSIONED_IMAGES {
                retag_at(doc, keys, &spec.kubernetes_version);
            }
            continue;
        }
        match kind_of(doc).unwrap_or_default() {
            "KubeClusterConfig" => {
                set(doc, &["endpoint"], endpoint.clone());
            }
            "KubeNetworkConfig" => {
                if !spec.network.pod_subnets.is_empty() {
                    set(doc, &["podSubnets"], subnets(&spec.network.pod_subnets));
                }
                if !spec.network.service_subnets.is_empty() {
                    set(
                        doc,
                        &["serviceSubnets"],
                        subnets(&spec.network.service_subnets),
                    );
                }
            }
            kind => {
                if VERSIONED_IMAGES.iter().any(|(_, k)| *k == kind) {
                    retag_at(doc, &["image"], &spec.kubernetes_version);
                }
            }
        }
    }
}

/// Ichor-owned machine paths: `machine.type` from `spec.role` (an `init`
/// node counts as a control-plane node and stays `init`).
fn machine_paths(docs: &mut [Mapping], machine: &TalosMachineSpec) {
    let want = match machine.role {
        MachineRole::Controlplane => "controlplane",
        MachineRole::Worker => "worker",
    };
    for doc in docs.iter_mut().filter(|d| is_v1alpha1(d)) {
        let live = get(doc, &["machine", "type"]).and_then(Value::as_str);
        if live == Some("init") && machine.role == MachineRole::Controlplane {
            continue;
        }
        set_existing(doc, &["machine", "type"], Value::String(want.to_owned()));
    }
}

fn retag_at(doc: &mut Mapping, keys: &[&str], version: &str) {
    if let Some(image) = get(doc, keys).and_then(Value::as_str) {
        let new = retag(image, version);
        if new != image {
            set(doc, keys, Value::String(new));
        }
    }
}

/// `image` with its tag set to `tag` (a digest is dropped; the repository is kept).
pub fn retag(image: &str, tag: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or(image);
    let slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match no_digest[slash..].rfind(':') {
        Some(i) => &no_digest[..slash + i],
        None => no_digest,
    };
    format!("{repo}:{tag}")
}

#[cfg(test)]
mod tests {
    use super::retag;

    #[test]
    fn retag_keeps_the_repository() {
        assert_eq!(
            retag("ghcr.io/siderolabs/kubelet:v1.28.0", "v1.34.1"),
            "ghcr.io/siderolabs/kubelet:v1.34.1"
        );
        assert_eq!(
            retag("localhost:5000/kubelet", "v1.34.1"),
            "localhost:5000/kubelet:v1.34.1"
        );
        assert_eq!(retag("r.io/k:v1@sha256:ab", "v2"), "r.io/k:v2");
    }
}
