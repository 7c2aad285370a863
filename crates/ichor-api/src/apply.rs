//! How Ichor applies a class B change to a node: in Talos's no-reboot mode
//! (the default), or in its `TRY` mode, confirmed only once the node's
//! health checks pass (docs/adr/0022-config-history.md, "Try-mode applies").

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How Ichor applies class B changes to a node: noReboot (the default), or
/// try (Talos reverts the change after `tryTimeout` unless Ichor confirms it
/// once the node's health checks pass). A machine's `applyMode` wins over
/// its cluster's.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ApplyMode {
    /// Talos's `NO_REBOOT`: the change is kept at once.
    #[default]
    NoReboot,
    /// Talos's `TRY`: the node puts its previous config back after
    /// `tryTimeout` unless Ichor confirms the change, which it does (with a
    /// no-reboot apply of the same config) only when the node's health
    /// checks pass.
    Try,
}

/// The timeout of a try-mode apply when none is set (Talos's own default).
pub const DEFAULT_TRY_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest try-mode timeout: the change runs unconfirmed that long.
pub const MAX_TRY_TIMEOUT: Duration = Duration::from_secs(600);

/// The CEL rule of a `tryTimeout` field (a Go duration in whole seconds or
/// minutes, from 1s to [`MAX_TRY_TIMEOUT`]).
pub const TRY_TIMEOUT_RULE: &str = "self.matches('^([0-9]+m)?([0-9]+s)?$') && self != '' && duration(self) >= duration('1s') && duration(self) <= duration('10m')";

/// The mode and timeout that hold for one machine: the machine's setting,
/// else its cluster's, else the defaults. A timeout that cannot be read
/// (the CRD's rule refuses those) is the default; one too long is the bound.
pub fn effective(
    machine_mode: Option<ApplyMode>,
    machine_timeout: Option<&str>,
    cluster_mode: Option<ApplyMode>,
    cluster_timeout: Option<&str>,
) -> (ApplyMode, Duration) {
    let mode = machine_mode.or(cluster_mode).unwrap_or_default();
    let timeout = machine_timeout
        .or(cluster_timeout)
        .and_then(|t| crate::window::parse_duration(t).ok())
        .unwrap_or(DEFAULT_TRY_TIMEOUT)
        .min(MAX_TRY_TIMEOUT);
    (mode, timeout)
}

/// Where a try-mode apply stands.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TryPhase {
    /// Applied in `TRY` mode; Ichor checks the node's health until it
    /// confirms the change or Talos puts the previous config back.
    Trying,
    /// The checks did not pass and Talos put the previous config back: the
    /// machine is held (`Held=True`, reason TryReverted) until its spec
    /// changes or its render gives another config.
    Reverted,
}

/// A try-mode apply in flight, or the one whose revert holds the machine.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TryApply {
    pub phase: TryPhase,
    /// The revision the apply recorded.
    pub revision: u64,
    /// The hash of the config tried.
    pub config_hash: String,
    /// The TalosMachine's generation it was rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_generation: Option<i64>,
    /// When the `TRY` apply was sent.
    pub started: Time,
    /// When the node puts its previous config back unless confirmed.
    pub reverts_at: Time,
    /// What the health checks saw last (why the change was not confirmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_setting_wins_over_the_cluster_one() {
        assert_eq!(
            effective(None, None, None, None),
            (ApplyMode::NoReboot, DEFAULT_TRY_TIMEOUT)
        );
        assert_eq!(
            effective(None, None, Some(ApplyMode::Try), Some("30s")),
            (ApplyMode::Try, Duration::from_secs(30))
        );
        assert_eq!(
            effective(
                Some(ApplyMode::NoReboot),
                Some("5s"),
                Some(ApplyMode::Try),
                Some("30s")
            ),
            (ApplyMode::NoReboot, Duration::from_secs(5))
        );
        assert_eq!(
            effective(Some(ApplyMode::Try), Some("1h"), None, None).1,
            MAX_TRY_TIMEOUT
        );
        assert_eq!(
            effective(Some(ApplyMode::Try), Some("soon"), None, None).1,
            DEFAULT_TRY_TIMEOUT
        );
    }
}
