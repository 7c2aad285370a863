//! Listing release records as the API server's protobuf.
//!
//! A history is a list of every record of a release: about 0.75 MB of JSON
//! per record at the real Cilium release's size, because JSON carries each
//! Secret's data in base64 on top of Helm's own base64. The API server
//! writes built-in kinds in protobuf too (`application/vnd.kubernetes.protobuf`,
//! what client-go's generated clients, and so `helm`, ask for): the data as
//! raw bytes, nothing to escape. This module asks for that, decodes the
//! few fields a record needs (a `SecretList` decoder, field numbers from
//! Kubernetes' `generated.proto`; every other field is skipped), and falls
//! back to JSON when the server answers in JSON.
//!
//! The wire form: the 4 bytes `k8s\0`, then a `runtime.Unknown` message
//! whose `raw` field holds the `SecretList`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::core::ObjectList;
use prost::Message;
use prost::bytes::Bytes;

/// The media type of Kubernetes' protobuf encoding.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The `Accept` header of a record list: protobuf, else JSON.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// The magic prefix of the protobuf encoding (`k8s` and a zero byte).
const MAGIC: &[u8; 4] = b"k8s\0";

/// One listed Secret, with what a record needs of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListedSecret {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub resource_version: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `data.release`: Helm's `base64(gzip(json))`, as stored.
    pub release: Option<Vec<u8>>,
}

impl ListedSecret {
    /// `namespace/name`, as record errors name a record.
    pub fn display_name(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            (_, n) => n.clone().unwrap_or_default(),
        }
    }
}

impl From<Secret> for ListedSecret {
    fn from(s: Secret) -> Self {
        ListedSecret {
            namespace: s.metadata.namespace,
            name: s.metadata.name,
            resource_version: s.metadata.resource_version,
            labels: s.metadata.labels.unwrap_or_default(),
            release: s
                .data
                .and_then(|mut d| d.remove(crate::record::DATA_KEY))
                .map(|b| b.0),
        }
    }
}

/// Why a protobuf list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the body does not start with the protobuf prefix k8s\\0")]
    NoMagic,
    #[error("the body is not the protobuf of a list of Secrets")]
    Protobuf(#[from] prost::DecodeError),
    #[error("the list's envelope says kind {kind:?}, not SecretList")]
    NotASecretList { kind: String },
}

// The messages, with only the fields a record needs (tags from
// k8s.io/api/core/v1 and k8s.io/apimachinery generated.proto).

/// `runtime.Unknown`: the envelope of every protobuf response.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    raw: Option<Bytes>,
}

/// `runtime.TypeMeta`.
#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// `core.v1.SecretList` (its `metadata`, field 1, is skipped).
#[derive(Clone, PartialEq, Message)]
struct SecretList {
    #[prost(message, repeated, tag = "2")]
    items: Vec<ProtoSecret>,
}

/// `core.v1.Secret`: `metadata` (1) and `data` (2); `type`, `stringData`
/// and `immutable` are skipped.
#[derive(Clone, PartialEq, Message)]
struct ProtoSecret {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
}

/// `meta.v1.ObjectMeta`: name (1), namespace (3), resourceVersion (6),
/// labels (11); the rest is skipped.
#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
}

/// Decodes the protobuf of a `SecretList` as the API server writes it.
pub fn decode(body: Bytes) -> Result<Vec<ListedSecret>, DecodeError> {
    if !body.starts_with(MAGIC) {
        return Err(DecodeError::NoMagic);
    }
    let envelope = Unknown::decode(body.slice(MAGIC.len()..))?;
    let kind = envelope.type_meta.and_then(|t| t.kind).unwrap_or_default();
    if kind != "SecretList" {
        return Err(DecodeError::NotASecretList { kind });
    }
    let list = SecretList::decode(envelope.raw.unwrap_or_default())?;
    Ok(list
        .items
        .into_iter()
        .map(|mut s| {
            let meta = s.metadata.unwrap_or_default();
            ListedSecret {
                namespace: meta.namespace,
                name: meta.name,
                resource_version: meta.resource_version,
                labels: meta.labels,
                release: s.data.remove(crate::record::DATA_KEY),
            }
        })
        .collect())
}

/// How the API server answered a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

/// The Secrets of a list, and how they came.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub items: Vec<ListedSecret>,
    pub encoding: Encoding,
}

