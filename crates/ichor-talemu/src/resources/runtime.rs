//! The `runtime` namespace: the Talos version, the machine's stage, its
//! disks and volumes, the services Talos runs (as the node's record says)
//! and the diagnostics (none: the lab has no warning to give).

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NodeView, item, map};
use crate::wire::specs as emulated;

/// `talosctl get volumestatus`.
const VOLUME_STATUS_TYPE: &str = "VolumeStatuses.block.talos.dev";
/// `talosctl get diagnostics` (what `talosctl health` checks for warnings).
const DIAGNOSTIC_TYPE: &str = "Diagnostics.runtime.talos.dev";
/// `talosctl get services`.
const SERVICE_TYPE: &str = "Services.v1alpha1.talos.dev";

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::VERSION.namespace,
        r#type: kinds::VERSION.r#type,
        display: "Version",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Name", "{.name}"), ("Version", "{.version}")],
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
        namespace: "runtime",
        r#type: VOLUME_STATUS_TYPE,
        display: "VolumeStatus",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Type", "{.type}"),
            ("Phase", "{.phase}"),
            ("Location", "{.location}"),
            ("Size", "{.prettySize}"),
        ],
    },
    Definition {
        namespace: "runtime",
        r#type: DIAGNOSTIC_TYPE,
        display: "Diagnostic",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Message", "{.message}")],
    },
    Definition {
        namespace: "runtime",
        r#type: SERVICE_TYPE,
        display: "Service",
        extra_aliases: &["svc"],
        sensitive: false,
        columns: &[
            ("Running", "{.running}"),
            ("Healthy", "{.healthy}"),
            ("Health Unknown", "{.unknown}"),
        ],
    },
];

/// The runtime resources of a node (in maintenance mode too, but its services).
pub(super) fn items(view: &NodeView<'_>) -> Vec<Item> {
    let mut items = vec![version_item(view), machine_status_item(view.stage)];
    items.extend(view.disks.iter().map(disk_item));
    if let Some(disk) = view.disks.first() {
        items.extend(volume_items(disk));
    }
    if view.active_config.is_some() {
        items.extend(view.journal.services().iter().map(service_item));
    }
    items
}

/// The system disk's volumes, every one ready.
fn volume_items(disk: &crate::node::Disk) -> Vec<Item> {
    crate::host::system_volumes(&disk.dev_path, disk.size)
        .into_iter()
        .map(|(label, index, location, size, fs, _mount)| {
            let filesystem = match fs {
                "xfs" => 1,
                "vfat" => 2,
                _ => 0,
            };
            let uuid = crate::host::digest(&format!("{}/{label}", disk.dev_path));
            let spec = emulated::VolumeStatusSpec {
                phase: 6,
                location: location.clone(),
                uuid: if fs.is_empty() {
                    String::new()
                } else {
                    uuid.clone()
                },
                partition_uuid: uuid,
                parent_location: disk.dev_path.clone(),
                partition_index: i64::from(index),
                size,
                filesystem,
                mount_location: location.clone(),
                pretty_size: pretty_size(size),
                r#type: 0,
                parent_id: String::new(),
            };
            let mut yaml = vec![
                ("phase", Value::from("ready")),
                ("type", Value::from("partition")),
                ("location", Value::from(location.as_str())),
                ("partitionIndex", Value::from(index)),
                ("parentLocation", Value::from(disk.dev_path.as_str())),
                ("size", Value::from(size)),
                ("prettySize", Value::from(spec.pretty_size.as_str())),
            ];
            if !fs.is_empty() {
                yaml.push(("filesystem", Value::from(fs)));
            }
            if !fs.is_empty() {
                yaml.push(("mountLocation", Value::from(location.as_str())));
            }
            item(
                "runtime",
                VOLUME_STATUS_TYPE,
                label,
                spec.encode_to_vec(),
                map(yaml),
            )
        })
        .collect()
}

/// A service as the Service resource shows it.
fn service_item(s: &crate::journal::ServiceEvents) -> Item {
    let health = crate::host::health(s);
    let running = s.state() == Some(crate::journal::ServiceState::Running);
    item(
        "runtime",
        SERVICE_TYPE,
        &s.id,
        emulated::ServiceSpec {
            running,
            healthy: health.healthy,
            unknown: health.unknown,
        }
        .encode_to_vec(),
        map(vec![
            ("running", Value::from(running)),
            ("healthy", Value::from(health.healthy)),
            ("unknown", Value::from(health.unknown)),
        ]),
    )
}

/// Sizes as Talos prints them (`humanize.Bytes`: powers of 1000, one decimal).
pub(super) fn pretty_size(bytes: u64) -> String {
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

fn machine_status_item(stage: i32) -> Item {
    let stage_name = match stage {
        3 => "maintenance",
        5 => "rebooting",
        6 => "shutting down",
        7 => "resetting",
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
