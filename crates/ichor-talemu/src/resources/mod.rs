//! The COSI resources an emulated node serves: their definitions (so
//! `talosctl get <alias>` resolves them) and their specs derived from the
//! node's state, encoded both as protobuf (`proto_spec`) and YAML (`yaml_spec`).

use prost::Message;
use serde_yaml_ng::{Mapping, Value};

use ichor_talos_client::proto::cosi::resource::meta::{
    NamespaceSpec, ResourceDefinitionSpec, resource_definition_spec,
};
use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use crate::derive::ConfigFacts;

/// A resource definition the emulator serves.
#[derive(Debug, Clone, Copy)]
pub struct Definition {
    pub namespace: &'static str,
    pub r#type: &'static str,
    /// Singular display name (`MachineConfig`).
    pub display: &'static str,
    pub extra_aliases: &'static [&'static str],
    pub sensitive: bool,
    pub columns: &'static [(&'static str, &'static str)],
}

/// Every resource type the emulator knows (others are "not supported", as
/// Talos answers for unregistered types).
pub const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::MACHINE_CONFIG.namespace,
        r#type: kinds::MACHINE_CONFIG.r#type,
        display: "MachineConfig",
        extra_aliases: &[],
        sensitive: true,
        columns: &[],
    },
    Definition {
        namespace: kinds::MACHINE_TYPE.namespace,
        r#type: kinds::MACHINE_TYPE.r#type,
        display: "MachineType",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
    Definition {
        namespace: kinds::VERSION.namespace,
        r#type: kinds::VERSION.r#type,
        display: "Version",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Name", "{.name}"), ("Version", "{.version}")],
    },
    Definition {
        namespace: kinds::NODENAME.namespace,
        r#type: kinds::NODENAME.r#type,
        display: "Nodename",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Nodename", "{.nodename}")],
    },
    Definition {
        namespace: kinds::HOSTNAME_STATUS.namespace,
        r#type: kinds::HOSTNAME_STATUS.r#type,
        display: "HostnameStatus",
        extra_aliases: &["hostname"],
        sensitive: false,
        columns: &[("Hostname", "{.hostname}"), ("Domainname", "{.domainname}")],
    },
    Definition {
        namespace: kinds::KUBEPRISM_CONFIG.namespace,
        r#type: kinds::KUBEPRISM_CONFIG.r#type,
        display: "KubePrismConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Host", "{.host}"),
            ("Port", "{.port}"),
            ("Endpoints", "{.endpoints}"),
        ],
    },
    Definition {
        namespace: kinds::KUBEPRISM_STATUS.namespace,
        r#type: kinds::KUBEPRISM_STATUS.r#type,
        display: "KubePrismStatus",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("HOST", "{.host}"), ("HEALTHY", "{.healthy}")],
    },
    Definition {
        namespace: kinds::KUBEPRISM_ENDPOINTS.namespace,
        r#type: kinds::KUBEPRISM_ENDPOINTS.r#type,
        display: "KubePrismEndpoint",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
    Definition {
        namespace: kinds::BOOTSTRAP_MANIFESTS_CONFIG.namespace,
        r#type: kinds::BOOTSTRAP_MANIFESTS_CONFIG.r#type,
        display: "BootstrapManifestsConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
    Definition {
        namespace: kinds::MACHINE_STATUS.namespace,
        r#type: kinds::MACHINE_STATUS.r#type,
        display: "MachineStatus",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Stage", "{.stage}"), ("Ready", "{.status.ready}")],
    },
    Definition {
        namespace: kinds::DISKS.namespace,
        r#type: kinds::DISKS.r#type,
        display: "Disk",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Size", "{.pretty_size}"),
            ("Read Only", "{.readonly}"),
            ("Transport", "{.transport}"),
            ("Rotational", "{.rotational}"),
            ("Model", "{.model}"),
            ("Serial", "{.serial}"),
        ],
    },
    Definition {
        namespace: kinds::CLUSTER_INFO.namespace,
        r#type: kinds::CLUSTER_INFO.r#type,
        display: "Info",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Cluster ID", "{.clusterId}"),
            ("Cluster Name", "{.clusterName}"),
        ],
    },
    Definition {
        namespace: kinds::APISERVER_CONFIG.namespace,
        r#type: kinds::APISERVER_CONFIG.r#type,
        display: "APIServerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::CONTROLLER_MANAGER_CONFIG.namespace,
        r#type: kinds::CONTROLLER_MANAGER_CONFIG.r#type,
        display: "ControllerManagerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::SCHEDULER_CONFIG.namespace,
        r#type: kinds::SCHEDULER_CONFIG.r#type,
        display: "SchedulerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::KUBELET_CONFIG.namespace,
        r#type: kinds::KUBELET_CONFIG.r#type,
        display: "KubeletConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::RESOURCE_DEFINITION.namespace,
        r#type: kinds::RESOURCE_DEFINITION.r#type,
        display: "ResourceDefinition",
        extra_aliases: &["api-resources"],
        sensitive: false,
        columns: &[("Aliases", "{.aliases[:]}")],
    },
    Definition {
        namespace: kinds::NAMESPACE.namespace,
        r#type: kinds::NAMESPACE.r#type,
        display: "Namespace",
        extra_aliases: &["ns"],
        sensitive: false,
        columns: &[],
    },
    crate::manifests::DEFINITION,
];

