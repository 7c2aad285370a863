//! A pod's Secret, ConfigMap and emptyDir volumes, projected into the lab's
//! state folder as the kubelet's atomic writer does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Secret};
use kube::api::Api;

/// Where a volume's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A Secret's keys (`items` picks and renames them).
    Secret {
        name: String,
        items: Vec<(String, String)>,
    },
    /// A ConfigMap's keys.
    ConfigMap {
        name: String,
        items: Vec<(String, String)>,
    },
    /// Anything else (an emptyDir): an empty folder.
    Empty,
}

/// A volume the container mounts, as the lab projects it: the files of its
/// Secret or ConfigMap under `dir`, the folder the process sees in place
/// of `mount_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub volume: String,
    pub mount_path: String,
    pub dir: PathBuf,
    pub source: VolumeSource,
    /// A Secret or ConfigMap the volume may lack (`optional: true`): then
    /// the folder is empty instead of the container not starting.
    pub optional: bool,
}

/// The container's volume mounts, each projected into `base/<volume>`.
pub fn mounts(pod_spec: &PodSpec, container: &Container, base: &Path) -> Vec<Mount> {
    let items = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| {
        items
            .into_iter()
            .flatten()
            .map(|i| (i.key.clone(), i.path.clone()))
            .collect::<Vec<_>>()
    };
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|vm| {
            let volume = pod_spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == vm.name);
            let optional = volume.is_some_and(|v| {
                v.secret.as_ref().and_then(|s| s.optional).unwrap_or(false)
                    || v.config_map
                        .as_ref()
                        .and_then(|c| c.optional)
                        .unwrap_or(false)
            });
            let source = match volume {
                Some(v) if v.secret.is_some() => {
                    let s = v.secret.as_ref().expect("checked");
                    VolumeSource::Secret {
                        name: s.secret_name.clone().unwrap_or_default(),
                        items: items(s.items.as_ref()),
                    }
                }
                Some(v) if v.config_map.is_some() => {
                    let c = v.config_map.as_ref().expect("checked");
                    VolumeSource::ConfigMap {
                        name: c.name.clone(),
                        items: items(c.items.as_ref()),
                    }
                }
                _ => VolumeSource::Empty,
            };
            Mount {
                volume: vm.name.clone(),
                mount_path: vm.mount_path.clone(),
                dir: base.join(&vm.name),
                source,
                optional,
            }
        })
        .collect()
}

/// The files a volume holds: every key, or the `items` chosen, at their paths.
fn volume_files(
    data: BTreeMap<String, Vec<u8>>,
    items: &[(String, String)],
) -> BTreeMap<String, Vec<u8>> {
    if items.is_empty() {
        return data;
    }
    items
        .iter()
        .filter_map(|(key, path)| data.get(key).map(|v| (path.clone(), v.clone())))
        .collect()
}

/// Why a volume could not be projected: the kubelet's words, as the pod's
/// status shows them (the container does not start without its volume).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("MountVolume.SetUp failed for volume \"{volume}\": reading {kind} \"{name}\"")]
    Read {
        volume: String,
        /// `secret` or `configmap`, as the kubelet names them.
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("MountVolume.SetUp failed for volume \"{volume}\": {kind} \"{name}\" not found")]
    NotFound {
        volume: String,
        kind: &'static str,
        name: String,
    },
    #[error("writing volume \"{volume}\" into {dir}")]
    Write {
        volume: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the volume's Secret or ConfigMap and writes its files.
pub(super) async fn project_volume(
    client: &kube::Client,
    ns: &str,
    m: &Mount,
) -> Result<(), VolumeError> {
    let files = match &m.source {
        VolumeSource::Secret { name, items } => {
            let secret: Secret = read_source(client, ns, m, "secret", name).await?;
            let data = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            volume_files(data, items)
        }
        VolumeSource::ConfigMap { name, items } => {
            let cm: ConfigMap = read_source(client, ns, m, "configmap", name).await?;
            let mut data: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            data.extend(
                cm.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            volume_files(data, items)
        }
        VolumeSource::Empty => BTreeMap::new(),
    };
    atomic_write(&m.dir, &files).map_err(|source| VolumeError::Write {
        volume: m.volume.clone(),
        dir: m.dir.clone(),
        source,
    })
}

/// The Secret or ConfigMap `name` a volume takes its files from; an empty
/// one when it is missing and the volume is `optional`.
async fn read_source<K>(
    client: &kube::Client,
    ns: &str,
    m: &Mount,
    kind: &'static str,
    name: &str,
) -> Result<K, VolumeError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Default
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|source| VolumeError::Read {
            volume: m.volume.clone(),
            kind,
            name: name.into(),
            source,
        })?
        .or_else(|| m.optional.then(Default::default))
        .ok_or_else(|| VolumeError::NotFound {
            volume: m.volume.clone(),
            kind,
            name: name.into(),
        })
}

