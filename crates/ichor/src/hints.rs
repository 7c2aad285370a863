//! What can help, for the errors where rerunning the command cannot: the
//! setting or step the operator must change first. See docs/STYLE.md.

use ichor_helm::render::RenderError;

/// The environment variable that points Ichor at the `helm` binary
/// (the `--helm` flag reads it).
pub const HELM_ENV: &str = "ICHOR_HELM";

/// The `helm` binary Ichor could not run, anywhere in the error's chain.
pub fn missing_helm(e: &anyhow::Error) -> Option<String> {
    e.chain()
        .find_map(|cause| match cause.downcast_ref::<RenderError>() {
            Some(RenderError::Spawn { helm, .. }) => Some(helm.display().to_string()),
            _ => None,
        })
}

/// A line that says what can help with `e`, where Ichor knows one.
pub fn help_for(e: &anyhow::Error) -> Option<String> {
    missing_helm(e).map(|helm| {
        format!(
            "Ichor runs helm from --helm or {HELM_ENV} (now {helm}); install helm v3.17+ or v4, or set {HELM_ENV} to the path of one. Running the command again does not help until then"
        )
    })
}
