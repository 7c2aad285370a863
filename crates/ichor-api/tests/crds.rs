//! The generated CRDs: committed YAML is fresh, and the whole schema is snapshotted.

use std::path::PathBuf;

fn dist_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(ichor_api::crds::DIST_DIR)
}

/// The committed `dist/crds/*.yaml` equal what the types generate now.
#[test]
fn committed_crds_are_fresh() {
    let files = ichor_api::crds::files().expect("render CRDs");
    let mut stale = Vec::new();
    for f in &files {
        let path = dist_dir().join(&f.file_name);
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == f.yaml => {}
            Ok(_) => stale.push(format!("{} differs", path.display())),
            Err(e) => stale.push(format!("{} cannot be read ({e})", path.display())),
        }
    }
    let expected: Vec<&str> = files.iter().map(|f| f.file_name.as_str()).collect();
    if let Ok(entries) = std::fs::read_dir(dist_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !expected.contains(&name.as_str()) {
                stale.push(format!("{name} is no longer generated; delete it"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "dist/crds is stale: {}.\nRegenerate with `{}` and commit the result.",
        stale.join("; "),
        ichor_api::crds::REGENERATE_COMMAND
    );
}

/// The whole generated schema of every CRD, so any schema change is a visible diff.
#[test]
fn crd_schema_snapshot() {
    for f in ichor_api::crds::files().expect("render CRDs") {
        insta::assert_snapshot!(f.file_name.clone(), f.yaml);
    }
}

/// Names, scope and short names are what the docs promise.
#[test]
fn names_and_short_names() {
    let crds = ichor_api::crds::all();
    let names: Vec<(String, Vec<String>, String)> = crds
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.spec.names.short_names.clone().unwrap_or_default(),
                c.spec.scope.clone(),
            )
        })
        .collect();
    let want = |n: &str, s: &str| (n.to_owned(), vec![s.to_owned()], "Namespaced".to_owned());
    assert_eq!(
        names,
        vec![
            want("talosclusters.ichor.maesh.dev", "tc"),
            want("talosmachines.ichor.maesh.dev", "tm"),
            want("ichorinstallations.ichor.maesh.dev", "ichorinst"),
            want("talosoperations.ichor.maesh.dev", "talosop"),
        ]
    );
}