/// The namespaces the emulator serves.
pub const NAMESPACES: &[(&str, &str)] = &[
    ("cluster", "Cluster configuration and discovery resources."),
    ("config", "Talos node configuration."),
    ("controlplane", "Kubernetes control plane resources."),
    ("k8s", "Kubernetes all node types resources."),
    (
        "meta",
        "Metadata namespace which contains resource definitions.",
    ),
    ("network", "Networking resources."),
    ("runtime", "Talos runtime resources."),
];

/// The definition of a type, if the emulator knows it.
pub fn definition(r#type: &str) -> Option<&'static Definition> {
    DEFINITIONS.iter().find(|d| d.r#type == r#type)
}

/// Aliases as COSI computes them (`ResourceDefinitionSpec.Fill`): the
/// lower-cased singular, the acronym of its capitals (and its plural), the
/// lower-cased plural and its dotted prefixes of the suffix.
pub fn aliases(def: &Definition) -> (Vec<String>, Vec<String>) {
    let (name, suffix) = def.r#type.split_once('.').unwrap_or((def.r#type, ""));
    let mut aliases: Vec<String> = def.extra_aliases.iter().map(|s| s.to_string()).collect();
    let mut all = Vec::new();
    aliases.push(def.display.to_lowercase());
    all.push(name.to_lowercase());
    let parts: Vec<&str> = suffix.split('.').collect();
    for i in 1..parts.len() {
        all.push(format!("{}.{}", name.to_lowercase(), parts[..i].join(".")));
    }
    let upper: String = name.chars().filter(char::is_ascii_uppercase).collect();
    if upper.len() > 1 {
        aliases.push(upper.to_lowercase());
        if !upper.ends_with('S') {
            aliases.push(format!("{}s", upper.to_lowercase()));
        }
    }
    all.extend(aliases.iter().cloned());
    (aliases, all)
}

/// One resource, ready to be stored and served.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub namespace: String,
    pub r#type: String,
    pub id: String,
    pub proto_spec: Vec<u8>,
    pub yaml_spec: String,
    pub annotations: Vec<(String, String)>,
}

fn item(kind_ns: &str, r#type: &str, id: &str, proto: Vec<u8>, yaml: Value) -> Item {
    Item {
        namespace: kind_ns.to_string(),
        r#type: r#type.to_string(),
        id: id.to_string(),
        proto_spec: proto,
        yaml_spec: serde_yaml_ng::to_string(&yaml).unwrap_or_default(),
        annotations: Vec::new(),
    }
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(Value::from(k), v);
    }
    Value::Mapping(m)
}

fn strings(v: &[String]) -> Value {
    Value::Sequence(v.iter().map(|s| Value::from(s.as_str())).collect())
}

