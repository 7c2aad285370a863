//! The generated distribution files match the Rust sources. When this fails,
//! run the command it names and commit the result.

use ichor_testenv::tools::repo_root;

/// Covers: R4.1, R4.5
///
/// `dist/crds/`, `dist/install.yaml` and the chart's generated templates
/// (CRDs, RBAC rules, Cilium policies, webhooks) are exactly what `distgen`
/// writes today: the one freshness check of every generated file.
#[test]
fn generated_dist_files_are_up_to_date() {
    let root = repo_root();
    let mut stale = Vec::new();
    let files = ichor_dist::repo_files().expect("the distribution files generate");
    for f in &files {
        let on_disk = std::fs::read_to_string(root.join(&f.path)).unwrap_or_default();
        if on_disk != f.text {
            stale.push(f.path.display().to_string());
        }
    }
    // A CRD file with no CRD behind it is stale too.
    let chart_crds = std::path::Path::new(ichor_dist::CHART_DIR).join("templates/crd");
    for dir in [
        chart_crds.as_path(),
        std::path::Path::new(ichor_api::crds::DIST_DIR),
    ] {
        for entry in std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{} cannot be read: {e}", dir.display()))
            .flatten()
        {
            let rel = dir.join(entry.file_name());
            if !files.iter().any(|f| f.path == rel) {
                stale.push(format!("{} (no such CRD)", rel.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "these generated files are stale: {}. Run `{}` and commit the result",
        stale.join(", "),
        ichor_dist::REGENERATE_COMMAND
    );
}

/// Covers: R4.1
///
/// The chart's CRDs are the same objects as `dist/crds/` and the install
/// manifest: one source (ichor-api's types).
#[test]
fn the_chart_crds_are_the_api_crds() {
    let crds = ichor_api::crds::all();
    let chart = ichor_dist::chart_crds().unwrap();
    assert_eq!(chart.len(), crds.len());
    for (file, crd) in chart.iter().zip(&crds) {
        let name = crd.metadata.name.clone().unwrap();
        assert!(
            file.path.ends_with(format!("{name}.yaml")),
            "{}",
            file.path.display()
        );
        let spec_yaml = serde_yaml_ng::to_string(&serde_json::json!({"spec": crd.spec})).unwrap();
        assert!(
            file.text.ends_with(&spec_yaml),
            "the template of {name} carries the type's spec verbatim"
        );
        assert!(file.text.contains("helm.sh/resource-policy: keep"));
    }
}
