//! The emulator must never be used by production code: no workspace crate
//! but the lab may list `ichor-talemu` under `[dependencies]` (tests use it
//! as a dev-dependency).

use std::path::PathBuf;

/// Crates allowed to depend on the emulator outside dev-dependencies.
const ALLOWED: &[&str] = &["ichor-lab", "ichor-talemu"];

#[test]
fn only_the_lab_depends_on_the_emulator() {
    let crates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut offenders = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        if ALLOWED.contains(&name.as_str()) {
            continue;
        }
        let mut section = String::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let production = section == "[dependencies]"
                || (section.starts_with("[target.") && section.ends_with(".dependencies]"));
            if production && line.starts_with("ichor-talemu") {
                offenders.push(name.clone());
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "production crates depend on the emulator ichor-talemu: {offenders:?}; use it as a dev-dependency"
    );
}
