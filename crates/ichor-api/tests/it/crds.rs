//! The generated CRDs: the whole schema is snapshotted (their files' freshness
//! is checked with every generated file by ichor-dist's `stale` test).

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
            want("talosbackups.ichor.maesh.dev", "tb"),
        ]
    );
}
