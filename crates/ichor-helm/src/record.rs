//! The release record: Helm's release JSON, its encoding into a storage Secret
//! (`sh.helm.release.v1.NAME.vN`, labels, `base64(gzip(json))`) and back.
//!
//! Pure code, no I/O. Fields Ichor reads or writes are typed; everything else
//! (the stored chart, hooks, fields added by later Helm versions) is kept
//! verbatim so that rewriting a record Helm wrote loses nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read as _, Write as _};
use std::sync::OnceLock;

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Prefix of every record Secret's name, and Helm's storage type version.
pub const STORAGE_PREFIX: &str = "sh.helm.release.v1";
/// The Secret `type` of a record.
pub const SECRET_TYPE: &str = "helm.sh/release.v1";
/// The one key of a record Secret's `data`.
pub const DATA_KEY: &str = "release";
/// `apply_method` value for server-side apply.
pub const APPLY_METHOD_SSA: &str = "ssa";

/// Labels Helm reserves on a record Secret.
pub const SYSTEM_LABELS: [&str; 6] = [
    "name",
    "owner",
    "status",
    "version",
    "createdAt",
    "modifiedAt",
];

const GZIP_MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];

/// The API server refuses a Secret whose data exceeds 1 MiB; a record's
/// `data.release` (the base64 text) must stay under it.
pub const MAX_RECORD_BYTES: usize = 1 << 20;
/// The most a record's release JSON may expand to when it is gunzipped.
/// A record fits in a Secret (1 MiB), and a release compresses a few times,
/// not a thousand: 64 MiB leaves room for any real chart while a gzip bomb
/// (about 1 GiB from 1 MiB) stops here instead of exhausting memory.
pub const MAX_DECOMPRESSED_BYTES: u64 = 64 << 20;

/// A release's status, as Helm spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    #[default]
    Unknown,
    Deployed,
    Uninstalled,
    Superseded,
    Failed,
    Uninstalling,
    PendingInstall,
    PendingUpgrade,
    PendingRollback,
}

impl Status {
    pub const ALL: [Status; 9] = [
        Status::Unknown,
        Status::Deployed,
        Status::Uninstalled,
        Status::Superseded,
        Status::Failed,
        Status::Uninstalling,
        Status::PendingInstall,
        Status::PendingUpgrade,
        Status::PendingRollback,
    ];

    /// Helm's spelling (`pending-install`, ...), also the `status` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Deployed => "deployed",
            Status::Uninstalled => "uninstalled",
            Status::Superseded => "superseded",
            Status::Failed => "failed",
            Status::Uninstalling => "uninstalling",
            Status::PendingInstall => "pending-install",
            Status::PendingUpgrade => "pending-upgrade",
            Status::PendingRollback => "pending-rollback",
        }
    }

    /// True for the three `pending-*` values: an operation holds the release.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            Status::PendingInstall | Status::PendingUpgrade | Status::PendingRollback
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `info` of a release.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Info {
    #[serde(default, with = "helm_time", skip_serializing_if = "Option::is_none")]
    pub first_deployed: Option<DateTime<Utc>>,
    #[serde(default, with = "helm_time", skip_serializing_if = "Option::is_none")]
    pub last_deployed: Option<DateTime<Utc>>,
    #[serde(default, with = "helm_time", skip_serializing_if = "Option::is_none")]
    pub deleted: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub status: Status,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
    /// Fields this crate does not interpret, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One revision of a release: the JSON stored in a record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Release {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<Info>,
    /// The whole chart as Helm stores it (metadata, templates, values, files...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<StoredChart>,
    /// The values the user supplied (not merged with the chart's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Map<String, Value>>,
    /// The rendered manifest, hooks excluded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifest: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Value>,
    /// The revision.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
    /// The release namespace (where the objects go), not the storage namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `ssa` or `csa` (Helm v4); absent means client-side apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_method: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Release {
    /// The status, `unknown` when the record has no `info`.
    pub fn status(&self) -> Status {
        self.info.as_ref().map(|i| i.status).unwrap_or_default()
    }

    /// Sets the status and description, creating `info` if needed.
    pub fn set_status(&mut self, status: Status, description: impl Into<String>) {
        let info = self.info.get_or_insert_with(Info::default);
        info.status = status;
        info.description = description.into();
    }

    /// `chart.metadata.version`, when the record holds a chart.
    pub fn chart_version(&self) -> Option<&str> {
        self.chart.as_ref()?.metadata().version.as_deref()
    }

    /// `chart.metadata.name`, when the record holds a chart.
    pub fn chart_name(&self) -> Option<&str> {
        self.chart.as_ref()?.metadata().name.as_deref()
    }

    /// `chart.metadata.appVersion`.
    pub fn app_version(&self) -> Option<&str> {
        self.chart.as_ref()?.metadata().app_version.as_deref()
    }

    /// The name of this revision's Secret.
    pub fn secret_name(&self) -> String {
        secret_name(&self.name, self.version)
    }
}

