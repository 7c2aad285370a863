//! Versions as the decisions read them, through the one parser
//! ([`ichor_talos::version::Version`]): a text that is no release version
//! (`v1.37`, `v01.2.3`, `latest`) reads as none.

use ichor_talos::version::Version;

/// The version, or `None` when the text is no release version.
pub fn parse(version: &str) -> Option<Version> {
    Version::parse(version).ok()
}

/// (major, minor, patch) of `v1.37.0` / `1.37.0-rc.1`: the release a
/// version is of, its pre-release ignored (the decisions compare releases
/// and minors, as `talosctl` does).
pub fn release(version: &str) -> Option<(u64, u64, u64)> {
    parse(version).map(|v| {
        let s = v.semver();
        (s.major, s.minor, s.patch)
    })
}

/// The release line (`(1, 14)` of `v1.14.2`).
pub fn release_line(version: &str) -> Option<(u64, u64)> {
    parse(version).map(|v| v.major_minor())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What `operation::semver` read before the one parser: the numbers of
    /// the core, a missing patch read as 0, the pre-release dropped.
    fn old_release(version: &str) -> Option<(u64, u64, u64)> {
        let v = version.trim().trim_start_matches('v');
        let core = v.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        Some((major, minor, patch))
    }

    /// What the step's `legacy` check read before (its `parse_minor`).
    fn old_release_line(v: &str) -> Option<(u64, u64)> {
        let v = v.strip_prefix('v').unwrap_or(v);
        let mut parts = v.split(['.', '-']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }

    /// What kind ichor's refusal and downgrade note read before.
    fn old_semver(v: &str) -> Option<semver::Version> {
        semver::Version::parse(v.trim_start_matches('v')).ok()
    }

    /// A release version as Talos, Kubernetes and Ichor write them.
    fn valid() -> impl Strategy<Value = String> {
        (
            prop_oneof![Just(""), Just("v"), Just(" v")],
            0u64..3,
            0u64..40,
            0u64..20,
            prop::option::of(prop_oneof![
                Just("rc.1".to_string()),
                Just("alpha.0".to_string()),
                Just("beta".to_string()),
                "(alpha|beta|rc)\\.[1-9][0-9]{0,2}",
                "[a-z][a-z0-9-]{0,6}",
            ]),
            prop::option::of("[a-z0-9]{1,6}"),
        )
            .prop_map(|(v, major, minor, patch, pre, build)| {
                let mut s = format!("{v}{major}.{minor}.{patch}");
                if let Some(pre) = pre {
                    s = format!("{s}-{pre}");
                }
                if let Some(build) = build {
                    s = format!("{s}+{build}");
                }
                s.trim_end().to_string()
            })
    }

    /// Anything near a version: short cores, leading zeros, doubled v,
    /// empty pre-releases, words.
    fn near() -> impl Strategy<Value = String> {
        prop_oneof![
            valid(),
            "[v ]{0,2}[0-9.]{0,9}(-[0-9a-z.]{0,6})?(\\+[0-9a-z.+]{0,4})?",
            "v?[0-9]{1,3}(\\.[0-9]{1,3}){0,4}",
            any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A release version reads as before.
        #[test]
        fn a_release_version_reads_as_it_did(v in valid()) {
            prop_assert!(release(&v).is_some(), "{v:?}");
            prop_assert_eq!(release(&v), old_release(&v), "{:?}", v);
            prop_assert_eq!(release_line(&v), old_release_line(v.trim()), "{:?}", v);
            prop_assert_eq!(
                parse(&v).map(|p| p.semver().clone()),
                old_semver(v.trim()),
                "{:?}", v
            );
        }

        /// Any text: what the one parser reads, the old readings read the
        /// same; what only they read is no release version (`v1.37`,
        /// `v01.2.3`, `vv1.2.3`, `1.2.3.4`, an empty pre-release), which the
        /// one parser refuses.
        #[test]
        fn the_one_parser_reads_nothing_the_old_ones_read_otherwise(v in near()) {
            if let Some(r) = release(&v) {
                prop_assert_eq!(Some(r), old_release(&v), "{:?}", v);
                prop_assert_eq!(release_line(&v), Some((r.0, r.1)));
                prop_assert_eq!(old_release_line(v.trim()), Some((r.0, r.1)), "{:?}", v);
            }
            if let Some(p) = parse(&v) && v.trim() == v && !v.starts_with("vv") {
                prop_assert_eq!(Some(p.semver().clone()), old_semver(&v), "{:?}", v);
            }
            if old_semver(&v).is_some() && !v.starts_with("vv") {
                prop_assert!(parse(&v).is_some(), "{:?}", v);
            }
        }
    }

    /// The texts only the old readings took.
    #[test]
    fn texts_that_are_no_release_version_read_as_none() {
        for v in ["v1.37", "v01.2.3", "vv1.2.3", "1.2.3.4", "v1.2.3-", "v1.2"] {
            assert_eq!(release(v), None, "{v}");
            assert_eq!(release_line(v), None, "{v}");
        }
        assert_eq!(release(" v1.37.0-rc.1 "), Some((1, 37, 0)));
        assert_eq!(release_line("v1.12.1"), Some((1, 12)));
    }
}
