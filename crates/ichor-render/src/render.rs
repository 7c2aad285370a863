//! The desired config of one node.
//!
//! desired = the node's live config (the base: every path Ichor does not own
//! is kept as it is) + the paths Ichor owns, from the TalosCluster and the
//! TalosMachine + the machine's patches, in order. Pure and deterministic:
//! the same input always gives the same bytes.

use ichor_api::conditions;
use ichor_api::{
    KubernetesComponent, MachinePatch, MachineRole, TalosCluster, TalosClusterSpec, TalosMachine,
    TalosMachineSpec,
};
use ichor_talos::config::{ConfigError, Document, MachineConfig};
use ichor_talos::patch::{ConfigPatch, PatchError};
use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ichor_talos::config::CowMapping;
use serde_yaml_ng::{Mapping, Value};

use crate::Error;
use crate::cni::{self, CniInput};
use crate::drift::{Drift, compare_edited};
use crate::path::{get, is_v1alpha1, kind_of, set, set_doc, set_existing_doc};
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
            .is_some_and(|s| conditions::inline_cni_dropped(&s.conditions));
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

/// BLAKE3, hex (256 bits), of the desired config's documents in an
/// unambiguous binary form (each value's type, length and content, keys in
/// the order they are written): documents that differ have different
/// digests. Computing it costs a walk of the documents, not the YAML text,
/// which a reconcile needs only when it applies. BLAKE3 rather than
/// SHA-256: every reconcile of every machine hashes its whole config, and
/// BLAKE3 takes SHA-256's time for 6 KB, 70% of it for 12 KB and a third
/// for 60 KB (a config carrying inline manifests); both are cryptographic,
/// so the digest shows nothing of the secrets in it.
pub fn config_digest<M: Borrow<Mapping>>(docs: &[M]) -> String {
    // The binary form is written whole and hashed once: hashing it value by
    // value costs more in the hasher's calls than in the hashing.
    let mut out = Vec::with_capacity(16 * 1024);
    out.extend_from_slice(&(docs.len() as u64).to_le_bytes());
    for doc in docs {
        digest_mapping(&mut out, doc.borrow());
    }
    blake3::hash(&out).to_hex().to_string()
}

fn digest_bytes(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn digest_mapping(out: &mut Vec<u8>, m: &Mapping) {
    out.push(b'm');
    out.extend_from_slice(&(m.len() as u64).to_le_bytes());
    for (k, v) in m {
        digest_value(out, k);
        digest_value(out, v);
    }
}

fn digest_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.push(b'n'),
        Value::Bool(b) => out.extend_from_slice(&[b'b', u8::from(*b)]),
        Value::Number(n) => digest_bytes(out, b'#', n.to_string().as_bytes()),
        Value::String(s) => digest_bytes(out, b's', s.as_bytes()),
        Value::Sequence(items) => {
            out.push(b'l');
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                digest_value(out, item);
            }
        }
        Value::Mapping(m) => digest_mapping(out, m),
        Value::Tagged(t) => {
            digest_bytes(out, b't', t.tag.to_string().as_bytes());
            digest_value(out, &t.value);
        }
    }
}

/// Renders the desired config of one node.
pub fn render(input: &RenderInput<'_>) -> Result<Rendered, Error> {
    let live = live_mappings(input.live)?;
    let desired = desired_documents(input, &live)?;
    Ok(Rendered {
        config: desired.config(input.live),
    })
}

/// One machine's render as a reconcile uses it: the desired documents, their
/// digest, the drift from the live config, and the typed config and YAML
/// Ichor applies (made only when asked: most reconciles apply nothing).
/// It borrows the documents the render left as they were from the live config.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineRender<'a> {
    live: &'a MachineConfig,
    desired: Desired<'a>,
    /// [`Rendered::hash`] (for `status.configHash`).
    pub hash: String,
    /// [`crate::compare`] of the live config with the desired one.
    pub drift: Drift,
}