/// The chart a record holds, kept as its JSON text. A record is mostly its
/// chart (templates, values, files), and what reads records — a history, the
/// deployed revision — needs the chart's metadata at most: the text is
/// checked and copied when a record is decoded, written back as it was, and
/// parsed only when asked ([`StoredChart::value`]; the metadata once, on the
/// first [`Release::chart_name`] or the like).
#[derive(Debug, Clone)]
pub struct StoredChart {
    json: Box<RawValue>,
    metadata: OnceLock<ChartMetadata>,
}

/// The fields of `chart.metadata` Ichor reads.
#[derive(Debug, Clone, Default, Deserialize)]
struct ChartMetadata {
    #[serde(default, deserialize_with = "string_or_none")]
    name: Option<String>,
    #[serde(default, deserialize_with = "string_or_none")]
    version: Option<String>,
    #[serde(default, rename = "appVersion", deserialize_with = "string_or_none")]
    app_version: Option<String>,
}

/// A string, or `None` for any other JSON value (a chart is Helm's to
/// shape: an odd metadata field must not make its record unreadable).
fn string_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

impl StoredChart {
    /// The chart as a JSON value, written compactly.
    pub fn from_value(chart: &Value) -> Result<Self, serde_json::Error> {
        Ok(Self {
            json: RawValue::from_string(serde_json::to_string(chart)?)?,
            metadata: OnceLock::new(),
        })
    }

    /// The chart's JSON text, as stored.
    pub fn json(&self) -> &str {
        self.json.get()
    }

    /// The whole chart, parsed.
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.json.get())
    }

    fn metadata(&self) -> &ChartMetadata {
        self.metadata.get_or_init(|| {
            #[derive(Deserialize)]
            struct Head {
                #[serde(default)]
                metadata: Option<Value>,
            }
            serde_json::from_str::<Head>(self.json.get())
                .ok()
                .and_then(|h| h.metadata)
                .and_then(|m| serde_json::from_value(m).ok())
                .unwrap_or_default()
        })
    }
}

/// Equal when the texts are, or else when they parse to equal values.
impl PartialEq for StoredChart {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
            || matches!((self.value(), other.value()), (Ok(a), Ok(b)) if a == b)
    }
}

impl Serialize for StoredChart {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl<'de> Deserialize<'de> for StoredChart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `null` is no chart: `Option<StoredChart>` reads it as `None`
        // before this is called, as it did for a parsed chart.
        Ok(Self {
            json: Box::<RawValue>::deserialize(d)?,
            metadata: OnceLock::new(),
        })
    }
}

/// `sh.helm.release.v1.<name>.v<revision>`.
pub fn secret_name(release: &str, revision: u32) -> String {
    format!("{STORAGE_PREFIX}.{release}.v{revision}")
}