/// The meta resources: definitions and namespaces.
pub fn meta_items() -> Vec<Item> {
    let mut items = Vec::new();
    for def in DEFINITIONS {
        let (aliases, all_aliases) = aliases(def);
        let spec = ResourceDefinitionSpec {
            resource_type: def.r#type.to_string(),
            display_type: def.display.to_string(),
            default_namespace: def.namespace.to_string(),
            aliases: aliases.clone(),
            all_aliases: all_aliases.clone(),
            print_columns: def
                .columns
                .iter()
                .map(|(n, p)| resource_definition_spec::PrintColumn {
                    name: n.to_string(),
                    json_path: p.to_string(),
                })
                .collect(),
            sensitivity: if def.sensitive {
                resource_definition_spec::Sensitivity::Sensitive as i32
            } else {
                0
            },
        };
        let mut yaml = vec![
            ("type", Value::from(def.r#type)),
            ("displayType", Value::from(def.display)),
            ("defaultNamespace", Value::from(def.namespace)),
            ("aliases", strings(&aliases)),
            ("allAliases", strings(&all_aliases)),
            (
                "printColumns",
                Value::Sequence(
                    def.columns
                        .iter()
                        .map(|(n, p)| {
                            map(vec![
                                ("name", Value::from(*n)),
                                ("jsonPath", Value::from(*p)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ];
        if def.sensitive {
            yaml.push(("sensitivity", Value::from("sensitive")));
        }
        items.push(item(
            "meta",
            kinds::RESOURCE_DEFINITION.r#type,
            &def.r#type.to_lowercase(),
            spec.encode_to_vec(),
            map(yaml),
        ));
    }
    for (ns, description) in NAMESPACES {
        let spec = NamespaceSpec {
            description: description.to_string(),
        };
        items.push(item(
            "meta",
            kinds::NAMESPACE.r#type,
            ns,
            spec.encode_to_vec(),
            map(vec![("description", Value::from(*description))]),
        ));
    }
    items
}

/// The inputs of a node's resources.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    pub hostname: &'a str,
    pub talos_version: &'a str,
    /// v1.13+ (the Version resource has `name`, BootstrapManifestsConfig has `cniName`).
    pub v1_13_or_later: bool,
    pub active_config: Option<&'a [u8]>,
    pub persistent_config: Option<&'a [u8]>,
    pub facts: Option<&'a ConfigFacts>,
    /// `MachineStatus.stage`: 3 maintenance, 4 running, 5 rebooting.
    pub stage: i32,
    /// The node's block devices.
    pub disks: &'a [crate::node::Disk],
}

fn machine_config_item(id: &str, bytes: &[u8]) -> Item {
    let spec = specs::MachineConfigSpec {
        yaml_marshalled: bytes.to_vec(),
    };
    let text = String::from_utf8_lossy(bytes).into_owned();
    Item {
        namespace: kinds::MACHINE_CONFIG.namespace.to_string(),
        r#type: kinds::MACHINE_CONFIG.r#type.to_string(),
        id: id.to_string(),
        proto_spec: spec.encode_to_vec(),
        yaml_spec: serde_yaml_ng::to_string(&Value::from(text)).unwrap_or_default(),
        annotations: vec![("talos.dev/yaml-spec".to_string(), "1".to_string())],
    }
}

fn host_port(endpoint: &str) -> Option<(String, u32)> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let rest = rest.split('/').next()?;
    if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(443);
        return Some((host.to_string(), port));
    }
    match rest.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((rest.to_string(), 443)),
    }
}

/// The tenth address of the first service subnet (the cluster DNS service IP).
fn dns_service_ip(service_subnets: &[String]) -> String {
    service_subnets
        .iter()
        .find_map(|s| {
            let (addr, _) = s.split_once('/')?;
            let ip: std::net::Ipv4Addr = addr.parse().ok()?;
            Some(std::net::Ipv4Addr::from(u32::from(ip) + 10).to_string())
        })
        .unwrap_or_default()
}

/// Every resource of a node (meta resources included).
pub fn node_items(view: &NodeView<'_>) -> Vec<Item> {
    let mut items = meta_items();
    items.push(version_item(view));
    let hostname = view
        .facts
        .and_then(|f| f.hostname.as_deref())
        .unwrap_or(view.hostname);
    items.push(hostname_status_item(hostname));
    items.push(machine_status_item(view.stage));
    items.extend(view.disks.iter().map(disk_item));

    // A node without an applied config serves only what maintenance mode has.
    let (Some(active), Some(facts)) = (view.active_config, view.facts) else {
        return items;
    };
    items.push(machine_config_item(kinds::MACHINE_CONFIG.id, active));
    if let Some(persistent) = view.persistent_config {
        items.push(machine_config_item(
            kinds::MACHINE_CONFIG_PERSISTENT_ID,
            persistent,
        ));
    }
    items.push(machine_type_item(facts));
    items.push(nodename_item(hostname));
    items.push(cluster_info_item(facts));
    if let Some(port) = facts.kubeprism_port {
        items.extend(kubeprism_items(facts, port));
    }
    if facts.machine_type.is_control_plane() && facts.has_kubernetes_network {
        items.push(bootstrap_manifests_config_item(facts, view.v1_13_or_later));
    }
    if facts.machine_type.is_control_plane() {
        items.extend(crate::manifests::manifest_items(facts, active));
    }
    items.extend(component_items(facts));
    items
}

/// The component configs Talos derives from the machine config: the
/// kubelet's on every node, the control-plane components' on control planes.
/// A node applied a new image when its item says so (what an upgrade waits for).
fn component_items(facts: &ConfigFacts) -> Vec<Item> {
    let image_yaml = |image: &str| map(vec![("image", Value::from(image))]);
    let enabled_yaml = |image: &str| {
        map(vec![
            ("enabled", Value::from(true)),
            ("image", Value::from(image)),
        ])
    };
    let mut items = vec![item(
        kinds::KUBELET_CONFIG.namespace,
        kinds::KUBELET_CONFIG.r#type,
        kinds::KUBELET_CONFIG.id,
        specs::KubeletConfigSpec {
            image: facts.kubelet_image.clone(),
        }
        .encode_to_vec(),
        image_yaml(&facts.kubelet_image),
    )];
    if !facts.machine_type.is_control_plane() {
        return items;
    }
    items.push(item(
        kinds::APISERVER_CONFIG.namespace,
        kinds::APISERVER_CONFIG.r#type,
        kinds::APISERVER_CONFIG.id,
        specs::ApiServerConfigSpec {
            image: facts.apiserver_image.clone(),
        }
        .encode_to_vec(),
        image_yaml(&facts.apiserver_image),
    ));
    items.push(item(
        kinds::CONTROLLER_MANAGER_CONFIG.namespace,
        kinds::CONTROLLER_MANAGER_CONFIG.r#type,
        kinds::CONTROLLER_MANAGER_CONFIG.id,
        specs::ControllerManagerConfigSpec {
            enabled: true,
            image: facts.controller_manager_image.clone(),
        }
        .encode_to_vec(),
        enabled_yaml(&facts.controller_manager_image),
    ));
    items.push(item(
        kinds::SCHEDULER_CONFIG.namespace,
        kinds::SCHEDULER_CONFIG.r#type,
        kinds::SCHEDULER_CONFIG.id,
        specs::SchedulerConfigSpec {
            enabled: true,
            image: facts.scheduler_image.clone(),
        }
        .encode_to_vec(),
        enabled_yaml(&facts.scheduler_image),
    ));
    items
}

/// Sizes as Talos prints them (`humanize.Bytes`: powers of 1000, one decimal).
fn pretty_size(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value < 10.0 {
        format!("{value:.1} {}", units[unit])
    } else {
        format!("{value:.0} {}", units[unit])
    }
}

fn disk_item(disk: &crate::node::Disk) -> Item {
    let id = disk.dev_path.trim_start_matches("/dev/").to_string();
    let spec = specs::DiskSpec {
        size: disk.size,
        io_size: 512,
        sector_size: 512,
        readonly: false,
        model: disk.model.clone(),
        serial: disk.serial.clone(),
        modalias: String::new(),
        wwid: String::new(),
        bus_path: String::new(),
        sub_system: "/sys/class/block".to_string(),
        transport: disk.transport.clone(),
        rotational: disk.rotational,
        cdrom: false,
        dev_path: disk.dev_path.clone(),
    };
    let yaml = map(vec![
        ("dev_path", Value::from(disk.dev_path.as_str())),
        ("size", Value::from(disk.size)),
        ("pretty_size", Value::from(pretty_size(disk.size))),
        ("io_size", Value::from(512)),
        ("sector_size", Value::from(512)),
        ("readonly", Value::from(false)),
        ("cdrom", Value::from(false)),
        ("model", Value::from(disk.model.as_str())),
        ("serial", Value::from(disk.serial.as_str())),
        ("sub_system", Value::from("/sys/class/block")),
        ("transport", Value::from(disk.transport.as_str())),
        ("rotational", Value::from(disk.rotational)),
    ]);
    item(
        kinds::DISKS.namespace,
        kinds::DISKS.r#type,
        &id,
        spec.encode_to_vec(),
        yaml,
    )
}

fn version_item(view: &NodeView<'_>) -> Item {
    let version = specs::VersionSpec {
        version: view.talos_version.to_string(),
        name: if view.v1_13_or_later {
            "Talos".to_string()
        } else {
            String::new()
        },
    };
    let mut version_yaml = vec![("version", Value::from(view.talos_version))];
    if view.v1_13_or_later {
        version_yaml.insert(0, ("name", Value::from("Talos")));
    }
    item(
        kinds::VERSION.namespace,
        kinds::VERSION.r#type,
        kinds::VERSION.id,
        version.encode_to_vec(),
        map(version_yaml),
    )
}

fn hostname_status_item(hostname: &str) -> Item {
    item(
        kinds::HOSTNAME_STATUS.namespace,
        kinds::HOSTNAME_STATUS.r#type,
        kinds::HOSTNAME_STATUS.id,
        specs::HostnameStatusSpec {
            hostname: hostname.to_string(),
            domainname: String::new(),
        }
        .encode_to_vec(),
        map(vec![
            ("hostname", Value::from(hostname)),
            ("domainname", Value::from("")),
        ]),
    )
}

fn machine_status_item(stage: i32) -> Item {
    let stage_name = match stage {
        3 => "maintenance",
        5 => "rebooting",
        _ => "running",
    };
    item(
        kinds::MACHINE_STATUS.namespace,
        kinds::MACHINE_STATUS.r#type,
        kinds::MACHINE_STATUS.id,
        specs::MachineStatusSpec {
            stage,
            status: Some(specs::MachineStatusStatus {
                ready: stage == 4,
                unmet_conditions: Vec::new(),
            }),
        }
        .encode_to_vec(),
        map(vec![
            ("stage", Value::from(stage_name)),
            (
                "status",
                map(vec![
                    ("ready", Value::from(stage == 4)),
                    ("unmetConditions", Value::Sequence(Vec::new())),
                ]),
            ),
        ]),
    )
}

fn machine_type_item(facts: &ConfigFacts) -> Item {
    item(
        kinds::MACHINE_TYPE.namespace,
        kinds::MACHINE_TYPE.r#type,
        kinds::MACHINE_TYPE.id,
        specs::MachineTypeSpec {
            machine_type: facts.machine_type.proto(),
        }
        .encode_to_vec(),
        Value::from(facts.machine_type.as_str()),
    )
}

fn nodename_item(hostname: &str) -> Item {
    item(
        kinds::NODENAME.namespace,
        kinds::NODENAME.r#type,
        kinds::NODENAME.id,
        specs::NodenameSpec {
            nodename: hostname.to_string(),
            hostname_version: "1".to_string(),
            skip_node_registration: false,
        }
        .encode_to_vec(),
        map(vec![
            ("nodename", Value::from(hostname)),
            ("hostnameVersion", Value::from("1")),
            ("skipNodeRegistration", Value::from(false)),
        ]),
    )
}

fn cluster_info_item(facts: &ConfigFacts) -> Item {
    item(
        kinds::CLUSTER_INFO.namespace,
        kinds::CLUSTER_INFO.r#type,
        kinds::CLUSTER_INFO.id,
        specs::ClusterInfoSpec {
            cluster_id: facts.cluster_id.clone(),
            cluster_name: facts.cluster_name.clone(),
        }
        .encode_to_vec(),
        map(vec![
            ("clusterId", Value::from(facts.cluster_id.as_str())),
            ("clusterName", Value::from(facts.cluster_name.as_str())),
        ]),
    )
}

/// KubePrism's endpoints: the control plane endpoint, then (on a control
/// plane node) the local API server.
fn kubeprism_endpoints(facts: &ConfigFacts) -> Vec<(String, u32)> {
    let mut endpoints = Vec::new();
    if let Some((host, p)) = facts.control_plane_endpoint.as_deref().and_then(host_port) {
        endpoints.push((host, p));
    }
    if facts.machine_type.is_control_plane() {
        endpoints.push(("localhost".to_string(), 6443));
    }
    endpoints
}

/// KubePrismEndpoints, KubePrismConfig and KubePrismStatus of a node with
/// KubePrism on `port`.
fn kubeprism_items(facts: &ConfigFacts, port: u16) -> Vec<Item> {
    let endpoints = kubeprism_endpoints(facts);
    let proto_endpoints: Vec<specs::KubePrismEndpoint> = endpoints
        .iter()
        .map(|(h, p)| specs::KubePrismEndpoint {
            host: h.clone(),
            port: *p,
        })
        .collect();
    let yaml_endpoints = Value::Sequence(
        endpoints
            .iter()
            .map(|(h, p)| {
                map(vec![
                    ("host", Value::from(h.as_str())),
                    ("port", Value::from(*p)),
                ])
            })
            .collect(),
    );
    let host = format!("127.0.0.1:{port}");
    vec![
        item(
            kinds::KUBEPRISM_ENDPOINTS.namespace,
            kinds::KUBEPRISM_ENDPOINTS.r#type,
            kinds::KUBEPRISM_ENDPOINTS.id,
            specs::KubePrismEndpointsSpec {
                endpoints: proto_endpoints.clone(),
            }
            .encode_to_vec(),
            map(vec![("endpoints", yaml_endpoints.clone())]),
        ),
        item(
            kinds::KUBEPRISM_CONFIG.namespace,
            kinds::KUBEPRISM_CONFIG.r#type,
            kinds::KUBEPRISM_CONFIG.id,
            specs::KubePrismConfigSpec {
                host: "127.0.0.1".to_string(),
                port: i64::from(port),
                endpoints: proto_endpoints,
            }
            .encode_to_vec(),
            map(vec![
                ("host", Value::from("127.0.0.1")),
                ("port", Value::from(port)),
                ("endpoints", yaml_endpoints),
            ]),
        ),
        item(
            kinds::KUBEPRISM_STATUS.namespace,
            kinds::KUBEPRISM_STATUS.r#type,
            kinds::KUBEPRISM_STATUS.id,
            specs::KubePrismStatusesSpec {
                host: host.clone(),
                healthy: true,
            }
            .encode_to_vec(),
            map(vec![
                ("host", Value::from(host.as_str())),
                ("healthy", Value::from(true)),
            ]),
        ),
    ]
}

/// The BootstrapManifestsConfig of a control plane node with a Kubernetes
/// network (`cniName` only from v1.13).
fn bootstrap_manifests_config_item(facts: &ConfigFacts, v1_13_or_later: bool) -> Item {
    let server = match facts.kubeprism_port {
        Some(p) => format!("https://127.0.0.1:{p}"),
        None => "https://localhost:6443".to_string(),
    };
    let flannel = facts.cni_name == "flannel";
    let dns_ip = dns_service_ip(&facts.service_subnets);
    let spec = specs::BootstrapManifestsConfigSpec {
        server: server.clone(),
        cluster_domain: facts.dns_domain.clone(),
        pod_cid_rs: facts.pod_subnets.clone(),
        proxy_enabled: facts.proxy_enabled,
        proxy_image: facts.proxy_image.clone(),
        core_dns_enabled: facts.coredns_enabled,
        dns_service_ip: dns_ip.clone(),
        flannel_enabled: flannel,
        cni_name: if v1_13_or_later {
            facts.cni_name.clone()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let mut yaml = vec![
        ("string", Value::from(server.as_str())),
        ("clusterDomain", Value::from(facts.dns_domain.as_str())),
        ("podCIDRs", strings(&facts.pod_subnets)),
        ("proxyEnabled", Value::from(facts.proxy_enabled)),
        ("proxyImage", Value::from(facts.proxy_image.as_str())),
        ("proxyArgs", Value::Sequence(Vec::new())),
        ("coreDNSEnabled", Value::from(facts.coredns_enabled)),
        ("coreDNSImage", Value::from("")),
        ("dnsServiceIP", Value::from(dns_ip.as_str())),
        ("dnsServiceIPv6", Value::from("")),
        ("flannelEnabled", Value::from(flannel)),
        ("flannelImage", Value::from("")),
        ("flannelExtraArgs", Value::Sequence(Vec::new())),
        ("flannelKubeServiceHost", Value::from("")),
        ("flannelKubeServicePort", Value::from("")),
        ("podSecurityPolicyEnabled", Value::from(false)),
        ("talosAPIServiceEnabled", Value::from(false)),
    ];
    if v1_13_or_later {
        yaml.push(("cniName", Value::from(facts.cni_name.as_str())));
    }
    item(
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.namespace,
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.r#type,
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.id,
        spec.encode_to_vec(),
        map(yaml),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_follow_cosi_rules() {
        let def = definition("MachineConfigs.config.talos.dev").unwrap();
        let (short, all) = aliases(def);
        assert_eq!(short, vec!["machineconfig", "mc", "mcs"]);
        assert!(all.contains(&"machineconfigs".to_string()));
        assert!(all.contains(&"machineconfigs.config".to_string()));
        assert!(all.contains(&"machineconfigs.config.talos".to_string()));
        let def = definition("KubePrismConfigs.kubernetes.talos.dev").unwrap();
        let (short, _) = aliases(def);
        assert!(short.contains(&"kubeprismconfig".to_string()));
    }

    #[test]
    fn dns_service_ip_is_the_tenth_address() {
        assert_eq!(dns_service_ip(&["10.96.0.0/12".to_string()]), "10.96.0.10");
    }
}
