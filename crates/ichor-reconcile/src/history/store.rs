//! The history Secret's data: each revision's full inputs and rendered
//! config, one gzip-compressed JSON entry per revision, bounded in count and
//! in size. It holds secrets (the rendered config carries the cluster's
//! keys), so it lives in a Secret that only the controller reads, owned by
//! the machine. One entry per revision means an apply compresses only its
//! own record.

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use ichor_api::history::MachineRevision;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// The largest total kept: under a Secret's 1 MiB even as the API server
/// receives it (JSON, the data in base64: 4 bytes for 3), with room for the
/// keys and the object's metadata.
pub const MAX_BYTES: usize = 760 * 1024;

/// A decompressed record larger than this is refused (a crafted entry must
/// not inflate without end).
const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;

/// The type of every history Secret.
pub const SECRET_TYPE: &str = "ichor.maesh.dev/history";

const KEY_PREFIX: &str = "revision-";
const KEY_SUFFIX: &str = ".json.gz";

/// The inputs and output of one revision, enough to write it back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    pub revision: MachineRevision,
    /// The TalosMachine's spec the config was rendered from.
    pub machine_spec: Value,
    /// The TalosCluster's spec the config was rendered from.
    pub cluster_spec: Value,
    /// The rendered config applied (multi-document YAML).
    pub rendered_config: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the history entry {key} does not decompress")]
    Decompress {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the history entry {key} is not a revision record")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "revision {number}'s record alone takes {bytes} bytes compressed, over the {limit}-byte limit of a history Secret"
    )]
    TooLarge {
        number: u64,
        bytes: usize,
        limit: usize,
    },
}

/// The history Secret of the machine `namespace/name`, in Ichor's own
/// namespace: `ichor-history.<namespace>.<name>`, or, past the 253
/// characters a Secret's name may have, its start and a digest of the whole.
pub fn secret_name(namespace: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let full = format!("ichor-history.{namespace}.{name}");
    if full.len() <= 253 {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let head = full[..200].trim_end_matches(['.', '-']);
    format!("{head}.{:x}", digest)[..253.min(head.len() + 65)].to_owned()
}

/// The Secret data key of a revision's record (zero-padded, so keys sort
/// as numbers do).
pub fn key(number: u64) -> String {
    format!("{KEY_PREFIX}{number:010}{KEY_SUFFIX}")
}

fn number_of(key: &str) -> Option<u64> {
    key.strip_prefix(KEY_PREFIX)?
        .strip_suffix(KEY_SUFFIX)?
        .parse()
        .ok()
}

/// The revision numbers a Secret's data holds, oldest first.
pub fn numbers(data: &BTreeMap<String, Vec<u8>>) -> Vec<u64> {
    data.keys().filter_map(|k| number_of(k)).collect()
}

fn encode(record: &RevisionRecord) -> Vec<u8> {
    let json = serde_json::to_vec(record).expect("a revision record serialises");
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&json).expect("writing to a Vec cannot fail");
    gz.finish().expect("writing to a Vec cannot fail")
}

fn decode(key: &str, bytes: &[u8]) -> Result<RevisionRecord, StoreError> {
    let mut json = Vec::new();
    GzDecoder::new(bytes)
        .take(MAX_RECORD_BYTES)
        .read_to_end(&mut json)
        .map_err(|source| StoreError::Decompress {
            key: key.to_owned(),
            source,
        })?;
    serde_json::from_slice(&json).map_err(|source| StoreError::Decode {
        key: key.to_owned(),
        source,
    })
}

/// Adds a record to a Secret's data, keeping at most `kept` records (the
/// newest) and at most `max_bytes` in all, dropping the oldest first. A record
/// too large on its own is refused and the data left as it was.
pub fn append(
    data: &mut BTreeMap<String, Vec<u8>>,
    record: &RevisionRecord,
    kept: usize,
    max_bytes: usize,
) -> Result<(), StoreError> {
    let number = record.revision.number;
    let entry = encode(record);
    if entry.len() > max_bytes {
        return Err(StoreError::TooLarge {
            number,
            bytes: entry.len(),
            limit: max_bytes,
        });
    }
    data.insert(key(number), entry);
    let mut ours = numbers(data);
    while ours.len() > kept.max(1) {
        data.remove(&key(ours.remove(0)));
    }
    while data.values().map(Vec::len).sum::<usize>() > max_bytes && ours.len() > 1 {
        data.remove(&key(ours.remove(0)));
    }
    Ok(())
}