/// What went wrong reading or writing a record.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error(
        "Helm release {release} revision {revision} is {bytes} bytes encoded, over the {limit}-byte limit of a Secret; the chart (stored whole in the record) is too large: remove large files from it"
    )]
    TooLarge {
        release: String,
        revision: u32,
        bytes: usize,
        limit: usize,
    },
    #[error("encoding Helm release {release} revision {revision} as JSON")]
    EncodeJson {
        release: String,
        revision: u32,
        source: serde_json::Error,
    },
    #[error("compressing Helm release {release} revision {revision}")]
    Compress {
        release: String,
        revision: u32,
        source: std::io::Error,
    },
    #[error(
        "record {secret} has no data.release key; it is not a Helm release record (delete it or fix its data)"
    )]
    MissingData { secret: String },
    #[error(
        "record {secret}: data.release is not valid base64; the record is corrupt, delete it or restore it"
    )]
    Base64 {
        secret: String,
        source: base64::DecodeError,
    },
    #[error(
        "record {secret}: data.release is not valid gzip; the record is corrupt, delete it or restore it"
    )]
    Gunzip {
        secret: String,
        source: std::io::Error,
    },
    #[error(
        "record {secret}: data.release expands past {limit} bytes when gunzipped, more than any real release; the record is corrupt or hostile, delete it"
    )]
    TooLargeDecompressed { secret: String, limit: u64 },
    #[error(
        "record {secret}: the release JSON does not parse; the record is corrupt, delete it or restore it"
    )]
    DecodeJson {
        secret: String,
        source: serde_json::Error,
    },
}

/// `base64(gzip(json(release)))`, as Helm stores it in `data.release`.
pub fn encode_release(release: &Release) -> Result<String, CodecError> {
    let json = serde_json::to_vec(release).map_err(|source| CodecError::EncodeJson {
        release: release.name.clone(),
        revision: release.version,
        source,
    })?;
    let compress = |source| CodecError::Compress {
        release: release.name.clone(),
        revision: release.version,
        source,
    };
    let mut gz = GzEncoder::new(Vec::with_capacity(json.len() / 4), Compression::best());
    gz.write_all(&json).map_err(compress)?;
    let bytes = gz.finish().map_err(compress)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The inverse of [`encode_release`]; also reads uncompressed records (plain
/// JSON under the base64), as Helm does. `secret` names the record in errors.
pub fn decode_release(data: &[u8], secret: &str) -> Result<Release, CodecError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(trim_ascii(data))
        .map_err(|source| CodecError::Base64 {
            secret: secret.to_string(),
            source,
        })?;
    let json = if raw.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        // One byte past the bound tells "at the bound" from "over it".
        GzDecoder::new(raw.as_slice())
            .take(MAX_DECOMPRESSED_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|source| CodecError::Gunzip {
                secret: secret.to_string(),
                source,
            })?;
        if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
            return Err(CodecError::TooLargeDecompressed {
                secret: secret.to_string(),
                limit: MAX_DECOMPRESSED_BYTES,
            });
        }
        out
    } else {
        raw
    };
    serde_json::from_slice(&json).map_err(|source| CodecError::DecodeJson {
        secret: secret.to_string(),
        source,
    })
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// Whether the Secret is being created or updated: Helm stamps `createdAt` on
/// create and `modifiedAt` on update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Create,
    Update,
}