impl MachineRender<'_> {
    /// The desired config, typed (what [`render`] gives).
    pub fn config(&self) -> MachineConfig {
        self.desired.config(self.live)
    }

    /// [`Rendered::yaml`], from the documents already at hand.
    pub fn yaml(&self) -> Result<String, Error> {
        ichor_talos::config::mappings_to_yaml(&self.desired.mappings).map_err(|source| {
            Error::Serialise {
                what: "desired",
                source,
            }
        })
    }
}

/// [`render`], [`Rendered::hash`] and [`crate::compare`] in one pass (the
/// same values the separate calls give; a test holds them equal). The live
/// config is turned into mappings here; a caller that read it from text
/// has them already and calls [`render_machine_from`].
pub fn render_machine<'a>(input: &RenderInput<'a>) -> Result<MachineRender<'a>, Error> {
    let live = live_mappings(input.live)?;
    let render = render_machine_from(input, &live)?;
    Ok(MachineRender {
        live: input.live,
        desired: render.desired.into_owned(),
        hash: render.hash,
        drift: render.drift,
    })
}

/// [`render_machine`] from the live config's mappings (`live` is
/// `input.live.to_mappings()`, which [`ParsedConfig`] keeps from the read).
/// The rules and every patch work on those mappings, copying only the
/// documents they change; only those are decoded into the typed config
/// and written back; the digest walks the desired documents once, and the
/// drift compares only the changed ones.
///
/// [`ParsedConfig`]: ichor_talos::config::ParsedConfig
pub fn render_machine_from<'a>(
    input: &RenderInput<'a>,
    live: &'a [Mapping],
) -> Result<MachineRender<'a>, Error> {
    let desired = desired_documents(input, live)?;
    let hash = config_digest(&desired.mappings);
    let drift = compare_edited(live, &desired.mappings, &Redactor::default());
    Ok(MachineRender {
        live: input.live,
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

/// The desired documents: mappings (borrowed from the live config where the
/// render left a document as it was) and, for the documents it changed,
/// the typed document they decoded to.
#[derive(Debug, Clone, PartialEq)]
struct Desired<'a> {
    mappings: Vec<CowMapping<'a>>,
    /// `None`: the live config's typed document at the same position.
    typed: Vec<Option<Document>>,
}

impl Desired<'_> {
    fn config(&self, live: &MachineConfig) -> MachineConfig {
        let documents = self
            .typed
            .iter()
            .enumerate()
            .map(|(i, d)| match d {
                Some(d) => d.clone(),
                None => live.documents[i].clone(),
            })
            .collect();
        MachineConfig { documents }
    }

    /// The same documents, owning their mappings.
    fn into_owned(self) -> Desired<'static> {
        Desired {
            mappings: self
                .mappings
                .into_iter()
                .map(|m| CowMapping::Owned(m.into_owned()))
                .collect(),
            typed: self.typed,
        }
    }
}

