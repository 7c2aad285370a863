//! The services Talos runs (`talosctl services`, `talosctl service <id>`):
//! each service's state changes as the node's record holds them, and its
//! health as Talos reports it.

use tonic::{Request, Response, Status};

use super::{ADMIN, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::host;
use crate::journal::ServiceEvents;
use crate::wire::machine as wire;

/// A service as ServiceList shows it.
fn service_info(s: &ServiceEvents) -> wire::ServiceInfo {
    let health = host::health(s);
    wire::ServiceInfo {
        id: s.id.clone(),
        state: s
            .state()
            .map_or("Initialized", |st| st.as_str())
            .to_string(),
        events: Some(wire::ServiceEvents {
            events: s
                .events
                .iter()
                .map(|(at, state, msg)| wire::ServiceEvent {
                    msg: msg.clone(),
                    state: state.as_str().to_string(),
                    ts: Some(prost_types::Timestamp::from(*at)),
                })
                .collect(),
        }),
        health: Some(wire::ServiceHealth {
            unknown: health.unknown,
            healthy: health.healthy,
            last_message: health.last_message,
            last_change: health.last_change.map(prost_types::Timestamp::from),
        }),
    }
}

impl NodeApi {
    pub(super) async fn service_list_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::ServiceListResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("ServiceList"));
                }
                let st = node.lock();
                Ok(wire::ServiceList {
                    metadata: None,
                    services: st.journal.services().iter().map(service_info).collect(),
                })
            })
            .await?;
        Ok(Response::new(wire::ServiceListResponse { messages }))
    }
}