/// Writes `files` into `dir` as the kubelet's atomic writer does: a fresh
/// timestamped folder, a `..data` link swapped to it in one rename, and one
/// link per file through `..data`, so a reader never sees half an update
/// (a certificate beside the previous key). Unchanged files write nothing.
pub fn atomic_write(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    let current: Option<BTreeMap<String, Vec<u8>>> = std::fs::read_link(&data).ok().map(|_| {
        files
            .keys()
            .filter_map(|k| std::fs::read(data.join(k)).ok().map(|v| (k.clone(), v)))
            .collect()
    });
    let listed = std::fs::read_dir(&data).map(|r| r.count()).unwrap_or(0);
    if current.as_ref() == Some(files) && listed == files.len() {
        return Ok(());
    }
    let stamp = format!("..{}", chrono::Utc::now().format("%Y_%m_%d_%H_%M_%S.%f"));
    let fresh = dir.join(&stamp);
    std::fs::create_dir_all(&fresh)?;
    for (name, bytes) in files {
        let path = fresh.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    let old = std::fs::read_link(&data).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    for name in files.keys() {
        let top = name.split('/').next().unwrap_or(name);
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
        }
    }
    // Links to files the volume no longer has, and the previous folder, go.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let gone =
            !name.starts_with("..") && !files.keys().any(|k| k.split('/').next() == Some(&name));
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old.filter(|o| o != Path::new(&stamp)) {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use serde_json::json;

    use crate::pods::command_line;

    use super::*;

    #[test]
    fn the_uis_secret_volume_is_projected_and_its_paths_rewritten() {
        let pod: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "ui", "image": "ghcr.io/maeshinshin/ichor-ui:v0.1.0",
                "args": ["ui", "--listen", "0.0.0.0:8443", "--tls-cert", "/etc/ichor-ui/tls/tls.crt",
                    "--tls-key", "/etc/ichor-ui/tls/tls.key", "--tls-ca", "/etc/ichor-ui/ca/ca.crt",
                    "--other", "/etc/ichor-ui/tlsx"],
                "volumeMounts": [{"name": "tls", "mountPath": "/etc/ichor-ui/tls"},
                    {"name": "ca", "mountPath": "/etc/ichor-ui/ca/"}]}],
            "volumes": [{"name": "tls", "secret": {"secretName": "ui-cert"}},
                {"name": "ca", "configMap": {"name": "ui-ca", "items": [{"key": "bundle", "path": "ca.crt"}]}}]
        }))
        .unwrap();
        let container = pod.containers[0].clone();
        let m = mounts(&pod, &container, Path::new("/lab/vol"));
        assert_eq!(
            m.iter().map(|m| &m.source).collect::<Vec<_>>(),
            [
                &VolumeSource::Secret {
                    name: "ui-cert".into(),
                    items: vec![]
                },
                &VolumeSource::ConfigMap {
                    name: "ui-ca".into(),
                    items: vec![("bundle".into(), "ca.crt".into())]
                }
            ]
        );
        let ports = BTreeMap::from([(8443, 31000)]);
        let line = command_line(&container, Ipv4Addr::new(127, 9, 9, 10), &ports, &m);
        assert_eq!(
            line,
            [
                "ui",
                "--listen",
                "127.9.9.10:31000",
                "--tls-cert",
                "/lab/vol/tls/tls.crt",
                "--tls-key",
                "/lab/vol/tls/tls.key",
                "--tls-ca",
                "/lab/vol/ca/ca.crt",
                "--other",
                "/etc/ichor-ui/tlsx"
            ]
        );
        let data = BTreeMap::from([
            ("bundle".to_string(), b"ca".to_vec()),
            ("other".to_string(), b"x".to_vec()),
        ]);
        assert_eq!(
            volume_files(data, &[("bundle".into(), "ca.crt".into())]),
            BTreeMap::from([("ca.crt".to_string(), b"ca".to_vec())])
        );
    }

    #[test]
    fn a_volume_is_swapped_whole_and_unchanged_files_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("tls");
        let first = BTreeMap::from([
            ("tls.crt".to_string(), b"cert-1".to_vec()),
            ("tls.key".to_string(), b"key-1".to_vec()),
        ]);
        atomic_write(&v, &first).unwrap();
        assert_eq!(std::fs::read(v.join("tls.crt")).unwrap(), b"cert-1");
        let data_before = std::fs::read_link(v.join("..data")).unwrap();
        atomic_write(&v, &first).unwrap();
        assert_eq!(std::fs::read_link(v.join("..data")).unwrap(), data_before);

        let second = BTreeMap::from([("tls.crt".to_string(), b"cert-2".to_vec())]);
        atomic_write(&v, &second).unwrap();
        assert_eq!(std::fs::read(v.join("tls.crt")).unwrap(), b"cert-2");
        assert!(!v.join("tls.key").exists(), "a key the Secret lost is gone");
        assert!(!v.join(&data_before).exists(), "the old folder is gone");
    }
}
