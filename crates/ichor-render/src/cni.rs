//! The CNI rules of R1.6, for both config shapes.
//!
//! Preset `cilium`:
//! - the CNI is `none`: legacy `cluster.network.cni.name: none` (its `urls`
//!   and `flannel` removed); every `KubeFlannelCNIConfig` document deleted (the
//!   preset renders a `$patch: delete`, which deletes nothing when there is none);
//!   the `custom-cni` external manifest deleted;
//! - kube-proxy disabled only for `kubeProxy: replaced` (legacy
//!   `cluster.proxy.disabled: true`, v1.14 `KubeProxyConfig.enabled: false`),
//!   on control-plane nodes and on workers whose config has the section;
//!   for `enabled`, a `disabled: true` / `enabled: false` is taken away;
//! - KubePrism on (7445 unless the node already has a port);
//! - the inline cni entry (named [`INLINE_CNI_NAME`]) on control-plane nodes
//!   only until `CNIHandover=True`: before it, Ichor's manifest when the
//!   caller gives one (else whatever the node has); from it on, no entry (and
//!   no taken-over entry either).
//!
//! Preset `unmanaged`: the CNI paths stay as the node has them.
//!
//! Each rule writes only where the value differs, so a node that already
//! matches renders byte for byte as it is.

use ichor_api::{CniPreset, KubeProxyMode};
use ichor_talos::config::CowMapping;
use ichor_talos::config::lookup;
use serde_yaml_ng::{Mapping, Value};

use crate::path::{self, get, is_v1alpha1, kind_of, remove, remove_doc, set, set_doc};

/// The name of the inline manifest that carries Cilium before the hand-over.
pub const INLINE_CNI_NAME: &str = "cilium";
/// KubePrism's port (Talos's default).
pub const KUBEPRISM_PORT: u64 = 7445;

/// What the CNI rules need to know.
#[derive(Debug, Clone, Copy)]
pub struct CniInput<'a> {
    /// `spec.cni.preset`.
    pub preset: CniPreset,
    /// `spec.cni.kubeProxy`.
    pub kube_proxy: KubeProxyMode,
    /// Whether the TalosCluster has `CNIHandover=True`.
    pub handover: bool,
    /// Whether the node is a control-plane node (inline manifests live there).
    pub control_plane: bool,
    /// Ichor's Cilium manifest to keep inline until the hand-over (`None`: keep what the node has).
    pub inline_cni: Option<&'a str>,
    /// The name of an inline manifest taken over from a previous install, removed at the hand-over too.
    pub taken_over_inline: Option<&'a str>,
}

/// Applies the CNI rules to the documents of a config (a document is copied
/// only when a rule changes it).
pub fn apply(docs: &mut Vec<CowMapping<'_>>, input: &CniInput<'_>) {
    if input.preset != CniPreset::Cilium {
        return;
    }
    let multidoc = docs
        .iter()
        .filter_map(|m| kind_of(m))
        .any(|k| k.starts_with("Kube") && !k.starts_with("KubeSpan"));
    cni_none(docs, multidoc);
    kube_proxy(docs, multidoc, input.kube_proxy, input.control_plane);
    kube_prism(docs, multidoc);
    if input.control_plane {
        inline_entry(docs, multidoc, input);
    }
}

fn v1alpha1<'d, 'a>(docs: &'d mut [CowMapping<'a>]) -> Option<&'d mut CowMapping<'a>> {
    docs.iter_mut().find(|m| is_v1alpha1(m))
}

