//! Which Kubernetes versions each Talos minor runs: the check `talosctl
//! upgrade-k8s` makes on every node before it changes anything, against
//! the one support table (`ichor_talos::support`). Pure: the plan reads
//! each node's Talos version and asks [`refusal`].

use ichor_talos::support::{self, Minor, SUPPORT};

use super::semver;

/// Why Talos `talos` cannot run Kubernetes `kubernetes`, or `None` when it
/// can. A Talos minor outside the table is refused too: Ichor cannot tell
/// what it runs, and a node that cannot start the new components is an
/// upgrade half done.
pub fn unsupported(talos: &str, kubernetes: &str) -> Option<String> {
    let Some((tmaj, tmin, _)) = semver(talos) else {
        return Some(format!("its Talos version {talos:?} cannot be read"));
    };
    let Some((kmaj, kmin, _)) = semver(kubernetes) else {
        return Some(format!("the target {kubernetes:?} is not a version"));
    };
    let Some(row) = support::of_minor((tmaj, tmin)) else {
        return Some(format!(
            "Ichor does not know which Kubernetes versions Talos {tmaj}.{tmin} runs (it knows Talos {}–{})",
            minor(SUPPORT[0].talos),
            minor(SUPPORT[SUPPORT.len() - 1].talos)
        ));
    };
    if !row.runs((kmaj, kmin)) {
        return Some(format!(
            "Talos {tmaj}.{tmin} runs Kubernetes {} to {}.x, not {kmaj}.{kmin}",
            minor(row.lowest),
            minor(row.highest)
        ));
    }
    None
}

fn minor((major, minor): Minor) -> String {
    format!("{major}.{minor}")
}

/// The plan-time refusal: every machine that will run the new version
/// (`(machine, talos version)`) must run it on its Talos. Names each that
/// cannot, with its version and why.
pub fn refusal(kubernetes: &str, machines: &[(String, String)]) -> Option<String> {
    let not: Vec<String> = machines
        .iter()
        .filter_map(|(m, talos)| {
            unsupported(talos, kubernetes)
                .map(|why| format!("TalosMachine {m} (Talos {talos}): {why}"))
        })
        .collect();
    (!not.is_empty()).then(|| {
        format!(
            "Kubernetes {kubernetes} does not run on the Talos of every machine it would reach: {}; upgrade Talos on them first (a TalosOperation of kind talos-upgrade), then create this operation again",
            not.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: kubernetes-upgrade, ADR 0014 (each node's Talos supports the target), the edges of every row
    #[test]
    fn every_row_of_the_matrix_at_its_edges() {
        for row in SUPPORT {
            let ((tmaj, tmin), (lmaj, lmin), (hmaj, hmin)) = (row.talos, row.lowest, row.highest);
            let talos = format!("v{tmaj}.{tmin}.3");
            assert_eq!(unsupported(&talos, &format!("v{lmaj}.{lmin}.0")), None);
            assert_eq!(unsupported(&talos, &format!("{hmaj}.{hmin}.99")), None);
            let below = unsupported(&talos, &format!("{lmaj}.{}.9", lmin - 1)).unwrap();
            assert!(
                below.contains(&format!(
                    "Talos {tmaj}.{tmin} runs Kubernetes {lmaj}.{lmin} to {hmaj}.{hmin}.x"
                )),
                "{below}"
            );
            assert!(unsupported(&talos, &format!("{hmaj}.{}.0", hmin + 1)).is_some());
        }
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (the support table's rows, as numbers)
    #[test]
    fn the_rows_the_facts_name() {
        assert_eq!(unsupported("v1.14.0", "1.37.0"), None);
        assert_eq!(unsupported("v1.14.0-rc.1", "v1.32.4"), None);
        assert!(unsupported("v1.13.9", "1.37.0").is_some());
        assert_eq!(unsupported("v1.13.9", "1.36.2"), None);
        assert!(unsupported("v1.12.1", "1.36.0").is_some());
        assert!(unsupported("v1.14.0", "1.31.9").is_some());
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (an unknown Talos or an unreadable version is refused, said so)
    #[test]
    fn unknown_talos_minors_are_refused() {
        let why = unsupported("v1.15.0", "1.37.0").unwrap();
        assert!(
            why.contains("Talos 1.15") && why.contains("1.10–1.14"),
            "{why}"
        );
        assert!(unsupported("v1.9.5", "1.30.0").is_some());
        assert!(
            unsupported("", "1.30.0")
                .unwrap()
                .contains("cannot be read")
        );
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (the refusal names each machine and its Talos version)
    #[test]
    fn the_refusal_names_the_machine_and_its_talos() {
        let machines = vec![
            ("cp-1".to_string(), "v1.14.0".to_string()),
            ("w-1".to_string(), "v1.13.9".to_string()),
            ("w-2".to_string(), "v1.12.0".to_string()),
        ];
        let m = refusal("1.37.0", &machines).unwrap();
        assert!(
            m.contains("TalosMachine w-1 (Talos v1.13.9): Talos 1.13 runs Kubernetes 1.31 to 1.36.x, not 1.37"),
            "{m}"
        );
        assert!(m.contains("TalosMachine w-2 (Talos v1.12.0)"), "{m}");
        assert!(!m.contains("cp-1"), "{m}");
        assert!(m.contains("talos-upgrade"), "{m}");
        assert_eq!(refusal("1.37.0", &machines[..1]), None);
    }
}
