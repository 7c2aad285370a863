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
    #[error(
        "installing Cilium: {0}. Run ichor adopt again to continue: it picks up the release where it stopped"
    )]
    Cilium(#[from] Box<ichor_cilium::Error>),
    #[error("writing {what}: {source}. Run ichor adopt again to continue")]
    Write {
        what: String,
        #[source]
        source: kube::Error,
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

/// Maps a failed request about `what` to [`AdoptError::Write`].
pub(crate) fn writing(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AdoptError {
    let what = what.into();
    move |source| AdoptError::Write { what, source }
}
