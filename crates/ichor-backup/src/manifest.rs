//! A backup's manifest and where its objects live.
//!
//! One folder per backup, `<prefix>/<cluster>/<backup-name>/`, holding the
//! encrypted parts and, written last, `manifest.json.age`: a backup is
//! complete exactly when its manifest exists. A backup's name is its
//! cluster's name and its start time in UTC, `<cluster>-YYYYMMDDhhmmss`, so
//! names sort by time; a manual or operation backup may carry a suffix.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

/// The manifest format this crate writes and reads.
pub const FORMAT: u32 = 1;

/// What a backup is of and what it holds; JSON, camelCase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: u32,
    pub cluster: ClusterRef,
    /// The backup's name, the last segment of its folder.
    pub backup: String,
    pub reason: Reason,
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    pub talos_version: String,
    pub kubernetes_version: String,
    pub etcd: EtcdFacts,
    pub parts: Vec<PartRecord>,
    /// The sha256 of the secrets bundle, to match a backup to its cluster's
    /// bundle without decrypting it.
    pub bundle_fingerprint: String,
}

/// The TalosCluster a backup is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    pub name: String,
    pub uid: String,
}

/// Why a backup was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reason {
    /// The backup schedule came due.
    Schedule,
    /// A TalosOperation takes one before it touches a control plane.
    Operation,
    /// Someone asked for one.
    Manual,
}

/// The etcd snapshot's facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdFacts {
    pub revision: u64,
    /// The member the snapshot was read from.
    pub member: String,
    /// The database's size, without the stream's trailer.
    pub db_size: u64,
    /// The database's sha256 (the trailer's value), lower-case hex.
    pub sha256: String,
}

/// One encrypted part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartRecord {
    pub name: Part,
    /// The object's key.
    pub key: String,
    /// The plaintext's size and sha256 (lower-case hex).
    pub size: u64,
    pub sha256: String,
}

/// The objects of one backup's folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Part {
    #[serde(rename = "etcd.snapshot")]
    EtcdSnapshot,
    #[serde(rename = "bundle.yaml")]
    Bundle,
    #[serde(rename = "objects.yaml")]
    Objects,
    #[serde(rename = "manifest.json")]
    Manifest,
}

impl Part {
    pub const ALL: [Part; 4] = [
        Part::EtcdSnapshot,
        Part::Bundle,
        Part::Objects,
        Part::Manifest,
    ];

    /// The object's file name in the backup's folder.
    pub fn file_name(self) -> &'static str {
        match self {
            Part::EtcdSnapshot => "etcd.snapshot.age",
            Part::Bundle => "bundle.yaml.age",
            Part::Objects => "objects.yaml.age",
            Part::Manifest => "manifest.json.age",
        }
    }

    fn from_file_name(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.file_name() == name)
    }
}

/// Why a manifest is refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("the backup manifest is not JSON of the manifest's shape")]
    Json(#[from] serde_json::Error),
    #[error("the backup manifest has format {found}; this Ichor reads format {FORMAT}")]
    Format { found: u32 },
}

impl Manifest {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest always serialises")
    }

    pub fn from_json(json: &[u8]) -> Result<Self, ManifestError> {
        // The format first, so a newer manifest is refused for its format
        // rather than for a field this Ichor does not know.
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        let head: Head = serde_json::from_slice(json)?;
        if head.format != FORMAT {
            return Err(ManifestError::Format { found: head.format });
        }
        Ok(serde_json::from_slice(json)?)
    }

    /// The part's record, if the manifest lists it.
    pub fn part(&self, part: Part) -> Option<&PartRecord> {
        self.parts.iter().find(|p| p.name == part)
    }
}

const NAME_TIME: &str = "%Y%m%d%H%M%S";

/// A backup's name: `<cluster>-<UTC YYYYMMDDhhmmss>`, then `-<suffix>` when
/// one is given (`manual`, `operation`).
pub fn backup_name(cluster: &str, started: DateTime<Utc>, suffix: Option<&str>) -> String {
    let mut name = format!("{cluster}-{}", started.format(NAME_TIME));
    if let Some(s) = suffix {
        name.push('-');
        name.push_str(s);
    }
    name
}

