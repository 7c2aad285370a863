//! The lab plays Talos's bootstrap-manifest apply for a control plane's inline
//! manifests, as Talos 1.13+ does it at boot (its `ManifestApplyController`;
//! the inventory's format is in `ichor_talos::bootstrap_inventory`, and why it
//! matters to Ichor in docs/adr/0015-a-cilium-hand-over-talos-cannot-prune.md):
//!
//! - it creates the objects that are missing, and never updates one that exists;
//! - the objects it creates carry `config.k8s.io/owning-inventory:
//!   talos-bootstrap-manifests-inventory`;
//! - every object, created or found, is recorded in the ConfigMap
//!   `kube-system/talos-bootstrap-manifests-inventory` (entries already there
//!   stay: the apply at boot never prunes);
//! - an object owned by another inventory is an error.
//!
//! What it plays is the inline manifests (`cluster.inlineManifests` of a
//! v1alpha1 config, `KubeInlineManifestConfig` documents of the v1.14 shape).
//! Talos's own manifests (CoreDNS, kube-proxy, its RBAC) are not played: the
//! lab's cluster does not run them.
//!
//! How to call it (the init helper, after `ichor init` bootstraps the first
//! control plane and the API server answers):
//!
//! ```no_run
//! # async fn f(client: kube::Client, config_yaml: &str) -> Result<(), ichor_lab::bootstrap_manifests::Error> {
//! let config = ichor_talos::config::MachineConfig::parse(config_yaml)?;
//! let played = ichor_lab::bootstrap_manifests::apply(&client, &config).await?;
//! println!("created {}, found {}", played.created.len(), played.found.len());
//! # Ok(()) }
//! ```
//!
//! [`plan`] is the decision alone (the objects and their inventory, from the
//! config) and [`apply`] the I/O around it; [`manifest_documents`] gives the
//! same objects as one multi-document YAML, which is what Talos's manifests
//! step (`talosctl upgrade-k8s`) applies.

use std::collections::BTreeMap;

