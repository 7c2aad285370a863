//! What can help: the setting or step that changes the outcome, said once
//! after the causes (docs/STYLE.md). An error type that knows one has a
//! `help()` method; this module knows those types and finds the first help
//! in an error's chain.

use std::error::Error;

use ichor_api::error_text::first_help;
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
    if let Some(helm) = missing_helm(e) {
        // The CLI's flag and setting, which ichor-helm does not know.
        return Some(format!(
            "Ichor runs helm from --helm or {HELM_ENV} (now {helm}); install helm v3.17+ or v4, or set {HELM_ENV} to the path of one. Running the command again does not help until then"
        ));
    }
    first_help(e.as_ref(), help_of)
}

/// The help of one cause, if it is of a type that has a `help()`. A new
/// type with a `help()` is added here.
fn help_of(cause: &(dyn Error + 'static)) -> Option<String> {
    use ichor_talos::talosconfig::TalosconfigError;
    use ichor_talos::{config::ConfigError, patch::PatchError, secrets::SecretsError};
    // Each: `None` when the cause is not of its type, else its help.
    type HelpOf = fn(&(dyn Error + 'static)) -> Option<Option<String>>;
    let helps: [HelpOf; 11] = [
        |c| c.downcast_ref::<RenderError>().map(RenderError::help),
        |c| c.downcast_ref::<kube::Error>().map(webhook_unavailable),
        |c| {
            c.downcast_ref::<ichor_helm::Error>()
                .map(ichor_helm::Error::help)
        },
        |c| {
            c.downcast_ref::<ichor_cilium::Error>()
                .map(ichor_cilium::Error::help)
        },
        |c| {
            c.downcast_ref::<ichor_controller::Error>()
                .map(ichor_controller::Error::help)
        },
        |c| {
            c.downcast_ref::<ichor_backup::restore::RestoreError>()
                .map(crate::cmd::recover::help)
        },
        |c| {
            c.downcast_ref::<ichor_backup::store::StoreError>()
                .map(ichor_backup::store::StoreError::help)
        },
        |c| c.downcast_ref::<ConfigError>().map(ConfigError::help),
        |c| c.downcast_ref::<PatchError>().map(PatchError::help),
        |c| c.downcast_ref::<SecretsError>().map(SecretsError::help),
        |c| {
            c.downcast_ref::<TalosconfigError>()
                .map(TalosconfigError::help)
        },
    ];
    helps.iter().find_map(|help| help(cause)).flatten()
}

/// The help for a write the API server refused because Ichor's own
/// admission webhook did not answer: its pod is not Ready (for one, while
/// a drain moves it), and nothing is wrong with the request.
fn webhook_unavailable(e: &kube::Error) -> Option<String> {
    let kube::Error::Api(status) = e else {
        return None;
    };
    let ours = status.message.contains("failed calling webhook")
        && status.message.contains(".ichor.maesh.dev");
    ours.then(|| {
        "Ichor's admission webhook did not answer, so the API server refused the change; it answers once the controller's pod in ichor-system is Ready again (`kubectl -n ichor-system get pods`). Run the command again then".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> anyhow::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 500, "reason": "InternalError", "message": message,
        }))
        .expect("a Status");
        anyhow::Error::new(kube::Error::Api(Box::new(status))).context("cancel operation up")
    }

    #[test]
    fn a_refusal_by_ichors_unanswered_webhook_says_to_wait_for_the_controller() {
        let e = refused(
            "Internal error occurred: failed calling webhook \"talosoperation.ichor.maesh.dev\": failed to call webhook: no endpoints available for service \"ichor-webhook\"",
        );
        let help = help_for(&e).expect("a help");
        assert!(help.contains("ichor-system"), "{help}");
    }

    #[test]
    fn another_webhooks_failure_or_another_error_gets_no_such_help() {
        let other = refused(
            "Internal error occurred: failed calling webhook \"validate.kyverno.svc\": no endpoints",
        );
        assert_eq!(help_for(&other), None);
        assert_eq!(help_for(&refused("etcdserver: request timed out")), None);
    }
}