/// Where a history Secret lives and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretOf<'a> {
    /// Ichor's namespace, where every history Secret lives.
    pub system_namespace: &'a str,
    pub machine_namespace: &'a str,
    pub machine_name: &'a str,
    pub machine_uid: &'a str,
    /// The resourceVersion read, when the Secret exists: it is replaced
    /// whole with it, so a concurrent writer's change is a conflict.
    pub resource_version: Option<String>,
}

/// The history Secret holding `data`. Owned by the machine when both live
/// in Ichor's namespace (an owner in another namespace would make the
/// garbage collector delete the Secret at once); otherwise the machine's
/// [`HISTORY_FINALIZER`] stands for the owner reference.
///
/// [`HISTORY_FINALIZER`]: ichor_api::history::HISTORY_FINALIZER
pub fn secret(of: &SecretOf<'_>, data: BTreeMap<String, Vec<u8>>) -> Secret {
    let owner = (of.machine_namespace == of.system_namespace).then(|| OwnerReference {
        api_version: format!("{}/v1alpha1", ichor_api::GROUP),
        kind: "TalosMachine".into(),
        name: of.machine_name.into(),
        uid: of.machine_uid.into(),
        ..OwnerReference::default()
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(of.machine_namespace, of.machine_name)),
            namespace: Some(of.system_namespace.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/part-of".into(), "ichor".into()),
                ("app.kubernetes.io/component".into(), "history".into()),
            ])),
            annotations: Some(BTreeMap::from([(
                ichor_api::history::HISTORY_OF_ANNOTATION.into(),
                format!("{}/{}", of.machine_namespace, of.machine_name),
            )])),
            owner_references: owner.map(|o| vec![o]),
            resource_version: of.resource_version.clone(),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Secret::default()
    }
}

