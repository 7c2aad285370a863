//! A Talos or Kubernetes version as the two projects write them
//! (`v1.14.0`, `v1.35.0-rc.1`): one parser for every place that reads one.

use std::fmt;
use std::str::FromStr;

/// A release version: semantic versioning, written with or without its `v`
/// (shown with it). Ordered as semantic versioning orders releases.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(semver::Version);

/// A text that is no `vMAJOR.MINOR.PATCH[-PRE][+BUILD]` version.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not a version like v1.14.0")]
pub struct VersionError {
    pub text: String,
    #[source]
    pub source: semver::Error,
}

impl Version {
    /// Reads `v1.14.0` or `1.14.0` (surrounding spaces ignored).
    pub fn parse(text: &str) -> Result<Version, VersionError> {
        let trimmed = text.trim();
        let bare = trimmed.strip_prefix('v').unwrap_or(trimmed);
        semver::Version::parse(bare)
            .map(Version)
            .map_err(|source| VersionError {
                text: text.to_owned(),
                source,
            })
    }

    /// The release line: `(1, 14)` of `v1.14.2`.
    pub fn major_minor(&self) -> (u64, u64) {
        (self.0.major, self.0.minor)
    }

    /// The semantic version itself.
    pub fn semver(&self) -> &semver::Version {
        &self.0
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Version, VersionError> {
        Version::parse(text)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_reads_with_or_without_its_v_and_shows_with_it() {
        let v = Version::parse(" 1.14.0-rc.1 ").unwrap();
        assert_eq!(v.to_string(), "v1.14.0-rc.1");
        assert_eq!(v.major_minor(), (1, 14));
        assert_eq!(Version::parse("v1.14.0-rc.1").unwrap(), v);
        assert!(v < Version::parse("v1.14.0").unwrap());
        for bad in ["", "v", "1.14", "v1.14.x", "latest", "v01.2.3"] {
            let e = Version::parse(bad).unwrap_err();
            assert!(e.to_string().contains("is not a version"), "{e}");
        }
    }
}