/// The record Secret for `release` in `storage_namespace`. `custom_labels`
/// are added unless they collide with Helm's system labels (those win).
pub fn to_secret(
    release: &Release,
    storage_namespace: &str,
    custom_labels: &BTreeMap<String, String>,
    write: Write,
    now: DateTime<Utc>,
) -> Result<Secret, CodecError> {
    let data = encode_release(release)?;
    if data.len() > MAX_RECORD_BYTES {
        return Err(CodecError::TooLarge {
            release: release.name.clone(),
            revision: release.version,
            bytes: data.len(),
            limit: MAX_RECORD_BYTES,
        });
    }
    let mut labels: BTreeMap<String, String> = custom_labels
        .iter()
        .filter(|(k, _)| !SYSTEM_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert("name".into(), release.name.clone());
    labels.insert("owner".into(), "helm".into());
    labels.insert("status".into(), release.status().as_str().into());
    labels.insert("version".into(), release.version.to_string());
    let stamp = now.timestamp().to_string();
    match write {
        Write::Create => labels.insert("createdAt".into(), stamp),
        Write::Update => labels.insert("modifiedAt".into(), stamp),
    };
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(release.secret_name()),
            namespace: Some(storage_namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(BTreeMap::from([(
            DATA_KEY.to_string(),
            ByteString(data.into_bytes()),
        )])),
        ..Secret::default()
    })
}

/// Decodes the release a record Secret holds.
pub fn from_secret(secret: &Secret) -> Result<Release, CodecError> {
    // Errors name the record as namespace/name: records of one release
    // live in several namespaces (Ichor's, Helm's default).
    let name = match (&secret.metadata.namespace, &secret.metadata.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (_, n) => n.clone().unwrap_or_default(),
    };
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| CodecError::MissingData {
            secret: name.clone(),
        })?;
    decode_release(&data.0, &name)
}