/// The record of one revision, if the data still holds it.
pub fn find(
    data: &BTreeMap<String, Vec<u8>>,
    number: u64,
) -> Result<Option<RevisionRecord>, StoreError> {
    let key = key(number);
    data.get(&key).map(|bytes| decode(&key, bytes)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::record::{self, Apply, DEFAULT_KEPT};
    use ichor_api::history::{RevisionApplyMode, RevisionReason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use serde_json::json;
    use sha2::{Digest, Sha256};

    /// A rendered config of realistic size (about 16 KiB) whose bytes vary
    /// from apply to apply as key material does, so compression cannot hide
    /// growth: 200 values from a digest chain seeded by `i`.
    fn config(i: u64) -> String {
        let mut text = String::from("version: v1alpha1\nmachine:\n  type: worker\n  sysctls:\n");
        let mut digest = Sha256::digest(i.to_be_bytes());
        for k in 0..200u64 {
            text.push_str(&format!("    key{k}: \"{digest:x}\"\n"));
            digest = Sha256::digest(digest);
        }
        text
    }

    fn revision(history: &[MachineRevision]) -> MachineRevision {
        record::next(
            history,
            Apply {
                time: Time(k8s_openapi::jiff::Timestamp::now()),
                config_hash_before: None,
                config_hash_after: "sha256:00".into(),
                apply_mode: RevisionApplyMode::NoReboot,
                reason: RevisionReason::Drift,
                operation: None,
                rollback_of: None,
                machine_generation: Some(1),
                cluster_generation: Some(1),
                machine_changed_by: None,
                cluster_changed_by: None,
            },
            Vec::new(),
        )
    }

    fn record(revision: MachineRevision, i: u64) -> RevisionRecord {
        RevisionRecord {
            revision,
            machine_spec: json!({"patches": [{"inline": format!("i: {i}")}]}),
            cluster_spec: json!({"talosVersion": "v1.13.9"}),
            rendered_config: config(i),
        }
    }

    /// Covers: R16.5
    #[test]
    fn a_thousand_applies_keep_n_records_under_a_mebibyte() {
        let mut data = BTreeMap::new();
        let mut history = Vec::new();
        for i in 0..1000 {
            let r = revision(&history);
            record::push(&mut history, r.clone(), DEFAULT_KEPT);
            append(&mut data, &record(r, i), DEFAULT_KEPT, MAX_BYTES).unwrap();
        }
        let total: usize = data.values().map(Vec::len).sum();
        assert!(total < 1024 * 1024, "{total} bytes");
        assert_eq!(numbers(&data), (991..=1000).collect::<Vec<_>>());
        assert_eq!(
            find(&data, 995).unwrap().unwrap().rendered_config,
            config(994)
        );
        assert!(find(&data, 990).unwrap().is_none());
    }

    /// A control plane's config as Talos generates one (the v1.14
    /// stability fixture), every key and certificate in it replaced by
    /// bytes that differ at each apply (keys rotated at every apply: the
    /// worst case for compression), with a node label naming the apply.
    fn fixture_config(i: u64) -> String {
        const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let text = crate::history::CONTROL_PLANE_FIXTURE;
        let mut digest = Sha256::digest(i.to_be_bytes());
        let mut random = std::iter::from_fn(move || {
            digest = Sha256::digest(digest);
            Some(digest.to_vec())
        })
        .flatten()
        .map(|b| BASE64[usize::from(b) % 64] as char);
        let mut out = String::with_capacity(text.len() + 64);
        for line in text.lines() {
            let indent = &line[..line.len() - line.trim_start().len()];
            let (head, value) = match line.trim_start().split_once(": ") {
                Some((key, value)) => (format!("{indent}{key}: "), value),
                None => (indent.to_owned(), line.trim_start()),
            };
            let material =
                value.len() >= 40 && value.bytes().all(|b| BASE64.contains(&b) || b == b'=');
            out.push_str(&head);
            if material {
                out.extend(random.by_ref().take(value.len()));
            } else {
                out.push_str(value);
            }
            out.push('\n');
        }
        out.replace(
            "kind: HostnameConfig",
            &format!("kind: HostnameConfig\n# apply {i}"),
        )
    }

    /// 1,000 applies of a real control plane's config (keys that never
    /// repeat) on one machine: the history Secret, as the controller writes
    /// it and as the API server receives it (JSON, its data in base64), keeps
    /// the newest N records and stays under 1 MiB.
    /// Covers: R16.5
    #[test]
    fn a_thousand_real_configs_keep_an_encoded_secret_under_a_mebibyte() {
        assert_ne!(fixture_config(1), fixture_config(2));
        let mut data = BTreeMap::new();
        let mut history = Vec::new();
        for i in 0..1000 {
            let r = revision(&history);
            record::push(&mut history, r.clone(), DEFAULT_KEPT);
            let mut rec = record(r, i);
            rec.rendered_config = fixture_config(i);
            rec.machine_spec = json!({
                "clusterRef": {"name": "lab"}, "role": "controlplane", "address": "10.5.0.2",
                "hold": false, "patches": [{"inline": format!("machine:\n  nodeLabels:\n    apply: \"{i}\"\n")}],
            });
            append(&mut data, &rec, DEFAULT_KEPT, MAX_BYTES).unwrap();
        }
        assert_eq!(numbers(&data), (991..=1000).collect::<Vec<_>>());
        let raw: usize = data.values().map(Vec::len).sum();
        let secret = secret(
            &SecretOf {
                system_namespace: "ichor-system",
                machine_namespace: "team-a",
                machine_name: "lab-cp-1",
                machine_uid: "0b0e9c4e-5d43-4f5e-9a53-3f1f1c6f3c11",
                resource_version: Some("123456".into()),
            },
            data,
        );
        let encoded = serde_json::to_vec(&secret).unwrap().len();
        assert!(encoded < 1024 * 1024, "{encoded} bytes encoded");
        assert!(raw * 4 / 3 <= encoded, "{raw} raw, {encoded} encoded");
        assert!(secret.metadata.owner_references.is_none());
    }

    /// Records so large that the byte bound, not the count, decides what
    /// is kept: the Secret as sent still stays under 1 MiB.
    /// Covers: R16.5
    #[test]
    fn the_byte_bound_keeps_the_encoded_secret_under_a_mebibyte() {
        let mut data = BTreeMap::new();
        let mut history = Vec::new();
        for i in 0..40 {
            let r = revision(&history);
            record::push(&mut history, r.clone(), DEFAULT_KEPT);
            let mut rec = record(r, i);
            // About 130 KiB compressed each: keys that never repeat.
            rec.rendered_config = (0..30).map(|k| fixture_config(i * 100 + k)).collect();
            append(&mut data, &rec, DEFAULT_KEPT, MAX_BYTES).unwrap();
        }
        let kept = numbers(&data);
        assert!(
            kept.len() < DEFAULT_KEPT && kept.last() == Some(&40),
            "{kept:?}"
        );
        let of = SecretOf {
            system_namespace: "ichor-system",
            machine_namespace: "ichor-system",
            machine_name: &"m".repeat(200),
            machine_uid: "0b0e9c4e-5d43-4f5e-9a53-3f1f1c6f3c11",
            resource_version: Some("123456789".into()),
        };
        let encoded = serde_json::to_vec(&secret(&of, data)).unwrap().len();
        assert!(encoded < 1024 * 1024, "{encoded} bytes encoded");
    }

    /// A machine in Ichor's namespace owns its history Secret; one
    /// elsewhere cannot (its finalizer stands for it).
    /// Covers: R16.5
    #[test]
    fn a_history_secret_is_owned_by_its_machine_in_ichors_namespace_only() {
        let of = |ns| SecretOf {
            system_namespace: "ichor-system",
            machine_namespace: ns,
            machine_name: "cp-1",
            machine_uid: "uid-1",
            resource_version: None,
        };
        let own = secret(&of("ichor-system"), BTreeMap::new());
        let owner = &own.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("TalosMachine", "uid-1")
        );
        assert_eq!(own.metadata.namespace.as_deref(), Some("ichor-system"));
        let other = secret(&of("team-a"), BTreeMap::new());
        assert!(other.metadata.owner_references.is_none());
        assert_eq!(
            other.metadata.annotations.unwrap()[ichor_api::history::HISTORY_OF_ANNOTATION],
            "team-a/cp-1"
        );
        assert_eq!(other.type_.as_deref(), Some(SECRET_TYPE));
    }

    #[test]
    fn the_size_bound_drops_the_oldest_and_refuses_a_record_alone_too_large() {
        let mut data = BTreeMap::new();
        let mut history = Vec::new();
        for i in 0..5 {
            let r = revision(&history);
            record::push(&mut history, r.clone(), 10);
            append(&mut data, &record(r, i), 10, 24 * 1024).unwrap();
        }
        let kept = numbers(&data);
        assert!(kept.len() < 5 && *kept.last().unwrap() == 5, "{kept:?}");
        let before = data.clone();
        let mut big = record(revision(&history), 9);
        big.rendered_config = (10..20).map(config).collect();
        let err = append(&mut data, &big, 10, 24 * 1024).unwrap_err();
        assert!(
            matches!(err, StoreError::TooLarge { number: 6, .. }),
            "{err}"
        );
        assert_eq!(data, before);
    }

    #[test]
    fn secret_names_are_valid_and_distinct() {
        assert_eq!(
            secret_name("ichor-system", "cp-1"),
            "ichor-history.ichor-system.cp-1"
        );
        let long_a = "a".repeat(253);
        let mut long_b = long_a.clone();
        long_b.replace_range(252.., "b");
        let (a, b) = (secret_name("ns", &long_a), secret_name("ns", &long_b));
        assert!(a.len() <= 253 && b.len() <= 253, "{} {}", a.len(), b.len());
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        );
    }

    #[test]
    fn a_crafted_entry_fails_as_an_error() {
        let mut data = BTreeMap::from([(key(1), b"not gzip".to_vec())]);
        assert!(matches!(find(&data, 1), Err(StoreError::Decompress { .. })));
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(b"{\"not\": \"a record\"}").unwrap();
        data.insert(key(2), gz.finish().unwrap());
        assert!(matches!(find(&data, 2), Err(StoreError::Decode { .. })));
    }
}