use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, InventoryError, InventoryObject,
    OWNING_INVENTORY_ANNOTATION, inventory_data,
};
use ichor_talos::config::{ConfigError, MachineConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::{Discovery, Scope};
use serde_json::Value;

/// Why the bootstrap manifests could not be played.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the machine config")]
    Config(#[from] ConfigError),
    #[error("inline manifest {manifest:?} document {index} is not a Kubernetes object: {why}")]
    BadObject {
        manifest: String,
        index: usize,
        why: String,
    },
    #[error("inline manifest {manifest:?} is not YAML")]
    BadYaml {
        manifest: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("inline manifest {manifest:?} document {index} is not a Kubernetes object")]
    NotAnObject {
        manifest: String,
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(
        "{object} belongs to inventory {owner:?}, not {INVENTORY_NAME}; Talos reports this as an error and leaves the object alone"
    )]
    ForeignInventory { object: String, owner: String },
    #[error("the API server does not serve {api_version} {kind} (inline manifest {manifest:?})")]
    UnknownKind {
        api_version: String,
        kind: String,
        manifest: String,
    },
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// One object of the bootstrap manifests, as Talos would create it.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapObject {
    /// The inline manifest it comes from.
    pub manifest: String,
    pub object: InventoryObject,
    pub api_version: String,
    /// The object, with the owning-inventory annotation set.
    pub body: Value,
}

/// The decision: the objects to create when missing (in the order Talos
/// stages them: Namespaces, then CustomResourceDefinitions, then the rest),
/// and the inventory `data` naming them all.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub objects: Vec<BootstrapObject>,
    pub inventory: BTreeMap<String, String>,
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Played {
    /// Objects created (and stamped with the annotation).
    pub created: Vec<InventoryObject>,
    /// Objects that existed and were only recorded in the inventory.
    pub found: Vec<InventoryObject>,
}

/// The objects of `config`'s inline manifests and their inventory (pure).
/// A namespaced object without a namespace goes to `default`, as for kubectl;
/// which kinds are namespaced is only known to the API server, so `plan`
/// keeps the namespace as written and [`apply`] fills it in.
pub fn plan(config: &MachineConfig) -> Result<Plan, Error> {
    let mut objects = Vec::new();
    for manifest in config.facts().inline_manifests {
        for (index, doc) in documents(&manifest.contents)
            .map_err(|source| Error::BadYaml {
                manifest: manifest.name.clone(),
                source,
            })?
            .into_iter()
            .enumerate()
        {
            objects.push(bootstrap_object(&manifest.name, index, doc)?);
        }
    }
    objects.sort_by_key(|o| stage(&o.object.kind));
    let inventory = inventory_data(objects.iter().map(|o| &o.object))?;
    Ok(Plan { objects, inventory })
}

/// The objects of `plan` as one multi-document YAML, the form the manifests
/// step of `talosctl upgrade-k8s` (and the lab's ssa-prune-peer) applies.
/// The owning-inventory annotation is left out: Talos's apply sets it.
pub fn manifest_documents(plan: &Plan) -> String {
    plan.objects
        .iter()
        .map(|o| {
            let mut body = o.body.clone();
            if let Some(a) = body
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                a.remove(OWNING_INVENTORY_ANNOTATION);
            }
            serde_yaml_ng::to_string(&body).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The inventory after an apply: what was there, and every object of the plan.
pub fn inventory_after(
    existing: &BTreeMap<String, String>,
    plan: &Plan,
) -> BTreeMap<String, String> {
    let mut data = existing.clone();
    data.extend(plan.inventory.clone());
    data
}

/// Plays Talos's apply of `config`'s inline manifests on the cluster of `client`.
pub async fn apply(client: &kube::Client, config: &MachineConfig) -> Result<Played, Error> {
    let plan = plan(config)?;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(kube_err("discovering the API server's resources"))?;
    let mut played = Played::default();
    for o in &plan.objects {
        let gvk = kube::api::GroupVersionKind::gvk(
            &o.object.group,
            o.api_version.rsplit('/').next().unwrap_or_default(),
            &o.object.kind,
        );
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| Error::UnknownKind {
                api_version: o.api_version.clone(),
                kind: o.object.kind.clone(),
                manifest: o.manifest.clone(),
            })?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = match o.object.namespace.as_str() {
                    "" => "default",
                    ns => ns,
                };
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let what = o.object.to_string();
        if let Some(live) = api
            .get_opt(&o.object.name)
            .await
            .map_err(kube_err(format!("reading {what}")))?
        {
            if let Some(owner) = live.metadata.annotations.as_ref().and_then(|a| {
                a.get(OWNING_INVENTORY_ANNOTATION)
                    .filter(|v| v.as_str() != INVENTORY_NAME)
            }) {
                return Err(Error::ForeignInventory {
                    object: what,
                    owner: owner.clone(),
                });
            }
            played.found.push(o.object.clone());
            continue;
        }
        let body: DynamicObject =
            serde_json::from_value(o.body.clone()).map_err(|source| Error::NotAnObject {
                manifest: o.manifest.clone(),
                index: 0,
                source,
            })?;
        match api.create(&PostParams::default(), &body).await {
            Ok(_) => played.created.push(o.object.clone()),
            // Created meanwhile by someone else: found, as Talos would see it.
            Err(kube::Error::Api(s)) if s.code == 409 => played.found.push(o.object.clone()),
            Err(e) => return Err(kube_err(format!("creating {what}"))(e)),
        }
    }
    write_inventory(client, &plan).await?;
    Ok(played)
}

/// Writes the inventory ConfigMap: created empty when missing, then its
/// whole `data` replaced, as Talos writes it.
async fn write_inventory(client: &kube::Client, plan: &Plan) -> Result<(), Error> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE);
    let what = format!("ConfigMap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}");
    loop {
        let live = api
            .get_opt(INVENTORY_NAME)
            .await
            .map_err(kube_err(format!("reading {what}")))?;
        let result = match live {
            None => {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(INVENTORY_NAME.into());
                cm.metadata.namespace = Some(INVENTORY_NAMESPACE.into());
                cm.data = Some(inventory_after(&BTreeMap::new(), plan));
                api.create(&PostParams::default(), &cm).await.map(drop)
            }
            Some(mut cm) => {
                cm.data = Some(inventory_after(&cm.data.clone().unwrap_or_default(), plan));
                api.replace(INVENTORY_NAME, &PostParams::default(), &cm)
                    .await
                    .map(drop)
            }
        };
        match result {
            Ok(()) => return Ok(()),
            // Someone wrote it between the read and the write: read again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(kube_err(format!("writing {what}"))(e)),
        }
    }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// Namespaces, then CRDs, then the rest.
fn stage(kind: &str) -> u8 {
    match kind {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        _ => 2,
    }
}

/// The non-empty documents of a multi-document YAML manifest (a `List` is
/// unfolded into its items), read as YAML 1.1 as Talos reads them
/// (`defaultMode: 0400` is an octal integer).
fn documents(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    let text = ichor_helm::manifest::yaml11_octals(text);
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = <Value as serde::Deserialize>::deserialize(doc)?;
        match v {
            Value::Null => {}
            Value::Object(ref m) if m.is_empty() => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(
                    m.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

fn bootstrap_object(
    manifest: &str,
    index: usize,
    mut body: Value,
) -> Result<BootstrapObject, Error> {
    let bad = |why: &str| Error::BadObject {
        manifest: manifest.to_string(),
        index,
        why: why.to_string(),
    };
    let text = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
    let api_version = text("/apiVersion").ok_or_else(|| bad("no apiVersion"))?;
    let kind = text("/kind").ok_or_else(|| bad("no kind"))?;
    let name = text("/metadata/name").ok_or_else(|| bad("no metadata.name"))?;
    let namespace = text("/metadata/namespace").unwrap_or_default();
    let object = InventoryObject::new(&api_version, &kind, &namespace, &name);
    let meta = body
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| bad("metadata is not a mapping"))?;
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if !annotations.is_object() {
        *annotations = Value::Object(Default::default());
    }
    if let Some(a) = annotations.as_object_mut() {
        a.insert(OWNING_INVENTORY_ANNOTATION.into(), INVENTORY_NAME.into());
    }
    Ok(BootstrapObject {
        manifest: manifest.to_string(),
        object,
        api_version,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CILIUM: &str = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: system:cilium\nrules: []\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: cilium\n  namespace: kube-system\n  annotations:\n    keep: me\nspec: {}\n";

    fn legacy(manifest: &str) -> MachineConfig {
        let mut text = String::from(
            "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  inlineManifests:\n    - name: cilium\n      contents: |\n",
        );
        for line in manifest.lines() {
            text.push_str("        ");
            text.push_str(line);
            text.push('\n');
        }
        text.push_str("    - name: extra\n      contents: |\n        apiVersion: v1\n        kind: Namespace\n        metadata:\n          name: extra\n");
        MachineConfig::parse(&text).unwrap()
    }

    /// Covers: R6.1 (the lab's bootstrap-manifest play: the inventory in Talos's
    /// exact format and the annotation on every object it would create)
    #[test]
    fn the_plan_names_every_inline_object_in_talos_format() {
        let plan = plan(&legacy(CILIUM)).unwrap();
        let keys: Vec<&str> = plan.inventory.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "_extra__Namespace",
                "_system__cilium_rbac.authorization.k8s.io_ClusterRole",
                "kube-system_cilium__ServiceAccount",
                "kube-system_cilium_apps_DaemonSet",
            ]
        );
        assert!(plan.inventory.values().all(String::is_empty));
        // The Namespace is staged first.
        assert_eq!(plan.objects[0].object.kind, "Namespace");
        for o in &plan.objects {
            assert_eq!(
                o.body["metadata"]["annotations"][OWNING_INVENTORY_ANNOTATION], INVENTORY_NAME,
                "{}",
                o.object
            );
        }
        let ds = plan
            .objects
            .iter()
            .find(|o| o.object.kind == "DaemonSet")
            .unwrap();
        assert_eq!(ds.body["metadata"]["annotations"]["keep"], "me");
    }

    /// Covers: R6.1 (both config shapes carry inline manifests)
    #[test]
    fn the_multidoc_shape_plays_the_same_objects() {
        let mut text = String::from(
            "version: v1alpha1\nmachine:\n  type: controlplane\n---\napiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: |\n",
        );
        for line in CILIUM.lines() {
            text.push_str("  ");
            text.push_str(line);
            text.push('\n');
        }
        let multidoc = plan(&MachineConfig::parse(&text).unwrap()).unwrap();
        let mut from_legacy = plan(&legacy(CILIUM)).unwrap().inventory;
        from_legacy.remove("_extra__Namespace");
        assert_eq!(multidoc.inventory, from_legacy);
    }

    #[test]
    fn the_inventory_keeps_what_was_there_and_the_documents_drop_the_annotation() {
        let plan = plan(&legacy(CILIUM)).unwrap();
        let mut existing = BTreeMap::new();
        existing.insert(
            "kube-system_coredns_apps_Deployment".to_string(),
            String::new(),
        );
        let after = inventory_after(&existing, &plan);
        assert_eq!(after.len(), 5);
        let docs = manifest_documents(&plan);
        assert!(!docs.contains(OWNING_INVENTORY_ANNOTATION), "{docs}");
        assert_eq!(docs.matches("---\n").count(), 3);
    }

    #[test]
    fn an_object_without_a_name_is_said() {
        let e = plan(&legacy("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")).unwrap_err();
        assert!(e.to_string().contains("no metadata.name"), "{e}");
    }
}
