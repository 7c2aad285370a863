//! Writes Ichor's CRDs to `dist/crds/` (one file per CRD), from the types in
//! ichor-api. Run from anywhere in the workspace:
//! `cargo run -p ichor-api --bin crdgen` (or pass another output folder).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = match std::env::args_os().nth(1) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(ichor_api::crds::DIST_DIR),
    };
    let files = match ichor_api::crds::files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("crdgen: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for f in files {
        let path = dir.join(&f.file_name);
        if let Err(e) = std::fs::write(&path, &f.yaml) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
