//! The release workflow and `make release` agree with the release rules of
//! R4.5, R5.4 and R5.5. The workflow cannot run here; this keeps it honest.

use ichor_testenv::tools::repo_root;

/// Covers: R4.5, R5.4, R5.5, and the UI's release (the ichor-ui image and install-ui.yaml released)
///
/// On a `v*` tag the workflow runs `make release VERSION=<tag>` (the local
/// twin), pushes `bin/release/ichor-<tag without v>.tgz` to
/// `oci://ghcr.io/maeshinshin/charts` and may write packages; the Makefile's
/// release target packages with the version without its v and the
/// appVersion with it, and writes the CLI, the manifests (install.yaml and
/// the UI's install-ui.yaml), the chart and the controller and UI images
/// (OCI layouts, ADR 0012) to `bin/release/`; the workflow pushes
/// each layout with crane to the reference the chart carries and checks the
/// registry's digest against the one `make release` recorded for it.
#[test]
fn the_release_workflow_and_make_release_agree() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join(".github/workflows/release.yml")).unwrap();
    let wf: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("release.yml is YAML");
    let tags: Vec<&str> = wf["on"]["push"]["tags"]
        .as_sequence()
        .expect("triggered by tag pushes")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert_eq!(tags, ["v*"]);
    assert_eq!(wf["permissions"]["packages"], "write");
    let job = &wf["jobs"]["release"];
    assert_eq!(job["env"]["VERSION"], "${{ github.ref_name }}");
    assert_eq!(job["env"]["CHART_REPO"], "oci://ghcr.io/maeshinshin/charts");
    let runs: String = job["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(runs.contains("make release VERSION=\"$VERSION\""), "{runs}");
    assert!(
        runs.contains("helm push \"bin/release/ichor-${VERSION#v}.tgz\" \"$CHART_REPO\""),
        "{runs}"
    );
    // Both images (the controller's and the UI's), each checked
    // against its own line of digests.txt.
    assert!(
        runs.contains("for image in ichor-controller ichor-ui; do"),
        "{runs}"
    );
    assert!(
        runs.contains("crane push \"bin/release/$image\" \"ghcr.io/maeshinshin/$image:$VERSION\""),
        "{runs}"
    );
    assert!(
        runs.contains("grep \"^$image:\" bin/release/digests.txt | cut -d' ' -f2"),
        "{runs}"
    );
    for attached in [
        "bin/release/install-ui.yaml",
        "\"bin/release/ichor-ui-$VERSION.oci.tar\"",
    ] {
        assert!(
            runs.contains(attached),
            "{attached} is not attached: {runs}"
        );
    }
    assert!(runs.contains("bin/release/digests.txt"), "{runs}");
    assert!(
        !runs.contains("${{"),
        "no expression is spliced into a script: {runs}"
    );

    let make = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let release = make
        .split("\nrelease:\n")
        .nth(1)
        .expect("a release target")
        .split("\n\n")
        .next()
        .unwrap();
    for want in [
        "--version $(patsubst v%,%,$(VERSION)) --app-version $(VERSION)",
        "cp target/release/ichor $(RELEASE_DIR)/ichor",
        "--install-yaml $(RELEASE_DIR)/install.yaml",
        "--install-ui-yaml $(RELEASE_DIR)/install-ui.yaml",
        "$(IMAGEGEN) --version $(VERSION) --out $(RELEASE_DIR)",
    ] {
        assert!(
            release.contains(want),
            "make release lacks {want:?}:\n{release}"
        );
    }
    assert!(make.contains("RELEASE_DIR := bin/release"));
}
