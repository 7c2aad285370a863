//! An image from its layers: the OCI config, the manifest and the blobs, all
//! computed in memory with no I/O, and serialised canonically (object keys
//! sorted) so the digests depend on the content alone.

use std::collections::{BTreeMap, HashMap};

use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, History, HistoryBuilder, ImageConfigurationBuilder,
    ImageManifestBuilder, MediaType, Os, RootFsBuilder,
};

use crate::Error;
use crate::layer::{FileTree, gzip, sha256};

/// What an image is made of and how it runs.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The repository without registry, e.g. `ichor-controller`.
    pub name: String,
    /// The tag, e.g. `v0.1.0`.
    pub tag: String,
    /// Layers, first to last, each with the line its history shows.
    pub layers: Vec<(String, FileTree)>,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    /// `uid:gid`.
    pub user: String,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch: every file's time and the config's `created`.
    pub created: u64,
}

/// A blob of the image layout, with its media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub digest: String,
    pub media_type: MediaType,
    pub bytes: Vec<u8>,
}

/// A built image: its manifest's digest names it.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub name: String,
    pub tag: String,
    pub manifest: Blob,
    pub config: Blob,
    pub layers: Vec<Blob>,
    /// The config as JSON, for callers that assert on it.
    pub config_json: serde_json::Value,
}

impl BuiltImage {
    /// `sha256:…` of the manifest: the image's digest in a registry.
    pub fn digest(&self) -> &str {
        &self.manifest.digest
    }

    /// Bytes a registry stores for it: compressed layers, config, manifest.
    pub fn compressed_size(&self) -> u64 {
        self.layers
            .iter()
            .chain([&self.config, &self.manifest])
            .map(|b| b.bytes.len() as u64)
            .sum()
    }

    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        self.layers.iter().chain([&self.config, &self.manifest])
    }
}

/// RFC 3339 in UTC for `secs` since the epoch.
pub fn rfc3339(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// JSON with every object's keys sorted: the OCI types keep labels and
/// annotations in hash maps, whose order changes from run to run.
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    fn sort(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let sorted: BTreeMap<&String, serde_json::Value> =
                    map.iter().map(|(k, v)| (k, sort(v))).collect();
                serde_json::Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sort).collect())
            }
            other => other.clone(),
        }
    }
    serde_json::to_vec(&sort(value)).expect("a JSON value serialises")
}

fn oci(what: &'static str) -> impl FnOnce(oci_spec::OciSpecError) -> Error {
    move |source| Error::Oci { what, source }
}

/// The image's layers, compressed: the blobs, the digests of their
/// uncompressed tars (the config's diff ids) and one history entry each.
struct Layers {
    blobs: Vec<Blob>,
    diff_ids: Vec<String>,
    history: Vec<History>,
}

fn layers(spec: &ImageSpec, created: &str) -> Result<Layers, Error> {
    let mut out = Layers {
        blobs: Vec::new(),
        diff_ids: Vec::new(),
        history: Vec::new(),
    };
    for (created_by, tree) in &spec.layers {
        let tar = tree.tar(spec.created)?;
        out.diff_ids.push(sha256(&tar));
        let gz = gzip(&tar)?;
        out.blobs.push(Blob {
            digest: sha256(&gz),
            media_type: MediaType::ImageLayerGzip,
            bytes: gz,
        });
        out.history.push(
            HistoryBuilder::default()
                .created(created.to_string())
                .created_by(created_by.clone())
                .build()
                .map_err(oci("layer history"))?,
        );
    }
    Ok(out)
}

/// The descriptor of a blob, as a manifest names it.
fn descriptor(b: &Blob) -> Result<Descriptor, Error> {
    let digest = b.digest.parse().map_err(oci("digest"))?;
    Ok(Descriptor::new(
        b.media_type.clone(),
        b.bytes.len() as u64,
        oci_spec::image::Digest::clone(&digest),
    ))
}

/// Builds the image in memory.
pub fn build(spec: &ImageSpec) -> Result<BuiltImage, Error> {
    let created = rfc3339(spec.created);
    let Layers {
        blobs: layers,
        diff_ids,
        history,
    } = layers(spec, &created)?;
    let labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    let run = ConfigBuilder::default()
        .user(spec.user.clone())
        .env(spec.env.clone())
        .entrypoint(spec.entrypoint.clone())
        .working_dir(spec.working_dir.clone())
        .labels(labels.clone())
        .build()
        .map_err(oci("run config"))?;
    let config = ImageConfigurationBuilder::default()
        .created(created.clone())
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(run)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(diff_ids)
                .build()
                .map_err(oci("rootfs"))?,
        )
        .history(history)
        .build()
        .map_err(oci("image config"))?;
    let config_json = serde_json::to_value(&config).expect("the image config serialises");
    let config_bytes = canonical_json(&config_json);
    let config_blob = Blob {
        digest: sha256(&config_bytes),
        media_type: MediaType::ImageConfig,
        bytes: config_bytes,
    };
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(&config_blob)?)
        .layers(
            layers
                .iter()
                .map(descriptor)
                .collect::<Result<Vec<_>, _>>()?,
        )
        .annotations(labels)
        .build()
        .map_err(oci("manifest"))?;
    let manifest_bytes =
        canonical_json(&serde_json::to_value(&manifest).expect("the manifest serialises"));
    Ok(BuiltImage {
        name: spec.name.clone(),
        tag: spec.tag.clone(),
        manifest: Blob {
            digest: sha256(&manifest_bytes),
            media_type: MediaType::ImageManifest,
            bytes: manifest_bytes,
        },
        config: config_blob,
        layers,
        config_json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(labels: &[(&str, &str)]) -> ImageSpec {
        let mut tree = FileTree::new();
        tree.file("/usr/local/bin/app", b"#!".to_vec(), 0o755);
        ImageSpec {
            name: "app".into(),
            tag: "v1".into(),
            layers: vec![("app".into(), tree)],
            entrypoint: vec!["/usr/local/bin/app".into()],
            env: vec!["PATH=/usr/local/bin".into()],
            user: "65532:65532".into(),
            working_dir: "/".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created: 1_700_000_000,
        }
    }

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn building_twice_gives_one_digest_even_with_many_labels() {
        let labels: Vec<(String, String)> = (0..32)
            .map(|i| (format!("label.{i}"), format!("{i}")))
            .collect();
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let a = build(&spec(&labels)).unwrap();
        let b = build(&spec(&labels)).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.config.bytes, b.config.bytes);
    }

    #[test]
    fn config_says_how_the_image_runs() {
        let image = build(&spec(&[("org.opencontainers.image.version", "v1")])).unwrap();
        let c = &image.config_json;
        assert_eq!(c["architecture"], "amd64");
        assert_eq!(c["os"], "linux");
        assert_eq!(c["config"]["User"], "65532:65532");
        assert_eq!(c["config"]["Entrypoint"][0], "/usr/local/bin/app");
        assert_eq!(
            c["config"]["Labels"]["org.opencontainers.image.version"],
            "v1"
        );
        assert_eq!(c["rootfs"]["diff_ids"].as_array().unwrap().len(), 1);
        let manifest: serde_json::Value = serde_json::from_slice(&image.manifest.bytes).unwrap();
        assert_eq!(manifest["config"]["digest"], image.config.digest.as_str());
        assert_eq!(
            manifest["layers"][0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
    }
}