/// Lists Secrets (of `namespace`, or every namespace) by `lp`, in protobuf
/// when the server speaks it and else in JSON. A request the server refuses
/// in protobuf, or a body this decoder cannot read, is asked again in
/// JSON: the error, if any, is then the server's own, readable one.
pub async fn list(
    client: &kube::Client,
    namespace: Option<&str>,
    lp: &ListParams,
) -> Result<Listed, kube::Error> {
    let path = match namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/secrets"),
        None => "/api/v1/secrets".to_string(),
    };
    let mut req = kube::core::Request::new(path)
        .list(lp)
        .map_err(kube::Error::BuildRequest)?;
    req.headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
    let res = client.send(req.map(kube::client::Body::from)).await?;
    if res.status().is_success() {
        let content_type = res
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = res.into_body().collect_bytes().await?;
        if content_type.starts_with(PROTOBUF) {
            match decode(body) {
                Ok(items) => {
                    return Ok(Listed {
                        items,
                        encoding: Encoding::Protobuf,
                    });
                }
                Err(e) => tracing::warn!(
                    error = %ichor_api::error_text::chain(&e),
                    "the API server's protobuf list of Secrets could not be read; listing them again as JSON"
                ),
            }
        } else if let Ok(list) = serde_json::from_slice::<ObjectList<Secret>>(&body) {
            return Ok(Listed {
                items: list.items.into_iter().map(ListedSecret::from).collect(),
                encoding: Encoding::Json,
            });
        }
    }
    Ok(Listed {
        items: json_list(client, namespace, lp).await?,
        encoding: Encoding::Json,
    })
}

async fn json_list(
    client: &kube::Client,
    namespace: Option<&str>,
    lp: &ListParams,
) -> Result<Vec<ListedSecret>, kube::Error> {
    let api: kube::Api<Secret> = match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    let list = api.list(lp).await?;
    Ok(list.items.into_iter().map(ListedSecret::from).collect())
}

#[cfg(test)]
mod tests {
    //! On bytes the real API server wrote: captured by
    //! `tests/secret_list.rs` (`ICHOR_UPDATE_FIXTURES=1`) from the Secrets it
    //! creates there (three records of `demo`, one of `other`, two Secrets
    //! that are not records), not written by hand.

    use super::*;
    use crate::record::decode_release;
    use pretty_assertions::assert_eq;

    const RECORDS: &[u8] = include_bytes!("../tests/fixtures/secret_list/records.pb");
    const ALL: &[u8] = include_bytes!("../tests/fixtures/secret_list/all.pb");
    const CONFIGMAPS: &[u8] = include_bytes!("../tests/fixtures/secret_list/configmaps.pb");

    fn sorted(body: &'static [u8]) -> Vec<ListedSecret> {
        let mut items = decode(Bytes::from_static(body)).unwrap();
        items.sort_by(|a, b| a.name.cmp(&b.name));
        items
    }

    /// Covers: the record-read goal (docs/benchmarks.md): records listed in protobuf
    #[test]
    fn the_records_the_api_server_listed_decode_with_their_labels_and_data() {
        let items = sorted(RECORDS);
        assert_eq!(
            items
                .iter()
                .map(|s| s.name.clone().unwrap())
                .collect::<Vec<_>>(),
            (1..=3)
                .map(|v| format!("sh.helm.release.v1.demo.v{v}"))
                .collect::<Vec<_>>()
        );
        for (i, s) in items.iter().enumerate() {
            let version = i as u32 + 1;
            assert!(s.namespace.as_deref().unwrap().starts_with("pblist"));
            assert!(
                s.resource_version
                    .as_deref()
                    .unwrap()
                    .parse::<u64>()
                    .is_ok()
            );
            assert_eq!(s.labels["name"], "demo");
            assert_eq!(s.labels["owner"], "helm");
            assert_eq!(s.labels["version"], version.to_string());
            let status = if version == 3 {
                "deployed"
            } else {
                "superseded"
            };
            assert_eq!(s.labels["status"], status);
            let rel = decode_release(s.release.as_ref().unwrap(), &s.display_name()).unwrap();
            assert_eq!((rel.name.as_str(), rel.version), ("demo", version));
            assert!(rel.manifest.contains(&format!("# revision {version}")));
        }
    }

    /// Covers: the record-read goal (docs/benchmarks.md): records listed in protobuf
    #[test]
    fn data_comes_as_the_raw_bytes_written_and_other_secrets_come_too() {
        let items = sorted(ALL);
        let names: Vec<_> = items.iter().map(|s| s.name.clone().unwrap()).collect();
        assert_eq!(
            names,
            [
                "not-a-record",
                "sh.helm.release.v1.demo.v1",
                "sh.helm.release.v1.demo.v2",
                "sh.helm.release.v1.demo.v3",
                "sh.helm.release.v1.other.v1",
            ]
        );
        let plain = &items[0];
        assert_eq!(
            plain.release.as_deref(),
            Some(&[0u8, 0x9f, 0x92, 0x96, 0xff, b'\n', 0][..])
        );
        assert_eq!(
            plain.labels,
            BTreeMap::from([("name".to_string(), "demo".to_string())])
        );
        assert_eq!(items[4].labels["name"], "other");
    }

    /// Covers: the record-read goal (docs/benchmarks.md): records listed in protobuf
    #[test]
    fn a_list_of_another_kind_json_or_a_cut_body_is_an_error() {
        match decode(Bytes::from_static(CONFIGMAPS)) {
            Err(DecodeError::NotASecretList { kind }) => assert_eq!(kind, "ConfigMapList"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(Bytes::from_static(br#"{"kind":"SecretList","items":[]}"#)),
            Err(DecodeError::NoMagic)
        ));
        let cut = Bytes::from_static(&RECORDS[..RECORDS.len() / 2]);
        assert!(matches!(decode(cut), Err(DecodeError::Protobuf(_))));
    }
}