/// The start time a backup's name carries, when it is a backup name of
/// `cluster`.
pub fn backup_time(cluster: &str, name: &str) -> Option<DateTime<Utc>> {
    let rest = name.strip_prefix(cluster)?.strip_prefix('-')?;
    let stamp = rest.get(..14)?;
    if !(rest.len() == 14 || rest[14..].starts_with('-')) {
        return None;
    }
    NaiveDateTime::parse_from_str(stamp, NAME_TIME)
        .ok()
        .map(|t| t.and_utc())
}

/// Where a destination's backups live: the prefix inside the bucket or
/// folder (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

/// A key of the layout, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKey {
    pub cluster: String,
    pub backup: String,
    pub part: Part,
}

/// Why a key is not one of a backup's objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("object {key} is not under the backups' prefix {prefix:?}")]
    OutsidePrefix { key: String, prefix: String },
    #[error("object {key} is not <cluster>/<backup>/<part>")]
    Shape { key: String },
    #[error(
        "object {key} is not a backup part (etcd.snapshot.age, bundle.yaml.age, objects.yaml.age, manifest.json.age)"
    )]
    UnknownPart { key: String },
    #[error(
        "object {key}: {backup} is not a backup name of cluster {cluster} (<cluster>-YYYYMMDDhhmmss)"
    )]
    Name {
        key: String,
        cluster: String,
        backup: String,
    },
}

impl Layout {
    /// A layout under `prefix`; slashes around it are dropped.
    pub fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn join(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_string()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    /// The folder of all of a cluster's backups, with its trailing `/`:
    /// what a listing for retention or recover asks for, so a cluster whose
    /// name starts with another's is not listed with it.
    pub fn cluster_folder(&self, cluster: &str) -> String {
        self.join(&format!("{cluster}/"))
    }

    /// The folder of one backup, with its trailing `/`.
    pub fn backup_folder(&self, cluster: &str, backup: &str) -> String {
        self.join(&format!("{cluster}/{backup}/"))
    }

    /// The key of one part of a backup.
    pub fn key(&self, cluster: &str, backup: &str, part: Part) -> String {
        self.join(&format!("{cluster}/{backup}/{}", part.file_name()))
    }

    /// Reads a key back into its cluster, backup and part.
    pub fn parse_key(&self, key: &str) -> Result<ObjectKey, KeyError> {
        let rest = if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(&self.prefix)
                .and_then(|r| r.strip_prefix('/'))
        };
        let rest = rest.ok_or_else(|| KeyError::OutsidePrefix {
            key: key.to_string(),
            prefix: self.prefix.clone(),
        })?;
        let segs: Vec<&str> = rest.split('/').collect();
        let [cluster, backup, file] = segs[..] else {
            return Err(KeyError::Shape {
                key: key.to_string(),
            });
        };
        if cluster.is_empty() || backup.is_empty() {
            return Err(KeyError::Shape {
                key: key.to_string(),
            });
        }
        let part = Part::from_file_name(file).ok_or_else(|| KeyError::UnknownPart {
            key: key.to_string(),
        })?;
        if backup_time(cluster, backup).is_none() {
            return Err(KeyError::Name {
                key: key.to_string(),
                cluster: cluster.to_string(),
                backup: backup.to_string(),
            });
        }
        Ok(ObjectKey {
            cluster: cluster.to_string(),
            backup: backup.to_string(),
            part,
        })
    }
}

/// One backup as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub started: DateTime<Utc>,
    pub parts: Vec<Part>,
}

impl Listed {
    /// Complete exactly when its manifest exists: the manifest is written
    /// last, after every part it lists.
    pub fn is_complete(&self) -> bool {
        self.parts.contains(&Part::Manifest)
    }
}

