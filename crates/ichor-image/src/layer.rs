//! A layer's filesystem and its deterministic tar: entries sorted by path,
//! every parent directory present, one fixed time, numeric owners only — so
//! the same files always give the same bytes, and so the same digest.

use std::collections::BTreeMap;
use std::io::Write;

use sha2::{Digest as _, Sha256};

use crate::Error;

/// One node of an image's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File {
        content: Vec<u8>,
        mode: u32,
        uid: u64,
    },
    Dir {
        mode: u32,
        uid: u64,
    },
    Symlink {
        target: String,
    },
}

/// The files of one layer, keyed by their path without the leading `/`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileTree {
    nodes: BTreeMap<String, Node>,
}

impl FileTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// A root-owned file. `path` is absolute inside the image.
    pub fn file(&mut self, path: &str, content: Vec<u8>, mode: u32) -> &mut Self {
        self.insert(
            path,
            Node::File {
                content,
                mode,
                uid: 0,
            },
        )
    }

    /// A directory owned by `uid` (0 for root).
    pub fn dir(&mut self, path: &str, mode: u32, uid: u64) -> &mut Self {
        self.insert(path, Node::Dir { mode, uid })
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.insert(
            path,
            Node::Symlink {
                target: target.to_string(),
            },
        )
    }

    fn insert(&mut self, path: &str, node: Node) -> &mut Self {
        self.nodes
            .insert(path.trim_start_matches('/').to_string(), node);
        self
    }

    /// Paths in the tree, with every parent directory that was not given
    /// explicitly added as a root-owned 0755 directory.
    fn complete(&self) -> BTreeMap<String, Node> {
        let mut all = self.nodes.clone();
        for path in self.nodes.keys() {
            let mut parent = path.as_str();
            while let Some((p, _)) = parent.rsplit_once('/') {
                all.entry(p.to_string()).or_insert(Node::Dir {
                    mode: 0o755,
                    uid: 0,
                });
                parent = p;
            }
        }
        all
    }

    /// The uncompressed tar of this tree: sorted, with `mtime` on every entry.
    pub fn tar(&self, mtime: u64) -> Result<Vec<u8>, Error> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, node) in self.complete() {
            let mut header = tar::Header::new_ustar();
            header.set_mtime(mtime);
            header.set_gid(0);
            match &node {
                Node::File { content, mode, uid } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_uid(*uid);
                    header.set_size(content.len() as u64);
                    builder
                        .append_data(&mut header, &path, content.as_slice())
                        .map_err(|source| Error::Tar {
                            path: path.clone(),
                            source,
                        })?;
                }
                Node::Dir { mode, uid } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_uid(*uid);
                    header.set_size(0);
                    builder
                        .append_data(&mut header, format!("{path}/"), std::io::empty())
                        .map_err(|source| Error::Tar {
                            path: path.clone(),
                            source,
                        })?;
                }
                Node::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_uid(0);
                    header.set_size(0);
                    builder
                        .append_link(&mut header, &path, target)
                        .map_err(|source| Error::Tar {
                            path: path.clone(),
                            source,
                        })?;
                }
            }
        }
        builder.into_inner().map_err(|source| Error::Tar {
            path: "the end of the archive".into(),
            source,
        })
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }
}

/// Gzip with no name and no time in the header, so equal input gives equal
/// output.
pub fn gzip(bytes: &[u8]) -> Result<Vec<u8>, Error> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).map_err(Error::Gzip)?;
    encoder.finish().map_err(Error::Gzip)
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tar: &[u8]) -> Vec<(String, u64, u64)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mtime().unwrap(),
                    e.header().uid().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn entries_are_sorted_with_their_parents_and_one_time() {
        let mut tree = FileTree::new();
        tree.file("/usr/local/bin/ichor", b"x".to_vec(), 0o755)
            .dir("/tmp", 0o1777, 0)
            .file("/etc/passwd", b"p".to_vec(), 0o644);
        let tar = tree.tar(42).unwrap();
        let got = names(&tar);
        let paths: Vec<&str> = got.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/passwd",
                "tmp/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/ichor"
            ]
        );
        assert!(got.iter().all(|(_, t, uid)| *t == 42 && *uid == 0));
    }

    #[test]
    fn the_same_tree_gives_the_same_bytes_whatever_the_insertion_order() {
        let mut a = FileTree::new();
        a.file("/b", b"2".to_vec(), 0o644)
            .file("/a", b"1".to_vec(), 0o644);
        let mut b = FileTree::new();
        b.file("/a", b"1".to_vec(), 0o644)
            .file("/b", b"2".to_vec(), 0o644);
        let (ta, tb) = (a.tar(7).unwrap(), b.tar(7).unwrap());
        assert_eq!(ta, tb);
        assert_eq!(gzip(&ta).unwrap(), gzip(&tb).unwrap());
        assert_ne!(a.tar(8).unwrap(), ta, "the time is part of the layer");
    }
}
