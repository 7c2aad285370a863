//! Compiles the emulator's own `.proto` files (the Talos APIs only a node
//! answers, written from Talos's published API field numbers) with a
//! vendored `protoc`, and the one etcd call the emulator makes itself (a
//! client of the lab's etcd). Messages shared with Ichor's client
//! (`common`) are ichor-talos-client's types.

// Cargo reads a build script's instructions from its stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .extern_path(".common", "::ichor_talos_client::proto::common")
        .extern_path(".google.rpc", "::ichor_talos_client::proto::google::rpc")
        .compile_with_config(
            config,
            &[
                "proto/machine/emulated.proto".into(),
                "proto/time/time.proto".into(),
                "proto/specs/emulated.proto".into(),
                "proto/etcd/rpc.proto".into(),
            ],
            &[
                std::path::PathBuf::from("proto"),
                // `common/common.proto`, as the client crate declares it.
                std::path::PathBuf::from("../ichor-talos-client/proto"),
                include,
            ],
        )?;
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=../ichor-talos-client/proto/common");
    Ok(())
}