/// The live config's mappings with Ichor's paths and the machine's patches
/// (a document is copied only when one of them writes to it). A document
/// that neither changed (never written to, or written back to the same
/// keys in the same order with the same values) is the live document: it
/// is not decoded and written again, which would give it back unchanged
/// (a parsed document's round trip is exact). Only the changed ones are
/// decoded, checked and written as [`MachineConfig::to_mappings`] writes
/// them. Should a decode fail, the render is done again a step at a time,
/// decoding after Ichor's paths and after each patch, so the error names
/// the step that broke the config.
fn desired_documents<'a>(
    input: &RenderInput<'a>,
    live: &'a [Mapping],
) -> Result<Desired<'a>, Error> {
    let mut docs = CowMapping::borrow_all(live);
    owned_paths(&mut docs, input);
    for patch in &input.machine.patches {
        let (parsed, patch_origin) = parse_patch(input, patch)?;
        // The base is the live config, which already carries the effect of
        // every patch applied before: reapplied, a patch changes it once (ADR 0016).
        parsed
            .reapply_to_documents(&mut docs, &patch_origin)
            .map_err(|source| patch_error(input, patch, source))?;
    }
    let origin = format!("the render of TalosMachine {}", input.machine_name);
    let mut mappings = Vec::with_capacity(docs.len());
    let mut typed = Vec::with_capacity(docs.len());
    for (i, m) in docs.into_iter().enumerate() {
        if let Some(l) = live.get(i)
            && i < input.live.documents.len()
            && (m.is_unwritten(l) || same_mapping(l, &m))
        {
            mappings.push(m);
            typed.push(None);
            continue;
        }
        let doc = match Document::from_mapping(m.into_owned(), &origin, i + 1) {
            Ok(doc) => doc,
            // The error of a render without patches is Ichor's paths'; with
            // patches, the step-by-step render names the step.
            Err(source) if input.machine.patches.is_empty() => {
                return Err(Error::Rendered {
                    machine: input.machine_name.to_owned(),
                    source,
                });
            }
            Err(_) => {
                let config = render_stepwise(input)?.config;
                let desired = config.to_mappings().map_err(|source| Error::Serialise {
                    what: "desired",
                    source,
                })?;
                return Ok(Desired {
                    mappings: desired.into_iter().map(CowMapping::Owned).collect(),
                    typed: config.documents.into_iter().map(Some).collect(),
                });
            }
        };
        let mapping = doc.to_mapping().map_err(|source| Error::Serialise {
            what: "desired",
            source: ConfigError::Serialise {
                index: i + 1,
                kind: doc.kind_name().to_string(),
                source,
            },
        })?;
        mappings.push(CowMapping::Owned(mapping));
        typed.push(Some(doc));
    }
    Ok(Desired { mappings, typed })
}

/// Whether two mappings have the same keys in the same order with the same
/// values (YAML's own equality ignores the order of keys, which the written
/// config does not).
fn same_mapping(a: &Mapping, b: &Mapping) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ka, va), (kb, vb))| same_value(ka, kb) && same_value(va, vb))
}

/// [`same_mapping`] for any value.
pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Mapping(a), Value::Mapping(b)) => same_mapping(a, b),
        (Value::Sequence(a), Value::Sequence(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_value(a, b))
        }
        (Value::Tagged(a), Value::Tagged(b)) => a.tag == b.tag && same_value(&a.value, &b.value),
        (a, b) => a == b,
    }
}

/// [`render`] a step at a time: the config is decoded after Ichor's paths
/// and after each patch, so an error names the step that broke it. Slower;
/// [`render`] gives the same config (a test holds the two equal) and falls
/// back to this one only to name an error.
pub fn render_stepwise(input: &RenderInput<'_>) -> Result<Rendered, Error> {
    let mut docs = live_mappings(input.live)?
        .into_iter()
        .map(CowMapping::Owned)
        .collect();
    owned_paths(&mut docs, input);
    let docs = docs.into_iter().map(CowMapping::into_owned).collect();
    let origin = format!("the render of TalosMachine {}", input.machine_name);
    let mut config =
        MachineConfig::from_mappings(docs, &origin).map_err(|source| Error::Rendered {
            machine: input.machine_name.to_owned(),
            source,
        })?;
    for patch in &input.machine.patches {
        let (parsed, patch_origin) = parse_patch(input, patch)?;
        config = parsed
            .reapply(&config, &patch_origin)
            .map_err(|source| patch_error(input, patch, source))?;
    }
    Ok(Rendered { config })
}

