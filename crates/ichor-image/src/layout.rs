//! An OCI image layout on disk (`oci-layout`, `index.json`, `blobs/sha256/…`),
//! the form `crane push DIR REF` uploads, and its archive (a deterministic tar
//! of the same files) for carrying it around.

use std::path::Path;

use crate::Error;
use crate::image::{BuiltImage, canonical_json};
use crate::layer::FileTree;

/// The annotation an OCI layout's index uses to name a manifest.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The files of the layout for `image`, as a tree (paths relative to the
/// layout's root).
pub fn layout_tree(image: &BuiltImage) -> FileTree {
    let mut tree = FileTree::new();
    tree.file(
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        0o644,
    );
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": image.digest(),
            "size": image.manifest.bytes.len(),
            "annotations": {REF_NAME: image.tag},
            "platform": {"architecture": "amd64", "os": "linux"},
        }],
    });
    tree.file("index.json", canonical_json(&index), 0o644);
    for blob in image.blobs() {
        let hex = blob.digest.trim_start_matches("sha256:");
        tree.file(&format!("blobs/sha256/{hex}"), blob.bytes.clone(), 0o644);
    }
    tree
}

/// Writes the layout into `dir`, replacing what a previous build left there.
/// The directory appears complete or not at all: it is written beside and
/// renamed into place.
pub fn write_layout(image: &BuiltImage, dir: &Path) -> Result<(), Error> {
    let io = |what: &str, source: std::io::Error| Error::Io {
        what: format!("{what} {}", dir.display()),
        source,
    };
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io("creating the parent of", e))?;
    let staging = tempfile::Builder::new()
        .prefix(".layout-")
        .tempdir_in(parent)
        .map_err(|e| io("creating a staging folder beside", e))?;
    let tar = layout_tree(image).tar(0)?;
    tar::Archive::new(tar.as_slice())
        .unpack(staging.path())
        .map_err(|e| io("writing the layout for", e))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io("removing the previous", e))?;
    }
    let staged = staging.keep();
    std::fs::rename(&staged, dir).map_err(|e| io("moving the layout into", e))?;
    Ok(())
}

/// The layout as one deterministic tar (`docker`-free transport; unpack it
/// and `crane push` the folder).
pub fn archive(image: &BuiltImage, mtime: u64) -> Result<Vec<u8>, Error> {
    layout_tree(image).tar(mtime)
}
