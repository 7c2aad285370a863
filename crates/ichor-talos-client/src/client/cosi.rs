//! The COSI State service: Get, List and Watch of any resource, and the
//! typed read of one resource's spec.

use std::time::Duration;

use futures::Stream;
use prost::Message;

use crate::error::Error;
use crate::proto::cosi::resource as cosi;
use crate::resources::Kind;

use super::TalosClient;
use super::stream;

/// A COSI resource as read from a node.
#[derive(Debug, Clone, PartialEq)]
pub struct CosiResource {
    pub namespace: String,
    pub r#type: String,
    pub id: String,
    /// Decimal counter, or `undefined`.
    pub version: String,
    pub phase: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The protobuf-encoded spec.
    pub proto_spec: Vec<u8>,
    /// The YAML-encoded spec.
    pub yaml_spec: String,
}

impl CosiResource {
    pub(super) fn from_proto(r: cosi::Resource) -> Self {
        let md = r.metadata.unwrap_or_default();
        let spec = r.spec.unwrap_or_default();
        Self {
            namespace: md.namespace,
            r#type: md.r#type,
            id: md.id,
            version: md.version,
            phase: md.phase,
            labels: md.labels.into_iter().collect(),
            annotations: md.annotations.into_iter().collect(),
            proto_spec: spec.proto_spec,
            yaml_spec: spec.yaml_spec,
        }
    }

    /// Decodes the protobuf spec into a spec message of [`crate::proto::ichor::specs`].
    pub fn decode_spec<T: Message + Default>(&self) -> Result<T, prost::DecodeError> {
        T::decode(self.proto_spec.as_slice())
    }
}

/// The type of a COSI watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventType {
    Created,
    Updated,
    Destroyed,
    Bootstrapped,
    Errored,
    Noop,
}

/// One event of a COSI watch.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    pub event_type: WatchEventType,
    /// The resource (for DESTROYED a tombstone with metadata only).
    pub resource: Option<CosiResource>,
    /// The previous version on UPDATED.
    pub old: Option<CosiResource>,
    /// The error text of an ERRORED event.
    pub error: Option<String>,
}

impl TalosClient {
    /// `cosi.resource.State/Get`.
    pub async fn cosi_get(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<CosiResource, Error> {
        let call = format!("COSI Get {type}/{id}");
        let request = self.request(
            node,
            cosi::GetRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                id: id.to_string(),
                options: Some(cosi::GetOptions {}),
            },
        )?;
        let response = self.call(node, &call, self.state().get(request)).await?;
        let resource = response.resource.ok_or_else(|| Error::EmptyResponse {
            node: self.node_label(node),
            call: call.clone(),
        })?;
        Ok(CosiResource::from_proto(resource))
    }

    /// `cosi.resource.State/List`: every resource of a type, gathered under the call timeout.
    pub async fn cosi_list(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
    ) -> Result<Vec<CosiResource>, Error> {
        let call = format!("COSI List {type}");
        let request = self.request(
            node,
            cosi::ListRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                options: Some(cosi::ListOptions::default()),
            },
        )?;
        let mut state = self.state();
        let gather = async {
            let mut stream = state.list(request).await?.into_inner();
            let mut items = Vec::new();
            while let Some(item) = stream.message().await? {
                if let Some(r) = item.resource {
                    items.push(CosiResource::from_proto(r));
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new(items))
        };
        self.call(node, &call, gather).await
    }

    /// `cosi.resource.State/Watch` of one resource (`id` given) or of a whole
    /// kind (`id` `None`, with the current items first, then BOOTSTRAPPED).
    /// The setup (up to the server's ready message) is bounded by the call
    /// timeout; the returned stream runs until the caller drops it.
    pub async fn cosi_watch(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
        id: Option<&str>,
    ) -> Result<impl Stream<Item = Result<WatchEvent, Error>> + Send + 'static + use<>, Error> {
        let call = match id {
            Some(id) => format!("COSI Watch {type}/{id}"),
            None => format!("COSI Watch {type}"),
        };
        let mut request = self.request(
            node,
            cosi::WatchRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                id: id.map(str::to_string),
                options: Some(cosi::WatchOptions {
                    bootstrap_contents: id.is_none(),
                    ..Default::default()
                }),
                api_version: 1,
            },
        )?;
        // The stream outlives the call timeout: only the setup is bounded here.
        request.set_timeout(Duration::from_secs(365 * 24 * 3600));
        let mut state = self.state();
        let setup = async {
            let mut stream = state.watch(request).await?.into_inner();
            // The first message is an empty "ready" signal.
            let _ready = stream.message().await?;
            Ok::<_, tonic::Status>(tonic::Response::new(stream))
        };
        let watch = self.call(node, &call, setup).await?;
        Ok(stream::watch_events(watch, self.node_label(node), call))
    }

    async fn get_kind(&self, node: &str, kind: Kind) -> Result<CosiResource, Error> {
        self.cosi_get(node, kind.namespace, kind.r#type, kind.id)
            .await
    }

    pub(super) async fn get_spec<T: Message + Default>(
        &self,
        node: &str,
        kind: Kind,
    ) -> Result<T, Error> {
        let r = self.get_kind(node, kind).await?;
        r.decode_spec::<T>().map_err(|e| Error::Decode {
            node: self.node_label(node),
            call: format!("COSI Get {}/{}", kind.r#type, kind.id),
            what: "the resource spec".to_string(),
            reason: e.to_string(),
        })
    }

    pub(super) async fn get_optional_spec<T: Message + Default>(
        &self,
        node: &str,
        kind: Kind,
    ) -> Result<Option<T>, Error> {
        match self.get_spec(node, kind).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
