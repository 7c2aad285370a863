//! Types generated from the project's own `.proto` files (`proto/`), written
//! from Talos's published API field numbers (docs/adr/0002-talos-api-client.md).
//! Module paths follow the protobuf packages, so the gRPC paths match Talos's
//! (`/machine.MachineService/Version`, `/cosi.resource.State/Get`, …).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod google {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

pub mod common {
    include!(concat!(env!("OUT_DIR"), "/common.rs"));
}

pub mod machine {
    include!(concat!(env!("OUT_DIR"), "/machine.rs"));
}

pub mod cosi {
    pub mod resource {
        include!(concat!(env!("OUT_DIR"), "/cosi.resource.rs"));

        pub mod meta {
            include!(concat!(env!("OUT_DIR"), "/cosi.resource.meta.rs"));
        }
    }
}

pub mod ichor {
    /// Spec messages of the Talos resources Ichor reads (Talos's published field numbers).
    pub mod specs {
        include!(concat!(env!("OUT_DIR"), "/ichor.specs.rs"));
    }
}