/// The backups of `cluster` among `keys` (a listing of its folder), oldest
/// first. Keys of other clusters and keys that are not backup parts are
/// left out.
pub fn backups_of<'a>(
    layout: &Layout,
    cluster: &str,
    keys: impl IntoIterator<Item = &'a str>,
) -> Vec<Listed> {
    let mut by_name: BTreeMap<String, Vec<Part>> = BTreeMap::new();
    for key in keys {
        let Ok(k) = layout.parse_key(key) else {
            continue;
        };
        if k.cluster != cluster {
            continue;
        }
        let parts = by_name.entry(k.backup).or_default();
        if !parts.contains(&k.part) {
            parts.push(k.part);
        }
    }
    let mut out: Vec<Listed> = by_name
        .into_iter()
        .filter_map(|(name, mut parts)| {
            parts.sort();
            Some(Listed {
                started: backup_time(cluster, &name)?,
                name,
                parts,
            })
        })
        .collect();
    out.sort_by(|a, b| a.started.cmp(&b.started).then(a.name.cmp(&b.name)));
    out
}

/// The newest complete backup of a listing (what `ichor recover` picks when
/// not told which).
pub fn newest_complete(listed: &[Listed]) -> Option<&Listed> {
    listed.iter().rev().find(|l| l.is_complete())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        let layout = Layout::new("backups/");
        let started = Utc.with_ymd_and_hms(2026, 12, 2, 1, 0, 0).unwrap();
        let name = backup_name("prod", started, None);
        Manifest {
            format: FORMAT,
            cluster: ClusterRef {
                name: "prod".into(),
                uid: "6c0e3a5e-1b2c-4d5e-8f90-1234567890ab".into(),
            },
            backup: name.clone(),
            reason: Reason::Schedule,
            started,
            finished: started + chrono::Duration::seconds(42),
            talos_version: "v1.13.9".into(),
            kubernetes_version: "v1.37.2".into(),
            etcd: EtcdFacts {
                revision: 123456,
                member: "10.0.0.2".into(),
                db_size: 4096 * 5,
                sha256: "ab".repeat(32),
            },
            parts: [Part::EtcdSnapshot, Part::Bundle, Part::Objects]
                .into_iter()
                .map(|p| PartRecord {
                    name: p,
                    key: layout.key("prod", &name, p),
                    size: 10,
                    sha256: "cd".repeat(32),
                })
                .collect(),
            bundle_fingerprint: "ef".repeat(32),
        }
    }

    /// Covers: R20.4
    #[test]
    fn the_manifest_is_camel_case_json_with_rfc3339_utc_times() {
        let m = sample();
        let v: serde_json::Value = serde_json::from_slice(&m.to_json()).unwrap();
        assert_eq!(v["format"], 1);
        assert_eq!(v["backup"], "prod-20261202010000");
        assert_eq!(v["reason"], "schedule");
        assert_eq!(v["started"], "2026-12-02T01:00:00Z");
        assert_eq!(v["finished"], "2026-12-02T01:00:42Z");
        assert_eq!(v["talosVersion"], "v1.13.9");
        assert_eq!(v["kubernetesVersion"], "v1.37.2");
        assert_eq!(v["etcd"]["dbSize"], 20480);
        assert_eq!(v["parts"][0]["name"], "etcd.snapshot");
        assert_eq!(
            v["parts"][0]["key"],
            "backups/prod/prod-20261202010000/etcd.snapshot.age"
        );
        assert_eq!(v["bundleFingerprint"], "ef".repeat(32));
        assert_eq!(Manifest::from_json(&m.to_json()).unwrap(), m);
        assert_eq!(
            m.part(Part::Bundle).map(|p| p.key.as_str()),
            Some("backups/prod/prod-20261202010000/bundle.yaml.age")
        );
    }

    /// Covers: R20.4
    #[test]
    fn a_manifest_of_another_format_is_refused_for_its_format() {
        let e = Manifest::from_json(br#"{"format": 2, "whatever": true}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the backup manifest has format 2; this Ichor reads format 1"
        );
        assert!(matches!(
            Manifest::from_json(b"{}").unwrap_err(),
            ManifestError::Json(_)
        ));
    }

    /// Covers: R20.4
    #[test]
    fn keys_outside_the_layout_are_named() {
        let l = Layout::new("b");
        assert!(matches!(
            l.parse_key("c/prod/prod-20261202010000/manifest.json.age"),
            Err(KeyError::OutsidePrefix { .. })
        ));
        assert!(matches!(
            l.parse_key("b/prod/manifest.json.age"),
            Err(KeyError::Shape { .. })
        ));
        assert!(matches!(
            l.parse_key("b/prod/prod-20261202010000/notes.txt"),
            Err(KeyError::UnknownPart { .. })
        ));
        assert!(matches!(
            l.parse_key("b/prod/staging-20261202010000/bundle.yaml.age"),
            Err(KeyError::Name { .. })
        ));
        assert!(matches!(
            l.parse_key("b/prod/prod-2026120201000x/bundle.yaml.age"),
            Err(KeyError::Name { .. })
        ));
    }

    /// Covers: R20.4
    #[test]
    fn complete_means_the_manifest_exists() {
        let l = Layout::new("");
        let t = |h| Utc.with_ymd_and_hms(2026, 12, 1, h, 0, 0).unwrap();
        let a = backup_name("prod", t(1), None);
        let b = backup_name("prod", t(2), None);
        let c = backup_name("prod", t(3), Some("manual"));
        let mut keys = vec![];
        for p in Part::ALL {
            keys.push(l.key("prod", &a, p));
            keys.push(l.key("prod-2", &backup_name("prod-2", t(9), None), p));
        }
        // b was cut after its snapshot; c has everything but the manifest
        keys.push(l.key("prod", &b, Part::EtcdSnapshot));
        for p in [Part::EtcdSnapshot, Part::Bundle, Part::Objects] {
            keys.push(l.key("prod", &c, p));
        }
        keys.push("prod/README".into());
        let listed = backups_of(&l, "prod", keys.iter().map(String::as_str));
        let names: Vec<_> = listed.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, [a.as_str(), b.as_str(), c.as_str()]);
        let complete: Vec<_> = listed.iter().map(Listed::is_complete).collect();
        assert_eq!(complete, [true, false, false]);
        assert_eq!(newest_complete(&listed).map(|b| &b.name), Some(&a));
    }

    fn cluster_name() -> impl Strategy<Value = String> {
        "[a-z]([a-z0-9-]{0,20}[a-z0-9])?"
    }

    proptest! {
        /// Covers: R20.4
        #[test]
        fn keys_roundtrip(
            prefix in "(/?[a-z0-9]{1,8}){0,3}/?",
            cluster in cluster_name(),
            secs in 0i64..4_000_000_000,
            suffix in prop::option::of("[a-z]{1,10}"),
            part in prop::sample::select(Part::ALL.to_vec()),
        ) {
            let l = Layout::new(&prefix);
            let t = Utc.timestamp_opt(secs, 0).unwrap();
            let name = backup_name(&cluster, t, suffix.as_deref());
            prop_assert_eq!(backup_time(&cluster, &name), Some(t));
            let key = l.key(&cluster, &name, part);
            prop_assert!(!key.starts_with('/') && !key.contains("//"), "{}", key);
            prop_assert!(key.starts_with(&l.backup_folder(&cluster, &name)));
            prop_assert!(key.starts_with(&l.cluster_folder(&cluster)));
            let k = l.parse_key(&key).unwrap();
            prop_assert_eq!(k, ObjectKey { cluster, backup: name, part });
        }

        /// Covers: R20.4
        #[test]
        fn names_sort_by_time(cluster in cluster_name(), a in 0i64..4_000_000_000, b in 0i64..4_000_000_000) {
            let ta = Utc.timestamp_opt(a, 0).unwrap();
            let tb = Utc.timestamp_opt(b, 0).unwrap();
            let (na, nb) = (backup_name(&cluster, ta, None), backup_name(&cluster, tb, None));
            prop_assert_eq!(na.cmp(&nb), ta.cmp(&tb));
        }

        /// Covers: R20.4
        #[test]
        fn manifests_roundtrip(rev: u64, size: u64, secs in 0i64..4_000_000_000, reason in prop::sample::select(vec![Reason::Schedule, Reason::Operation, Reason::Manual])) {
            let mut m = sample();
            m.etcd.revision = rev;
            m.etcd.db_size = size;
            m.reason = reason;
            m.started = Utc.timestamp_opt(secs, 0).unwrap();
            prop_assert_eq!(Manifest::from_json(&m.to_json()).unwrap(), m);
        }
    }
}
