//! Phase `files`: what talosctl needs, and the objects as they were, on disk
//! before anything is deleted.

use std::path::{Path, PathBuf};

use ichor_adopt::reclaim::{self, ClusterReclaim};
use ichor_api::error_text::chain;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::private_file::{self, PrivateFileError};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{DEFAULT_CERT_VALIDITY, Role, Talosconfig};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;

use super::{Reclaim, ReclaimError, failed};

/// Phase `files`: each cluster's bundle (as the Secret holds it), an admin
/// talosconfig minted from it, and its objects as they were, written before
/// anything is deleted. A file already there is kept when it is the same
/// (a rerun); a different one is refused, never overwritten.
pub(super) async fn files(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    for c in &r.plan.clusters {
        let dir = PathBuf::from(&c.dir);
        create_private_dir(&dir)?;
        let bundle_text = read_bundle(r.kube, c).await?;
        let bundle = SecretsBundle::parse(
            &bundle_text,
            &format!("Secret {}/{}", c.namespace, c.secret),
        )
        .map_err(|e| {
            ReclaimError::Files(format!(
                "{}; nothing was deleted",
                ichor_talos::redact::quoted_values(&chain(&e))
            ))
        })?;
        let bundle_path = dir.join(reclaim::BUNDLE_FILE);
        write_once(&bundle_path, bundle_text.as_bytes(), "the secrets bundle")?;
        let talosconfig_path = dir.join(reclaim::TALOSCONFIG_FILE);
        write_talosconfig(&talosconfig_path, &bundle, c)?;
        let objects_path = dir.join(reclaim::OBJECTS_FILE);
        if !objects_path.exists() {
            let text = objects_yaml(r.kube, c).await?;
            write_once(&objects_path, text.as_bytes(), "the objects")?;
        }
        r.say(&format!(
            "wrote the secrets bundle and talosconfig of TalosCluster {}/{} to {}/ (talosctl --talosconfig {} works from now on)",
            c.namespace,
            c.name,
            c.dir,
            talosconfig_path.display()
        ));
    }
    Ok(())
}

/// The bundle text the cluster's Secret holds.
async fn read_bundle(kube: &kube::Client, c: &ClusterReclaim) -> Result<String, ReclaimError> {
    let secrets = Api::<Secret>::namespaced(kube.clone(), &c.namespace);
    let cluster = Api::<TalosCluster>::namespaced(kube.clone(), &c.namespace)
        .get(&c.name)
        .await
        .map_err(failed(format!(
            "reading TalosCluster {}/{}",
            c.namespace, c.name
        )))?;
    let key = cluster
        .spec
        .secrets_ref
        .key
        .clone()
        .unwrap_or_else(|| "secrets.yaml".into());
    let Some(secret) = secrets.get_opt(&c.secret).await.map_err(failed(format!(
        "reading Secret {}/{}",
        c.namespace, c.secret
    )))?
    else {
        return Err(ReclaimError::Files(format!(
            "TalosCluster {}/{} names the Secret {} for its secrets bundle, but it does not exist, so there is nothing to hand to talosctl. Restore the Secret (or delete the TalosCluster yourself if you hold the bundle elsewhere), then run ichor reclaim again; nothing was deleted",
            c.namespace, c.name, c.secret
        )));
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            ReclaimError::Files(format!(
                "Secret {}/{} has no key {key}, where TalosCluster {} keeps its bundle; nothing was deleted",
                c.namespace, c.secret, c.name
            ))
        })?;
    String::from_utf8(bytes).map_err(|_| {
        ReclaimError::Files(format!(
            "Secret {}/{} key {key} is not text, so it is not a secrets bundle; nothing was deleted",
            c.namespace, c.secret
        ))
    })
}

