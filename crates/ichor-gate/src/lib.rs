//! Health gates of Ichor's operations, decided purely (docs/adr/0020).
//!
//! Before an operation starts, before each batch and after each machine,
//! the controller reads the objects each `spec.healthChecks[]` entry
//! selects and what the built-in gates look at, and asks here: which gate
//! fails ([`first_failure`]), and whether the operation goes on, waits
//! within the check's timeout, or pauses ([`decide`]). CEL is read by
//! [`expr`]; the built-in gates are [`builtin`].

use ichor_api::operation::{HealthCheck, HealthGateStatus, SKIP_GATES_ANNOTATION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub mod builtin;
pub mod expr;

pub use expr::{CompileError, Expression};

/// A gate that failed: its name, the object, and the value found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFailure {
    pub check: String,
    pub object: Option<String>,
    pub value: Option<String>,
}

/// A spec check that cannot be read, naming it by its index and name.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("spec.healthChecks[{index}] ({name}): expression")]
    Expression {
        index: usize,
        name: String,
        #[source]
        source: CompileError,
    },
    #[error(
        "spec.healthChecks[{index}] ({name}): timeout {given:?} is not a duration such as 30s, 5m or 1h30m"
    )]
    Timeout {
        index: usize,
        name: String,
        given: String,
    },
    #[error("spec.healthChecks[{index}]: the name {name:?} is used twice")]
    DuplicateName { index: usize, name: String },
    #[error(
        "spec.healthChecks[{index}] ({name}): a health check may not read Secrets (the controller may read every Secret, and status would show what the expression found)"
    )]
    SecretTarget { index: usize, name: String },
}

/// Whether a target names core Secrets, which no check may read: the
/// controller's ServiceAccount may get any Secret (the secrets bundle lives
/// beside its cluster in any namespace), and a check's failing value, or
/// its verdict alone, would hand their contents to whoever may create a
/// TalosOperation.
pub fn reads_secrets(target: &ichor_api::operation::HealthCheckTarget) -> bool {
    target.api_version == "v1" && target.kind.eq_ignore_ascii_case("Secret")
}

/// A spec check, read: its expression compiled, its timeout in seconds.
#[derive(Debug)]
pub struct CompiledCheck {
    pub name: String,
    pub expression: Expression,
    pub timeout_secs: u64,
}

/// Reads every check of a spec; the first that cannot be read is the error.
/// The webhook refuses what this refuses; the controller reads the same.
pub fn compile_checks(checks: &[HealthCheck]) -> Result<Vec<CompiledCheck>, CheckError> {
    let mut out: Vec<CompiledCheck> = Vec::with_capacity(checks.len());
    for (index, c) in checks.iter().enumerate() {
        if out.iter().any(|o| o.name == c.name) {
            return Err(CheckError::DuplicateName {
                index,
                name: c.name.clone(),
            });
        }
        if reads_secrets(&c.target) {
            return Err(CheckError::SecretTarget {
                index,
                name: c.name.clone(),
            });
        }
        let expression =
            Expression::compile(&c.expression).map_err(|source| CheckError::Expression {
                index,
                name: c.name.clone(),
                source,
            })?;
        let timeout_secs = match c.timeout.as_deref() {
            None => 0,
            Some(t) => ichor_api::window::parse_duration(t)
                .map_err(|_| CheckError::Timeout {
                    index,
                    name: c.name.clone(),
                    given: t.to_string(),
                })?
                .as_secs(),
        };
        out.push(CompiledCheck {
            name: c.name.clone(),
            expression,
            timeout_secs,
        });
    }
    Ok(out)
}

/// The objects one check selected, each with the words naming it
/// (`Deployment web/api`).
pub type Selected<'a> = &'a [(String, serde_json::Value)];

/// A check on what its target selected: the first object the expression is
/// not `true` on. Selecting nothing fails too (`what` names the target):
/// a selector that matches no object is more likely a typo than a pass.
pub fn judge_check(
    check: &CompiledCheck,
    what: &str,
    objects: Selected<'_>,
) -> Option<GateFailure> {
    if objects.is_empty() {
        return Some(GateFailure {
            check: check.name.clone(),
            object: Some(what.to_string()),
            value: Some("no object selected".to_string()),
        });
    }
    objects.iter().find_map(|(name, o)| {
        check.expression.failing_value(o).map(|value| GateFailure {
            check: check.name.clone(),
            object: Some(name.clone()),
            value: Some(value),
        })
    })
}

/// The first failure of a list of gate results, in order (built-ins first,
/// then the spec's checks in spec order).
pub fn first_failure(
    results: impl IntoIterator<Item = Option<GateFailure>>,
) -> Option<GateFailure> {
    results.into_iter().flatten().next()
}

/// Whether a person set the skip annotation on the operation.
pub fn skipped(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    annotations.contains_key(SKIP_GATES_ANNOTATION)
}

/// What the operation does about its gates now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// Every gate passes (or gates are skipped): go on; `status.healthGate`
    /// is cleared.
    Go,
    /// A gate fails within its timeout: wait, the operation still Running.
    Wait(HealthGateStatus),
    /// A gate failed past its timeout: Paused.
    Pause(HealthGateStatus),
}

/// The decision from the failure found now, the one recorded before (its
/// `since` carries on while the same check fails), the failing check's
/// timeout and the clock. Built-in gates have no timeout: they pause at
/// once.
pub fn decide(
    previous: Option<&HealthGateStatus>,
    failure: Option<GateFailure>,
    timeout_secs: u64,
    skip: bool,
    now: &Time,
) -> GateDecision {
    let Some(f) = failure.filter(|_| !skip) else {
        return GateDecision::Go;
    };
    let since = previous
        .filter(|p| p.check == f.check)
        .and_then(|p| p.since.clone())
        .unwrap_or_else(|| now.clone());
    let elapsed = now.0.as_second().saturating_sub(since.0.as_second());
    let gate = HealthGateStatus {
        check: f.check,
        object: f.object,
        value: f.value,
        since: Some(since),
    };
    if elapsed >= i64::try_from(timeout_secs).unwrap_or(i64::MAX) {
        GateDecision::Pause(gate)
    } else {
        GateDecision::Wait(gate)
    }
}

/// The words of a paused (or waiting) operation's message.
pub fn gate_message(gate: &HealthGateStatus, paused: bool) -> String {
    let what = match (&gate.object, &gate.value) {
        (Some(o), Some(v)) => format!("{o}: {v}"),
        (Some(o), None) => o.clone(),
        (None, Some(v)) => v.clone(),
        (None, None) => String::new(),
    };
    if paused {
        format!(
            "paused: health check {} fails on {what}; no machine starts until it passes, or annotate the operation {SKIP_GATES_ANNOTATION}",
            gate.check
        )
    } else {
        format!(
            "health check {} fails on {what}; waiting for it within its timeout",
            gate.check
        )
    }
}

#[cfg(test)]
mod tests;
