//! Which Kubernetes versions each Talos minor runs: Talos's published
//! support matrix and its compatibility packages
//! (`pkg/machinery/compatibility`), 1.10 and 1.11 included. One table for
//! every reader: the Kubernetes upgrade's refusal (the check `talosctl
//! upgrade-k8s` makes) and `ichor init`'s choice of a Kubernetes version.

use crate::version::Version;

/// A `major.minor` version.
pub type Minor = (u64, u64);

/// What one Talos minor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// The Talos minor.
    pub talos: Minor,
    /// The lowest Kubernetes minor it runs.
    pub lowest: Minor,
    /// The highest Kubernetes minor it runs (any patch of it).
    pub highest: Minor,
    /// The Kubernetes version `ichor init` writes configs for when none is
    /// given; `None` for a minor init does not write configs for.
    pub init_default: Option<&'static str>,
}

/// One row per Talos minor, oldest first.
pub const SUPPORT: &[Support] = &[
    Support {
        talos: (1, 10),
        lowest: (1, 28),
        highest: (1, 33),
        init_default: None,
    },
    Support {
        talos: (1, 11),
        lowest: (1, 29),
        highest: (1, 34),
        init_default: None,
    },
    Support {
        talos: (1, 12),
        lowest: (1, 30),
        highest: (1, 35),
        init_default: Some("v1.35.0"),
    },
    Support {
        talos: (1, 13),
        lowest: (1, 31),
        highest: (1, 36),
        init_default: Some("v1.36.0"),
    },
    Support {
        talos: (1, 14),
        lowest: (1, 32),
        highest: (1, 37),
        init_default: Some("v1.37.0"),
    },
];

/// The row of a Talos minor, `None` for one the table does not know.
pub fn of_minor(talos: Minor) -> Option<&'static Support> {
    SUPPORT.iter().find(|s| s.talos == talos)
}

/// The row of a Talos version's minor.
pub fn of(talos: &Version) -> Option<&'static Support> {
    of_minor(talos.major_minor())
}

impl Support {
    /// Whether this Talos minor runs Kubernetes minor `kubernetes`.
    pub fn runs(&self, kubernetes: Minor) -> bool {
        kubernetes >= self.lowest && kubernetes <= self.highest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// init writes configs for Talos 1.12–1.14: each has a default, and the
    /// default is a Kubernetes version that Talos minor runs.
    #[test]
    fn init_defaults_cover_1_12_to_1_14_and_lie_in_their_range() {
        for minor in [(1, 12), (1, 13), (1, 14)] {
            let row = of_minor(minor).unwrap();
            let default = Version::parse(row.init_default.unwrap()).unwrap();
            assert!(row.runs(default.major_minor()), "{minor:?}: {default}");
        }
        for row in SUPPORT {
            assert!(row.lowest <= row.highest, "{:?}", row.talos);
            if let Some(d) = row.init_default {
                assert!(row.runs(Version::parse(d).unwrap().major_minor()), "{d}");
            }
        }
        assert!(SUPPORT.windows(2).all(|w| w[0].talos < w[1].talos));
        assert_eq!(
            of(&Version::parse("v1.14.0-rc.1").unwrap()),
            of_minor((1, 14))
        );
        assert_eq!(of_minor((1, 15)), None);
    }
}