fn v1alpha1_ref<'d>(docs: &'d [CowMapping<'_>]) -> Option<&'d Mapping> {
    docs.iter().map(|m| &**m).find(|m| is_v1alpha1(m))
}

/// Whether the legacy document carries this cluster section (legacy shape, or
/// a v1.14 config upgraded from an older one that kept its legacy fields).
fn legacy_has(docs: &[CowMapping<'_>], multidoc: bool, keys: &[&str]) -> bool {
    match v1alpha1_ref(docs) {
        Some(v1) => get(v1, keys).is_some() || (!multidoc && v1.contains_key("cluster")),
        None => false,
    }
}

fn cni_none(docs: &mut Vec<CowMapping<'_>>, multidoc: bool) {
    if legacy_has(docs, multidoc, &["cluster", "network"])
        && let Some(v1) = v1alpha1(docs)
    {
        set_doc(
            v1,
            &["cluster", "network", "cni", "name"],
            Value::String("none".into()),
        );
        remove_doc(v1, &["cluster", "network", "cni", "urls"]);
        remove_doc(v1, &["cluster", "network", "cni", "flannel"]);
    }
    docs.retain(|m| {
        let kind = kind_of(m);
        let name = lookup(m, "name").and_then(Value::as_str);
        kind != Some("KubeFlannelCNIConfig")
            && !(kind == Some("KubeExternalManifestConfig")
                && name == Some(ichor_talos::config::CUSTOM_CNI_MANIFEST_NAME))
    });
}

fn kube_proxy(
    docs: &mut [CowMapping<'_>],
    multidoc: bool,
    mode: KubeProxyMode,
    control_plane: bool,
) {
    let replaced = mode == KubeProxyMode::Replaced;
    let has_section = v1alpha1_ref(docs).is_some_and(|v1| get(v1, &["cluster", "proxy"]).is_some());
    // kube-proxy is deployed from the control plane; a worker's config says
    // nothing about it unless it already has the section.
    if !control_plane && !has_section {
        return;
    }
    if legacy_has(docs, multidoc, &["cluster", "proxy"]) {
        if let Some(v1) = v1alpha1(docs) {
            if replaced {
                set_doc(v1, &["cluster", "proxy", "disabled"], Value::Bool(true));
            } else if get(v1, &["cluster", "proxy", "disabled"]) == Some(&Value::Bool(true)) {
                remove_doc(v1, &["cluster", "proxy", "disabled"]);
            }
        }
        return;
    }
    for doc in docs
        .iter_mut()
        .filter(|m| kind_of(m) == Some("KubeProxyConfig"))
    {
        if replaced {
            set_doc(doc, &["enabled"], Value::Bool(false));
        } else if lookup(doc, "enabled") == Some(&Value::Bool(false)) {
            remove_doc(doc, &["enabled"]);
        }
    }
}

fn kube_prism(docs: &mut Vec<CowMapping<'_>>, multidoc: bool) {
    if let Some(doc) = docs
        .iter_mut()
        .find(|m| kind_of(m) == Some("KubePrismConfig"))
    {
        let port = lookup(doc, "port").and_then(Value::as_u64).unwrap_or(0);
        if port == 0 {
            set(doc, &["port"], Value::Number(KUBEPRISM_PORT.into()));
        }
        return;
    }
    if let Some(v1) = v1alpha1(docs)
        && (get(v1, &["machine", "features", "kubePrism"]).is_some() || !multidoc)
    {
        if get(v1, &["machine", "features", "kubePrism", "enabled"]) == Some(&Value::Bool(true)) {
            return;
        }
        set(
            v1,
            &["machine", "features", "kubePrism", "enabled"],
            Value::Bool(true),
        );
        if get(v1, &["machine", "features", "kubePrism", "port"]).is_none() {
            set(
                v1,
                &["machine", "features", "kubePrism", "port"],
                Value::Number(KUBEPRISM_PORT.into()),
            );
        }
        return;
    }
    let mut doc = Mapping::new();
    doc.insert(
        "apiVersion".into(),
        ichor_talos::config::MULTIDOC_API_VERSION.into(),
    );
    doc.insert("kind".into(), "KubePrismConfig".into());
    doc.insert("port".into(), Value::Number(KUBEPRISM_PORT.into()));
    docs.push(CowMapping::Owned(doc));
}

fn inline_entry(docs: &mut Vec<CowMapping<'_>>, multidoc: bool, input: &CniInput<'_>) {
    if input.handover {
        drop_inline_entry(docs, input);
    } else if let Some(manifest) = input.inline_cni {
        keep_inline_entry(docs, multidoc, manifest);
    }
}

/// The `name` of an inline manifest entry.
fn name_of(v: &Value) -> Option<String> {
    v.as_mapping()
        .and_then(|m| lookup(m, "name"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// After the hand-over: the inline CNI entry (and a taken-over one) goes.
fn drop_inline_entry(docs: &mut Vec<CowMapping<'_>>, input: &CniInput<'_>) {
    let gone = |n: Option<&str>| {
        n == Some(INLINE_CNI_NAME) || (n.is_some() && n == input.taken_over_inline)
    };
    let legacy_entry = v1alpha1_ref(docs)
        .and_then(|v1| get(v1, &["cluster", "inlineManifests"]))
        .and_then(Value::as_sequence)
        .is_some_and(|list| list.iter().any(|item| gone(name_of(item).as_deref())));
    if legacy_entry && let Some(v1) = v1alpha1(docs) {
        let mut now_empty = false;
        if let Some(list) = path::sequence_mut(v1, &["cluster", "inlineManifests"]) {
            let before = list.len();
            list.retain(|item| !gone(name_of(item).as_deref()));
            // Drop the key only when Ichor emptied the list, so a node's own
            // empty list stays as it is.
            now_empty = list.is_empty() && list.len() < before;
        }
        if now_empty {
            remove(v1, &["cluster", "inlineManifests"]);
        }
    }
    docs.retain(|m| {
        !(kind_of(m) == Some("KubeInlineManifestConfig")
            && gone(lookup(m, "name").and_then(Value::as_str)))
    });
}

/// Before the hand-over: the inline CNI entry carries `manifest`, in the
/// document or list the config already uses.
fn keep_inline_entry(docs: &mut Vec<CowMapping<'_>>, multidoc: bool, manifest: &str) {
    if let Some(doc) = docs.iter_mut().find(|m| {
        kind_of(m) == Some("KubeInlineManifestConfig")
            && lookup(m, "name").and_then(Value::as_str) == Some(INLINE_CNI_NAME)
    }) {
        set_doc(doc, &["manifest"], Value::String(manifest.to_owned()));
        return;
    }
    let legacy_list =
        v1alpha1_ref(docs).is_some_and(|v1| get(v1, &["cluster", "inlineManifests"]).is_some());
    if multidoc && !legacy_list {
        let mut doc = Mapping::new();
        doc.insert(
            "apiVersion".into(),
            ichor_talos::config::MULTIDOC_API_VERSION.into(),
        );
        doc.insert("kind".into(), "KubeInlineManifestConfig".into());
        doc.insert("name".into(), INLINE_CNI_NAME.into());
        doc.insert("manifest".into(), manifest.into());
        docs.push(CowMapping::Owned(doc));
        return;
    }
    let Some(v1) = v1alpha1(docs) else {
        return;
    };
    if !v1.contains_key("cluster") {
        return;
    }
    if get(v1, &["cluster", "inlineManifests"]).is_none() {
        set(
            v1,
            &["cluster", "inlineManifests"],
            Value::Sequence(Vec::new()),
        );
    }
    if let Some(list) = path::sequence_mut(v1, &["cluster", "inlineManifests"]) {
        match list
            .iter_mut()
            .find(|i| name_of(i).as_deref() == Some(INLINE_CNI_NAME))
        {
            Some(item) => {
                if let Some(m) = item.as_mapping_mut() {
                    set(m, &["contents"], Value::String(manifest.to_owned()));
                }
            }
            None => {
                let mut item = Mapping::new();
                item.insert("name".into(), INLINE_CNI_NAME.into());
                item.insert("contents".into(), manifest.into());
                list.push(Value::Mapping(item));
            }
        }
    }
}