/// The paths Ichor owns: the cluster's, the machine's, the CNI rules.
fn owned_paths(docs: &mut Vec<CowMapping<'_>>, input: &RenderInput<'_>) {
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

/// Patches parsed before, by their text, on this thread: a controller
/// renders a machine's same patches at every reconcile, and reading a patch
/// costs as much as applying it. Bounded: emptied when full.
const PARSED_PATCHES_MAX: usize = 1024;

thread_local! {
    static PARSED_PATCHES: RefCell<HashMap<String, Rc<ConfigPatch>>> =
        RefCell::new(HashMap::new());
}

fn parse_patch(
    input: &RenderInput<'_>,
    patch: &MachinePatch,
) -> Result<(Rc<ConfigPatch>, String), Error> {
    let origin = format!("{:?} of TalosMachine {}", patch.name, input.machine_name);
    if let Some(parsed) = PARSED_PATCHES.with(|c| c.borrow().get(&patch.inline).cloned()) {
        return Ok((parsed, origin));
    }
    // Only a patch that reads is kept: an error names its origin.
    let parsed = Rc::new(
        ConfigPatch::parse(&patch.inline, &origin)
            .map_err(|source| patch_error(input, patch, source))?,
    );
    PARSED_PATCHES.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= PARSED_PATCHES_MAX {
            c.clear();
        }
        c.insert(patch.inline.clone(), Rc::clone(&parsed));
    });
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
fn cluster_paths(docs: &mut [CowMapping<'_>], spec: &TalosClusterSpec) {
    let endpoint = Value::String(spec.endpoint.clone());
    let subnets =
        |v: &[String]| Value::Sequence(v.iter().map(|s| Value::String(s.clone())).collect());
    for doc in docs.iter_mut() {
        if is_v1alpha1(doc) {
            set_existing_doc(
                doc,
                &["cluster", "controlPlane", "endpoint"],
                endpoint.clone(),
            );
            if !spec.network.pod_subnets.is_empty() {
                set_existing_doc(
                    doc,
                    &["cluster", "network", "podSubnets"],
                    subnets(&spec.network.pod_subnets),
                );
            }
            if !spec.network.service_subnets.is_empty() {
                set_existing_doc(
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
                set_doc(doc, &["endpoint"], endpoint.clone());
            }
            "KubeNetworkConfig" => {
                if !spec.network.pod_subnets.is_empty() {
                    set_doc(doc, &["podSubnets"], subnets(&spec.network.pod_subnets));
                }
                if !spec.network.service_subnets.is_empty() {
                    set_doc(
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
fn machine_paths(docs: &mut [CowMapping<'_>], machine: &TalosMachineSpec) {
    let want = match machine.role {
        MachineRole::Controlplane => "controlplane",
        MachineRole::Worker => "worker",
    };
    for doc in docs.iter_mut().filter(|d| is_v1alpha1(d)) {
        let live = get(doc, &["machine", "type"]).and_then(Value::as_str);
        if live == Some("init") && machine.role == MachineRole::Controlplane {
            continue;
        }
        set_existing_doc(doc, &["machine", "type"], Value::String(want.to_owned()));
    }
}

/// Where a component's image lives: (legacy keys, multi-document kind, the
/// repository Talos uses when the config names none). `None` for the
/// bootstrap-manifests step, which writes no machine config.
fn component_paths(
    component: KubernetesComponent,
) -> Option<(&'static [&'static str], &'static str, &'static str)> {
    Some(match component {
        KubernetesComponent::BootstrapManifests => return None,
        KubernetesComponent::Kubelet => (
            &["machine", "kubelet", "image"],
            "KubeletConfig",
            "ghcr.io/siderolabs/kubelet",
        ),
        KubernetesComponent::ApiServer => (
            &["cluster", "apiServer", "image"],
            "KubeAPIServerConfig",
            "registry.k8s.io/kube-apiserver",
        ),
        KubernetesComponent::ControllerManager => (
            &["cluster", "controllerManager", "image"],
            "KubeControllerManagerConfig",
            "registry.k8s.io/kube-controller-manager",
        ),
        KubernetesComponent::Scheduler => (
            &["cluster", "scheduler", "image"],
            "KubeSchedulerConfig",
            "registry.k8s.io/kube-scheduler",
        ),
        KubernetesComponent::KubeProxy => (
            &["cluster", "proxy", "image"],
            "KubeProxyConfig",
            "registry.k8s.io/kube-proxy",
        ),
    })
}

/// One step of a kubernetes-upgrade, rendered: the node's live config with
/// `component`'s image at `version` (the repository kept) and nothing else
/// changed. `image` is the image the step writes; `config` is `None` when
/// the live config already names it (nothing to write), or has no place for
/// the component (a worker's config has no control-plane section).
#[derive(Debug, Clone)]
pub struct ComponentStep {
    pub image: Option<String>,
    pub config: Option<MachineConfig>,
}

/// Renders a kubernetes-upgrade step of `machine_name` (see [`ComponentStep`]).
pub fn component_step(
    live: &MachineConfig,
    component: KubernetesComponent,
    version: &str,
    machine_name: &str,
) -> Result<ComponentStep, Error> {
    let rendered = |source| Error::Rendered {
        machine: machine_name.to_owned(),
        source,
    };
    let Some((keys, kind, default_repository)) = component_paths(component) else {
        return Ok(ComponentStep {
            image: None,
            config: None,
        });
    };
    let mut docs = live.to_mappings().map_err(rendered)?;
    let mut image = None;
    let mut changed = false;
    for doc in docs.iter_mut() {
        let at: &[&str] = if is_v1alpha1(doc) {
            keys
        } else if kind_of(doc) == Some(kind) {
            &["image"]
        } else {
            continue;
        };
        match get(doc, at).and_then(Value::as_str) {
            Some(current) => {
                let new = retag(current, version);
                if new != current {
                    set(doc, at, Value::String(new.clone()));
                    changed = true;
                }
                image = Some(new);
            }
            // A v1alpha1 document that holds the component's section but
            // leaves its image to Talos's default gets the image written.
            None if is_v1alpha1(doc)
                && get(doc, &keys[..keys.len() - 1]).is_some()
                && image.is_none() =>
            {
                let new = format!("{default_repository}:{version}");
                set(doc, at, Value::String(new.clone()));
                changed = true;
                image = Some(new);
            }
            None => {}
        }
    }
    let config = if changed {
        Some(
            MachineConfig::from_mappings(
                docs,
                &format!(
                    "the {} step of TalosMachine {machine_name}",
                    component.as_str()
                ),
            )
            .map_err(rendered)?,
        )
    } else {
        None
    };
    Ok(ComponentStep { image, config })
}

fn retag_at(doc: &mut CowMapping<'_>, keys: &[&str], version: &str) {
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

    use super::{KubernetesComponent, component_step};
    use ichor_talos::config::MachineConfig;

    fn fixture(name: &str) -> MachineConfig {
        let text = ichor_testenv::fixtures::cni_none(name);
        MachineConfig::parse_live(&text, name).expect("parse")
    }

    /// A step changes one component's image and nothing else, in both
    /// config shapes; a worker has no control-plane component to change.
    /// Covers: kubernetes-upgrade, ADR 0014 (each step a machine-config change)
    #[test]
    fn a_component_step_changes_one_image() {
        for name in [
            "v1.12-cni-none-controlplane.yaml",
            "v1.14-cni-none-controlplane.yaml",
        ] {
            let live = fixture(name);
            for component in [
                KubernetesComponent::ApiServer,
                KubernetesComponent::ControllerManager,
                KubernetesComponent::Scheduler,
                KubernetesComponent::KubeProxy,
                KubernetesComponent::Kubelet,
            ] {
                let step = component_step(&live, component, "v1.99.1", "cp").expect("step");
                let config = step.config.expect("a change");
                let image = step.image.expect("image");
                assert!(
                    image.ends_with(&format!("{}:v1.99.1", component.as_str())),
                    "{name}: {image}"
                );
                let drift = crate::compare(&live, &config).expect("compare");
                assert_eq!(
                    drift.entries.len(),
                    1,
                    "{name} {component:?}: {:?}",
                    drift.entries
                );
                // Applying it again writes nothing.
                let again = component_step(&config, component, "v1.99.1", "cp").expect("step");
                assert!(again.config.is_none());
            }
        }
        let worker = fixture("v1.12-cni-none-worker.yaml");
        let step =
            component_step(&worker, KubernetesComponent::ApiServer, "v1.99.1", "w").expect("step");
        assert!(step.config.is_none() && step.image.is_none());
    }

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
