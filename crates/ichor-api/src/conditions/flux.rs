//! The rules of Flux's condition checker (`fluxcd/pkg`, package
//! `runtime/conditions/check`, its ten FAIL checks), over an object's
//! generation, `status.observedGeneration` and conditions. Pure, so the
//! tests run them over every state of every kind.
//!
//! One reading differs, on purpose: work under way. Flux's controllers
//! write `Reconciling=True` with `Ready=Unknown` while they work and run
//! the checker on the result of a reconcile, where Reconciling=True comes
//! with `Ready=False` and a root observedGeneration behind the
//! Reconciling condition's (FAIL0003, FAIL0010). Ichor's work outlasts a
//! reconcile (an operation, a backup, a hand-over), so the in-flight form
//! is a state it keeps; [`ichor_violations`] leaves those two checks out
//! for that form only, and applies all ten to every other state.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{find, is_true, types};

/// Conditions whose True is abnormal (Flux's "negative polarity"): they are
/// never True on a Ready object. `Drifted` is not one: drift on a held
/// machine is what its owner asked for.
pub const NEGATIVE_POLARITY: &[&str] = &[types::RECONCILING, types::STALLED, types::WAITING];

/// A broken rule, with Flux's check ID in its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("FAIL0001: a negative polarity condition is True while Ready is True: {0:?}")]
    NegativeTrueWhileReady(Vec<String>),
    #[error("FAIL0002: there is no Ready condition")]
    NoReady,
    #[error("FAIL0003: Reconciling is True and Ready is not False")]
    ReconcilingNotFalse,
    #[error("FAIL0004: Stalled is True and Ready is not False")]
    StalledNotFalse,
    #[error("FAIL0005: Reconciling and Stalled are both present")]
    ReconcilingAndStalled,
    #[error("FAIL0006: status.observedGeneration {observed} is ahead of generation {generation}")]
    ObservedAhead { observed: i64, generation: i64 },
    #[error(
        "FAIL0007: Ready is True while status.observedGeneration {observed} is behind generation {generation}"
    )]
    ReadyWhileBehind { observed: i64, generation: i64 },
    #[error("FAIL0008: Ready is True while these conditions are behind the generation: {0:?}")]
    ReadyWithConditionsBehind(Vec<String>),
    #[error(
        "FAIL0009: Ready is True while these conditions' observedGeneration differs from status.observedGeneration: {0:?}"
    )]
    ReadyWithConditionsOff(Vec<String>),
    #[error(
        "FAIL0010: Reconciling is True while status.observedGeneration is not behind the Reconciling condition's"
    )]
    ReconcilingNotAhead,
}

/// Every rule of Flux's checker that `conditions` break, for an object at
/// `generation` whose status says `observed` (a missing number reads as 0,
/// as the checker's unstructured reads do).
pub fn violations(
    generation: Option<i64>,
    observed: Option<i64>,
    conditions: &[Condition],
) -> Vec<Violation> {
    let generation = generation.unwrap_or(0);
    let observed = observed.unwrap_or(0);
    let ready = find(conditions, types::READY);
    let is_ready = ready.is_some_and(|c| c.status == "True");
    let not_false =
        |type_: &str| is_true(conditions, type_) && ready.is_some_and(|c| c.status != "False");
    let names = |keep: &dyn Fn(&Condition) -> bool| -> Vec<String> {
        conditions
            .iter()
            .filter(|c| keep(c))
            .map(|c| c.type_.clone())
            .collect()
    };
    let condition_generation = |c: &Condition| c.observed_generation.unwrap_or(0);
    let mut found = Vec::new();
    if is_ready {
        let negative =
            names(&|c| NEGATIVE_POLARITY.contains(&c.type_.as_str()) && c.status == "True");
        if !negative.is_empty() {
            found.push(Violation::NegativeTrueWhileReady(negative));
        }
    }
    if ready.is_none() {
        found.push(Violation::NoReady);
    }
    if not_false(types::RECONCILING) {
        found.push(Violation::ReconcilingNotFalse);
    }
    if not_false(types::STALLED) {
        found.push(Violation::StalledNotFalse);
    }
    if find(conditions, types::RECONCILING).is_some() && find(conditions, types::STALLED).is_some()
    {
        found.push(Violation::ReconcilingAndStalled);
    }
    if observed > generation {
        found.push(Violation::ObservedAhead {
            observed,
            generation,
        });
    }
    if observed < generation && is_ready {
        found.push(Violation::ReadyWhileBehind {
            observed,
            generation,
        });
    }
    if is_ready {
        let behind = names(&|c| condition_generation(c) < generation);
        if !behind.is_empty() {
            found.push(Violation::ReadyWithConditionsBehind(behind));
        }
        let off = names(&|c| condition_generation(c) != observed);
        if !off.is_empty() {
            found.push(Violation::ReadyWithConditionsOff(off));
        }
    }
    if let Some(rec) = find(conditions, types::RECONCILING).filter(|c| c.status == "True")
        && observed >= condition_generation(rec)
    {
        found.push(Violation::ReconcilingNotAhead);
    }
    found
}

/// [`violations`] as Ichor reads them: the in-flight form
/// (`Reconciling=True` with `Ready=Unknown`) is exempt from FAIL0003 and
/// FAIL0010 (see the module's docs); every other state gets all ten.
pub fn ichor_violations(
    generation: Option<i64>,
    observed: Option<i64>,
    conditions: &[Condition],
) -> Vec<Violation> {
    let in_flight = is_true(conditions, types::RECONCILING)
        && find(conditions, types::READY).is_some_and(|c| c.status == "Unknown");
    violations(generation, observed, conditions)
        .into_iter()
        .filter(|v| {
            !(in_flight
                && matches!(
                    v,
                    Violation::ReconcilingNotFalse | Violation::ReconcilingNotAhead
                ))
        })
        .collect()
}
