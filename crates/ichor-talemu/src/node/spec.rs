//! How an emulated node starts: its name, address, Talos version, config
//! and disks.

use std::net::IpAddr;

/// How an emulated node starts.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The node's hostname (CN and DNS SAN of its certificate; the hostname
    /// it reports unless its config sets one).
    pub hostname: String,
    /// The node's IP: the name `node` metadata uses to reach it and an IP SAN
    /// of its certificate. Any 127.0.0.0/8 address works on Linux.
    pub address: IpAddr,
    /// Port to listen on (0: any free port).
    pub port: u16,
    /// The Talos version it reports, e.g. `v1.13.9`. Also selects the
    /// ApplyConfiguration rules (v1.14+ never asks for a reboot).
    pub talos_version: String,
    /// The machine config; `None` starts the node in maintenance mode.
    pub config: Option<Vec<u8>>,
    /// Its block devices (`talosctl get disks`); one 10 GB virtio disk unless set.
    pub disks: Vec<Disk>,
}

/// A block device of an emulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// `/dev/sda`, `/dev/nvme0n1`, …
    pub dev_path: String,
    /// Bytes.
    pub size: u64,
    pub model: String,
    pub serial: String,
    /// `virtio`, `sata`, `nvme`, …
    pub transport: String,
    pub rotational: bool,
}

impl Disk {
    /// A non-rotational virtio disk.
    pub fn new(dev_path: impl Into<String>, size: u64) -> Self {
        Self {
            dev_path: dev_path.into(),
            size,
            model: "QEMU HARDDISK".to_string(),
            serial: String::new(),
            transport: "virtio".to_string(),
            rotational: false,
        }
    }
}

impl NodeSpec {
    /// A configured node on 127.0.0.1 (any port) running Talos v1.13.9.
    pub fn new(hostname: impl Into<String>, config: impl Into<Vec<u8>>) -> Self {
        Self {
            hostname: hostname.into(),
            address: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            talos_version: "v1.13.9".to_string(),
            config: Some(config.into()),
            disks: vec![Disk::new("/dev/vda", 10_737_418_240)],
        }
    }

    /// A node in maintenance mode (no config; insecure API).
    pub fn maintenance(hostname: impl Into<String>) -> Self {
        Self {
            config: None,
            ..Self::new(hostname, Vec::new())
        }
    }

    /// Another Talos version.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.talos_version = version.into();
        self
    }

    /// Another address (for several routable nodes: 127.0.0.2, 127.0.0.3, …).
    pub fn with_address(mut self, address: IpAddr) -> Self {
        self.address = address;
        self
    }

    /// Other block devices.
    pub fn with_disks(mut self, disks: Vec<Disk>) -> Self {
        self.disks = disks;
        self
    }

    /// A fixed port.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }
}
