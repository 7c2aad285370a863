//! Types and servers generated from the emulator's own `.proto` files
//! (`proto/`): the Talos APIs only a node answers, written from Talos's
//! published API field numbers. Module paths follow the protobuf packages,
//! so the gRPC paths match Talos's (`/machine.MachineService/ServiceList`,
//! `/time.TimeService/Time`), and etcd's own Maintenance service.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod machine {
    include!(concat!(env!("OUT_DIR"), "/machine.rs"));
}

pub mod time {
    include!(concat!(env!("OUT_DIR"), "/time.rs"));
}

/// etcd's Maintenance service, of which the emulator calls Snapshot on the lab's etcd.
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// Spec messages of the resources only the emulator serves.
pub mod specs {
    include!(concat!(env!("OUT_DIR"), "/talemu.specs.rs"));
}