/// Custom (non-system) labels of a record Secret.
pub fn custom_labels(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !SYSTEM_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Helm's time fields: RFC 3339 with nanoseconds; the zero time is written
/// by Helm v3 as `""` and omitted by v4. Both read as `None`; `None` is
/// omitted on write (the form both versions read).
mod helm_time {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        match s.as_deref() {
            None | Some("") | Some("0001-01-01T00:00:00Z") => Ok(None),
            Some(s) => DateTime::parse_from_rfc3339(s)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn sample() -> Release {
        let t = DateTime::parse_from_rfc3339("2026-11-29T23:01:02.123456789+01:00")
            .unwrap()
            .with_timezone(&Utc);
        Release {
            name: "cilium".into(),
            info: Some(Info {
                first_deployed: Some(t),
                last_deployed: Some(t),
                deleted: None,
                description: "Install complete".into(),
                status: Status::Deployed,
                notes: "hello".into(),
                extra: Map::new(),
            }),
            chart: Some(
                StoredChart::from_value(
                    &serde_json::json!({"metadata": {"name": "cilium", "version": "1.18.0"}, "values": {}}),
                )
                .unwrap(),
            ),
            config: Some(serde_json::json!({"a": 1}).as_object().unwrap().clone()),
            manifest: "---\n# Source: x\nkind: ConfigMap\n".into(),
            hooks: vec![],
            version: 3,
            namespace: "kube-system".into(),
            apply_method: Some("ssa".into()),
            extra: Map::new(),
        }
    }

    #[test]
    fn secret_has_helms_name_type_and_labels() {
        let rel = sample();
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let s = to_secret(&rel, "ichor-system", &BTreeMap::new(), Write::Create, now).unwrap();
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("sh.helm.release.v1.cilium.v3")
        );
        assert_eq!(s.metadata.namespace.as_deref(), Some("ichor-system"));
        assert_eq!(s.type_.as_deref(), Some("helm.sh/release.v1"));
        let labels = s.metadata.labels.clone().unwrap();
        assert_eq!(labels["name"], "cilium");
        assert_eq!(labels["owner"], "helm");
        assert_eq!(labels["status"], "deployed");
        assert_eq!(labels["version"], "3");
        assert_eq!(labels["createdAt"], "1800000000");
        assert!(!labels.contains_key("modifiedAt"));
        // data.release holds base64 text of gzip bytes (kube base64s it again on the wire).
        let data = &s.data.as_ref().unwrap()["release"].0;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        assert_eq!(&raw[..3], &GZIP_MAGIC);
        assert_eq!(from_secret(&s).unwrap(), rel);
    }

    #[test]
    fn times_are_rfc3339_nano_and_zero_times_are_omitted() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(
            json["info"]["first_deployed"],
            "2026-11-29T22:01:02.123456789Z"
        );
        assert!(json["info"].get("deleted").is_none());
        assert_eq!(json["apply_method"], "ssa");
        assert_eq!(json["namespace"], "kube-system");
    }

    #[test]
    fn reads_helm_v3_empty_times_and_unknown_fields() {
        let v3 = r#"{"name":"x","info":{"first_deployed":"2026-01-02T03:04:05.5+09:00","last_deployed":"","deleted":"","status":"pending-install","resources":{"a":1}},"version":1,"namespace":"ns","schemamodtime":"z"}"#;
        let r: Release = serde_json::from_str(v3).unwrap();
        let info = r.info.as_ref().unwrap();
        assert_eq!(info.status, Status::PendingInstall);
        assert!(info.last_deployed.is_none() && info.deleted.is_none());
        assert_eq!(
            info.first_deployed.unwrap().to_rfc3339(),
            "2026-01-01T18:04:05.500+00:00"
        );
        assert_eq!(info.extra["resources"]["a"], 1);
        assert_eq!(r.extra["schemamodtime"], "z");
        let back: Value = serde_json::to_value(&r).unwrap();
        assert_eq!(back["schemamodtime"], "z");
        assert_eq!(back["info"]["resources"]["a"], 1);
    }

    #[test]
    fn reads_uncompressed_records() {
        let json = serde_json::to_vec(&sample()).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(json);
        assert_eq!(decode_release(b64.as_bytes(), "s").unwrap(), sample());
    }

    #[test]
    fn corrupt_records_name_the_secret() {
        let e = decode_release(b"!!!", "sh.helm.release.v1.x.v1").unwrap_err();
        assert!(e.to_string().contains("sh.helm.release.v1.x.v1"), "{e}");
        let b = base64::engine::general_purpose::STANDARD.encode([0x1f, 0x8b, 0x08, 0, 1]);
        let e = decode_release(b.as_bytes(), "s1").unwrap_err();
        assert!(matches!(e, CodecError::Gunzip { .. }), "{e}");
    }

    #[test]
    fn records_over_a_secrets_limit_are_refused_with_the_reason() {
        let mut rel = sample();
        let mut seed: u64 = 1;
        let noise: String = (0..2_000_000)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                char::from(b'a' + ((seed >> 59) as u8 % 26))
            })
            .collect();
        rel.manifest = noise;
        let Err(e) = to_secret(&rel, "ns", &BTreeMap::new(), Write::Create, Utc::now()) else {
            panic!("a 2 MB random manifest must not fit in a Secret");
        };
        assert!(matches!(e, CodecError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("cilium revision 3"), "{e}");
    }

    /// A gzip bomb: a record that fits in a Secret but expands past
    /// [`MAX_DECOMPRESSED_BYTES`] is one error naming the record, and decoding
    /// stops at the bound instead of expanding it all.
    #[test]
    fn a_gzip_bomb_record_is_refused_naming_the_record() {
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(MAX_DECOMPRESSED_BYTES >> 20) + 1 {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = gz.finish().unwrap();
        let data = base64::engine::general_purpose::STANDARD.encode(&bomb);
        assert!(
            data.len() < MAX_RECORD_BYTES,
            "the bomb fits in a Secret: {} bytes",
            data.len()
        );
        let e = decode_release(data.as_bytes(), "kube-system/sh.helm.release.v1.cilium.v7")
            .unwrap_err();
        assert!(matches!(e, CodecError::TooLargeDecompressed { .. }), "{e}");
        let said = e.to_string();
        assert!(
            said.contains("kube-system/sh.helm.release.v1.cilium.v7") && said.contains("delete it"),
            "{said}"
        );
        // Exactly at the bound is not over it: the JSON error comes next.
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        for _ in 0..(MAX_DECOMPRESSED_BYTES >> 20) {
            gz.write_all(&zeros).unwrap();
        }
        let at_bound = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
        let e = decode_release(at_bound.as_bytes(), "s").unwrap_err();
        assert!(matches!(e, CodecError::DecodeJson { .. }), "{e}");
    }

    #[test]
    fn status_spelling_matches_labels() {
        for s in Status::ALL {
            let json = serde_json::to_value(s).unwrap();
            assert_eq!(json, s.as_str());
        }
        assert!(Status::PendingRollback.is_pending() && !Status::Failed.is_pending());
    }

    #[test]
    fn custom_labels_never_override_system_labels() {
        let custom = BTreeMap::from([
            ("status".to_string(), "x".to_string()),
            ("team".into(), "net".into()),
        ]);
        let s = to_secret(&sample(), "ns", &custom, Write::Update, Utc::now()).unwrap();
        let labels = s.metadata.labels.clone().unwrap();
        assert_eq!(labels["status"], "deployed");
        assert_eq!(labels["team"], "net");
        assert!(labels.contains_key("modifiedAt"));
        assert_eq!(
            custom_labels(&s),
            BTreeMap::from([("team".to_string(), "net".to_string())])
        );
    }

    fn arb_time() -> impl Strategy<Value = Option<DateTime<Utc>>> {
        prop::option::of((0i64..4_000_000_000, 0u32..1_000_000_000))
            .prop_map(|o| o.map(|(s, n)| DateTime::from_timestamp(s, n).unwrap()))
    }

    fn arb_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-zA-Z0-9 ._/-]{0,12}".prop_map(Value::from),
        ]
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        arb_leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_map(reserved: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::btree_map("x_[a-z]{1,6}", arb_value(), 0..3).prop_map(move |m| {
            m.into_iter()
                .filter(|(k, _)| !reserved.contains(&k.as_str()))
                .collect()
        })
    }

    prop_compose! {
        fn arb_info()(
            first in arb_time(), last in arb_time(), deleted in arb_time(),
            description in ".{0,20}", status in prop::sample::select(Status::ALL.to_vec()),
            notes in ".{0,20}", extra in arb_map(&[]),
        ) -> Info {
            Info { first_deployed: first, last_deployed: last, deleted, description, status, notes, extra }
        }
    }

    prop_compose! {
        fn arb_release()(
            name in "[a-z][a-z0-9-]{0,20}", info in prop::option::of(arb_info()),
            chart in prop::option::of(arb_value()),
            config in prop::option::of(prop::collection::btree_map("[a-zA-Z]{1,8}", arb_value(), 0..4)),
            manifest in ".{0,64}", hooks in prop::collection::vec(arb_value(), 0..3),
            version in any::<u32>(), namespace in "[a-z-]{0,12}",
            apply_method in prop::option::of(prop::sample::select(vec!["ssa".to_string(), "csa".to_string()])),
            extra in arb_map(&[]),
        ) -> Release {
            Release {
                name, info,
                chart: chart.filter(|c| !c.is_null()).map(|c| StoredChart::from_value(&c).unwrap()),
                config: config.map(|c| c.into_iter().collect()),
                manifest, hooks, version, namespace, apply_method, extra,
            }
        }
    }

    proptest! {
        /// decode(encode(x)) == x for any release, through the Secret too.
        #[test]
        fn codec_round_trips(rel in arb_release()) {
            let encoded = encode_release(&rel).unwrap();
            prop_assert_eq!(&decode_release(encoded.as_bytes(), "s").unwrap(), &rel);
            let secret = to_secret(&rel, "ns", &BTreeMap::new(), Write::Create, Utc::now()).unwrap();
            prop_assert_eq!(from_secret(&secret).unwrap(), rel);
        }
    }
}
