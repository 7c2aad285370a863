//! What the UI image holds, as a pure recipe: the same `ichor` binary as the
//! controller image (the chart runs it as `ichor ui`), its shared libraries
//! and CA certificates, a non-root user and no shell — and no helm and no
//! chart, which the UI never runs.

use crate::controller::{BASE_LAYER, CA_PATH, ICHOR_PATH, Inputs, UID, base_layer, oci_labels};
use crate::image::ImageSpec;
use crate::layer::FileTree;

/// The UI image's repository name (the chart's `ichorUI.image.repository`).
pub const NAME: &str = "ichor-ui";

/// The image recipe: two layers (base, ichor). The base layer is the
/// controller image's, byte for byte, so a registry stores it once.
pub fn image(inputs: &Inputs) -> ImageSpec {
    let mut app = FileTree::new();
    app.file(ICHOR_PATH, inputs.ichor.clone(), 0o755);
    let labels = oci_labels(
        inputs,
        NAME,
        "Ichor's web UI: the ichor binary, run as `ichor ui`",
    );
    ImageSpec {
        name: NAME.to_string(),
        tag: inputs.version.clone(),
        layers: vec![
            (BASE_LAYER.to_string(), base_layer(inputs)),
            ("ichor".to_string(), app),
        ],
        entrypoint: vec![ICHOR_PATH.to_string()],
        env: vec![
            "PATH=/usr/local/bin".to_string(),
            format!("SSL_CERT_FILE={CA_PATH}"),
            // The only writable place under a read-only root file system.
            "HOME=/tmp".to_string(),
        ],
        user: format!("{UID}:{UID}"),
        working_dir: "/".to_string(),
        labels,
        created: inputs.created,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::chart_path;

    fn inputs() -> Inputs {
        crate::controller::tests::inputs(Ok(crate::controller::Chart {
            version: "1.18.5".into(),
            archive: b"tgz".to_vec(),
        }))
    }

    #[test]
    fn the_ui_image_has_ichor_and_no_helm_chart_or_shell() {
        let spec = image(&inputs());
        let paths: Vec<&str> = spec.layers.iter().flat_map(|(_, t)| t.paths()).collect();
        assert!(paths.contains(&"usr/local/bin/ichor"));
        assert!(paths.contains(&"etc/passwd"));
        assert!(!paths.contains(&"usr/local/bin/helm"));
        let chart = chart_path("1.18.5");
        assert!(!paths.contains(&chart.trim_start_matches('/')));
        assert!(
            !paths
                .iter()
                .any(|p| p.ends_with("bin/sh") || p.ends_with("bash"))
        );
        assert_eq!(spec.name, "ichor-ui");
        assert_eq!(spec.user, "65532:65532");
        assert_eq!(spec.entrypoint, ["/usr/local/bin/ichor"]);
        assert!(!spec.env.iter().any(|e| e.starts_with("ICHOR_HELM=")));
    }

    #[test]
    fn the_ui_image_shares_the_controller_images_base_layer() {
        let ui = image(&inputs());
        let controller = crate::controller::image(&inputs());
        assert_eq!(
            ui.layers[0].1.paths().collect::<Vec<_>>(),
            controller.layers[0].1.paths().collect::<Vec<_>>()
        );
        let ui = crate::build(&ui).unwrap();
        let controller = crate::build(&controller).unwrap();
        assert_eq!(ui.layers[0].digest, controller.layers[0].digest);
        assert_ne!(ui.digest(), controller.digest());
    }
}