/// The talosconfig: kept when one minted from this bundle is there (its CA
/// is the bundle's OS CA), refused when another is, minted otherwise.
fn write_talosconfig(
    path: &Path,
    bundle: &SecretsBundle,
    c: &ClusterReclaim,
) -> Result<(), ReclaimError> {
    let (os_ca, _) = bundle.os_ca_pem().ok_or_else(|| {
        ReclaimError::Files(format!(
            "the bundle of TalosCluster {}/{} has no OS CA (certs.os), so no talosconfig can be made from it; nothing was deleted",
            c.namespace, c.name
        ))
    })?;
    if path.exists() {
        let same_cluster = Talosconfig::from_file(path)
            .ok()
            .and_then(|tc| {
                let (name, ctx) = tc.context(None, "").ok()?;
                let ca = ctx.credentials(name, "").ok()?.ca_pem?;
                Some(ca.trim() == os_ca.trim())
            })
            .unwrap_or(false);
        return if same_cluster {
            Ok(())
        } else {
            Err(refuse_overwrite(path, "a talosconfig"))
        };
    }
    let control_planes: Vec<String> = c
        .machines
        .iter()
        .filter(|m| m.role == "controlplane")
        .map(|m| m.address.clone())
        .collect();
    let nodes: Vec<String> = c.machines.iter().map(|m| m.address.clone()).collect();
    let tc = Talosconfig::generate(
        bundle,
        &c.name,
        &control_planes,
        &nodes,
        Role::Admin,
        DEFAULT_CERT_VALIDITY,
    )
    .map_err(talosconfig_failed(c))?;
    let text = tc.to_yaml().map_err(talosconfig_failed(c))?;
    write_once(path, text.as_bytes(), "the talosconfig")
}

fn talosconfig_failed(
    c: &ClusterReclaim,
) -> impl FnOnce(ichor_talos::talosconfig::TalosconfigError) -> ReclaimError {
    let (namespace, cluster) = (c.namespace.clone(), c.name.clone());
    move |source| ReclaimError::Talosconfig {
        namespace,
        cluster,
        source,
    }
}

fn refuse_overwrite(path: &Path, what: &str) -> ReclaimError {
    ReclaimError::Files(format!(
        "{} exists and is not {what} of this cluster; refusing to overwrite it. Choose another --output-dir or move the file away, then run ichor reclaim again; nothing was deleted",
        path.display()
    ))
}

/// Writes `bytes` to a new file with mode 0600 (Ichor's one private-file
/// writer); an existing file with the same bytes is kept, another one refused.
pub(super) fn write_once(path: &Path, bytes: &[u8], what: &str) -> Result<(), ReclaimError> {
    match private_file::write_once(path, bytes) {
        Ok(_) => Ok(()),
        Err(PrivateFileError::Differs { .. }) => Err(refuse_overwrite(path, what)),
        Err(e @ PrivateFileError::Symlink { .. }) => Err(ReclaimError::Files(format!(
            "writing {what}: {e}. Remove it or choose another --output-dir, then run ichor reclaim again; nothing was deleted"
        ))),
        Err(e) => Err(ReclaimError::Files(format!(
            "writing {what} to {}: {}; check that the folder is writable. Nothing was deleted",
            path.display(),
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
        ))),
    }
}

/// The folder of one cluster's files: created 0700, refused when others may
/// write to it, tightened when others may read it.
fn create_private_dir(dir: &Path) -> Result<(), ReclaimError> {
    match private_file::prepare_dir(dir) {
        Ok(_) => Ok(()),
        Err(e @ PrivateFileError::SharedDirectory { .. }) => Err(ReclaimError::Files(format!(
            "{e}: remove their write permission (chmod go-w {}) or choose another --output-dir. Nothing was deleted",
            dir.display()
        ))),
        Err(e) => Err(ReclaimError::Files(format!(
            "creating {}: {}; choose a writable --output-dir. Nothing was deleted",
            dir.display(),
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
        ))),
    }
}

/// The TalosCluster and its TalosMachines as YAML documents, without
/// managedFields (the record of what Ichor managed; no secret in them).
async fn objects_yaml(kube: &kube::Client, c: &ClusterReclaim) -> Result<String, ReclaimError> {
    let cluster = Api::<TalosCluster>::namespaced(kube.clone(), &c.namespace)
        .get(&c.name)
        .await
        .map_err(failed(format!(
            "reading TalosCluster {}/{}",
            c.namespace, c.name
        )))?;
    let machines = Api::<TalosMachine>::namespaced(kube.clone(), &c.namespace);
    let mut docs = vec![document(&cluster)?];
    for m in &c.machines {
        if let Some(machine) = machines
            .get_opt(&m.name)
            .await
            .map_err(failed(format!("reading TalosMachine {}", m.name)))?
        {
            docs.push(document(&machine)?);
        }
    }
    Ok(docs.join("---\n"))
}

fn document<K: serde::Serialize>(obj: &K) -> Result<String, ReclaimError> {
    let mut v = serde_json::to_value(obj)
        .map_err(|e| ReclaimError::Files(format!("serialising an object: {}", chain(&e))))?;
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    serde_yaml_ng::to_string(&v)
        .map_err(|e| ReclaimError::Files(format!("serialising an object: {}", chain(&e))))
}
