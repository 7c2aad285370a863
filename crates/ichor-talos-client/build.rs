//! Compiles the project's own `.proto` files (written from Talos's published
//! API field numbers; see docs/adr/0002-talos-api-client.md) with a vendored
//! `protoc`.

// Cargo reads a build script's instructions from its stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    // `set_var("PROTOC")` is unsafe in edition 2024: hand the path to the config instead.
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_server(server)
        .build_client(true)
        .compile_with_config(
            config,
            &[
                "proto/google/rpc/status.proto".into(),
                "proto/common/common.proto".into(),
                "proto/machine/machine.proto".into(),
                "proto/machine/lifecycle.proto".into(),
                "proto/machine/image.proto".into(),
                "proto/cosi/resource.proto".into(),
                "proto/cosi/state.proto".into(),
                "proto/cosi/meta.proto".into(),
                "proto/specs/specs.proto".into(),
            ],
            &[std::path::PathBuf::from("proto"), include],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
