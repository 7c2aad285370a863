//! The Services' EndpointSlices and Endpoints: each selected pod's podIP
//! and the declared containerPort, as a real cluster shows them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Endpoints, Pod, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::container_port;
use super::kubelet::{IchorPods, PodProcess};

/// The field manager of the EndpointSlices the lab publishes.
const MANAGER: &str = "ichor-lab-kubelet";

impl IchorPods {
    /// One EndpointSlice per Service that selects Ichor's running pods, with
    /// each pod's address and the port the lab mapped for the targetPort.
    pub(super) async fn publish_endpoints(
        &mut self,
        client: &kube::Client,
    ) -> Result<(), kube::Error> {
        let namespaces: BTreeSet<String> =
            self.deployments.keys().map(|(ns, _)| ns.clone()).collect();
        for ns in namespaces {
            let services = Api::<Service>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await?
                .items;
            let pods = Api::<Pod>::namespaced(client.clone(), &ns);
            for svc in services {
                let Some(spec) = svc.spec.clone() else {
                    continue;
                };
                let Some(selector) = spec.selector.clone().filter(|s| !s.is_empty()) else {
                    continue;
                };
                let svc_name = svc.metadata.name.clone().unwrap_or_default();
                let (endpoints, ports) = self
                    .selected_endpoints(&pods, &ns, &spec, &selector)
                    .await?;
                let slice = json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{svc_name}-lab"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": svc_name,
                            "endpointslice.kubernetes.io/managed-by": MANAGER}},
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                    "ports": ports,
                });
                let key = (ns.clone(), svc_name.clone());
                if self.published.get(&key) == Some(&slice) {
                    continue;
                }
                if apply_endpoints(client, &ns, &svc_name, &slice).await {
                    self.published.insert(key, slice);
                }
            }
        }
        Ok(())
    }

    /// The endpoints of the serving pods in `ns` that `selector` selects, and
    /// the Service's ports those pods have (taken from the first such pod).
    async fn selected_endpoints(
        &self,
        pods: &Api<Pod>,
        ns: &str,
        spec: &ServiceSpec,
        selector: &BTreeMap<String, String>,
    ) -> Result<(Vec<Value>, Vec<Value>), kube::Error> {
        let mut endpoints = Vec::new();
        let mut ports: Vec<Value> = Vec::new();
        let serving = self.deployments.iter().chain(
            self.retiring
                .iter()
                .filter(|(_, (_, until))| until.is_none())
                .map(|(k, (pods, _))| (k, pods)),
        );
        for ((d_ns, _), state) in serving {
            if *d_ns != ns {
                continue;
            }
            for p in &state.pods {
                let Some(pod) = pods.get_opt(&p.name).await? else {
                    continue;
                };
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                    continue;
                }
                let Some(container) = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .cloned()
                else {
                    continue;
                };
                endpoints.push(json!({"addresses": [p.pod_ip.to_string()],
                    "conditions": {"ready": p.ready, "serving": p.ready, "terminating": false},
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": p.name}}));
                if ports.is_empty() {
                    ports = service_ports(spec, &container, p);
                }
            }
        }
        Ok((endpoints, ports))
    }
}

/// The Service's ports whose targetPort names a port the pod's container
/// declares (and the lab mapped).
fn service_ports(spec: &ServiceSpec, container: &Container, p: &PodProcess) -> Vec<Value> {
    let mut ports = Vec::new();
    for sp in spec.ports.iter().flatten() {
        let target = sp
            .target_port
            .as_ref()
            .map(|t| serde_json::to_value(t).expect("port serialises"))
            .unwrap_or(json!(sp.port));
        if let Some(declared) =
            container_port(container, &target).filter(|cp| p.ports.contains_key(cp))
        {
            ports.push(json!({"name": sp.name.clone().unwrap_or_default(),
                "port": declared, "protocol": "TCP"}));
        }
    }
    ports
}

/// The core/v1 Endpoints with the ready endpoints of `slice`, for an API
/// server that resolves Services through those.
fn legacy_endpoints(slice: &Value, ns: &str, svc_name: &str) -> Value {
    let ready: Vec<Value> = slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["conditions"]["ready"] == true)
        .map(|e| json!({"ip": e["addresses"][0], "targetRef": e["targetRef"]}))
        .collect();
    let subsets = if ready.is_empty() {
        json!([])
    } else {
        json!([{"addresses": ready, "ports": slice["ports"]}])
    };
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": svc_name, "namespace": ns}, "subsets": subsets})
}

/// Applies the Service's Endpoints and EndpointSlice (failures are logged);
/// true when the EndpointSlice was applied.
async fn apply_endpoints(client: &kube::Client, ns: &str, svc_name: &str, slice: &Value) -> bool {
    let legacy = legacy_endpoints(slice, ns, svc_name);
    if let Err(e) = Api::<Endpoints>::namespaced(client.clone(), ns)
        .patch(
            svc_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&legacy),
        )
        .await
    {
        tracing::warn!(error = %ichor_api::error_text::chain(&e), "lab kubelet: Endpoints of Service {ns}/{svc_name}");
    }
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    match api
        .patch(
            &format!("{svc_name}-lab"),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(slice),
        )
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %ichor_api::error_text::chain(&e), "lab kubelet: EndpointSlice of Service {ns}/{svc_name}");
            false
        }
    }
}
