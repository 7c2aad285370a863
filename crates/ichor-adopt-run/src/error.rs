//! Why adopt stopped.

use ichor_adopt::Refusal;

use crate::inspect::InspectError;

#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("{}", .0.iter().map(|r| r.message.as_str()).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<Refusal>),
    #[error("adopt was not confirmed; nothing was written")]
    NotConfirmed,
    #[error(transparent)]
    Inspect(#[from] Box<InspectError>),
    #[error("the secrets bundle: {0}")]
    Secrets(String),
    /// The CLI says whether running the command again helps.
    #[error("installing Cilium failed")]
    Cilium(#[from] Box<ichor_cilium::Error>),
    /// The CLI says whether running the command again helps.
    #[error("writing {what} failed")]
    Write {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Rendering Ichor's pinned Cilium chart for init's inline manifest.
    #[error("rendering Ichor's Cilium chart failed")]
    Render(#[source] ichor_helm::render::RenderError),
    /// A call to a node's Talos API (or making its client).
    #[error("{what} failed")]
    Talos {
        /// What was being done, naming the node.
        what: String,
        #[source]
        source: Box<ichor_talos_client::Error>,
    },
    #[error("{0}")]
    Wait(String),
    /// A private file (bundle, talosconfig, kubeconfig) or its directory.
    #[error(transparent)]
    File(#[from] ichor_talos::private_file::PrivateFileError),
}

impl From<InspectError> for AdoptError {
    fn from(e: InspectError) -> Self {
        AdoptError::Inspect(Box::new(e))
    }
}

impl From<ichor_cilium::Error> for AdoptError {
    fn from(e: ichor_cilium::Error) -> Self {
        AdoptError::Cilium(Box::new(e))
    }
}

/// A wait's end as adopt says it: a look that failed, as it failed; the
/// bound passed, as `timed_out` words what was still pending.
pub(crate) fn wait_ended(
    result: Result<(), ichor_helm::wait::WaitError<AdoptError>>,
    timed_out: impl FnOnce(&[String]) -> String,
) -> Result<(), AdoptError> {
    match result {
        Ok(()) => Ok(()),
        Err(ichor_helm::wait::WaitError::Check(e)) => Err(e),
        Err(ichor_helm::wait::WaitError::TimedOut { pending }) => {
            Err(AdoptError::Wait(timed_out(&pending)))
        }
    }
}

/// Maps a failed Talos API call (`what`, naming the node) to [`AdoptError::Talos`].
pub(crate) fn talos(
    what: impl Into<String>,
) -> impl FnOnce(ichor_talos_client::Error) -> AdoptError {
    let what = what.into();
    move |source| AdoptError::Talos {
        what,
        source: Box::new(source),
    }
}

/// Maps a failed request about `what` to [`AdoptError::Write`].
pub(crate) fn writing(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AdoptError {
    let what = what.into();
    move |source| AdoptError::Write { what, source }
}
