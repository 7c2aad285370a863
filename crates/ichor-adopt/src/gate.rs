//! R2.1a: whether Ichor's Cilium network policies are applied is decided
//! once, here, and nothing else may veto it.

use ichor_api::DetectedCni;
use serde::Serialize;

/// The gate's answer, with the input that failed when it says no.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyGate {
    pub include: bool,
    /// Why not, in the words adopt prints (R2.1b).
    pub reason: Option<String>,
}

/// The policies are applied when the detected CNI is Cilium and the
/// CiliumNetworkPolicy CRD is Established — whatever the preset (R2.1a).
pub fn include_cilium_policies(detected: DetectedCni, crd_established: bool) -> PolicyGate {
    let reason = if detected != DetectedCni::Cilium {
        Some(format!("detected CNI is {}", detected_name(detected)))
    } else if !crd_established {
        Some("the CiliumNetworkPolicy CRD is not Established".to_string())
    } else {
        None
    };
    PolicyGate {
        include: reason.is_none(),
        reason,
    }
}

fn detected_name(d: DetectedCni) -> &'static str {
    match d {
        DetectedCni::None => "none",
        DetectedCni::Cilium => "cilium",
        DetectedCni::Flannel => "flannel",
        DetectedCni::Calico => "calico",
        DetectedCni::Other => "other",
        DetectedCni::Mixed => "mixed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R2.1a, R2.1c
    #[test]
    fn cilium_with_its_crd_includes_the_policies_whatever_the_preset() {
        // The gate has no preset input at all: unmanaged-on-Cilium, takeover and
        // the no-CNI path (evaluated after the Cilium step) all get the policies.
        assert_eq!(
            include_cilium_policies(DetectedCni::Cilium, true),
            PolicyGate {
                include: true,
                reason: None
            }
        );
    }

    /// Covers: R2.1b, R2.1c
    #[test]
    fn flannel_and_calico_do_not_and_say_which_input_failed() {
        let g = include_cilium_policies(DetectedCni::Calico, true);
        assert!(!g.include);
        assert_eq!(g.reason.as_deref(), Some("detected CNI is calico"));
        let g = include_cilium_policies(DetectedCni::Flannel, true);
        assert_eq!(g.reason.as_deref(), Some("detected CNI is flannel"));
    }

    /// Covers: R2.1b
    #[test]
    fn cilium_without_an_established_crd_does_not() {
        let g = include_cilium_policies(DetectedCni::Cilium, false);
        assert!(!g.include);
        assert_eq!(
            g.reason.as_deref(),
            Some("the CiliumNetworkPolicy CRD is not Established")
        );
    }

    /// Covers: R2.1c
    #[test]
    fn before_the_cilium_step_a_no_cni_cluster_gets_no_policies() {
        assert!(!include_cilium_policies(DetectedCni::None, false).include);
    }
}
