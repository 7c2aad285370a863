//! docs/adr/0004-drift-classes.md and the code say the same thing.

use std::path::PathBuf;

use ichor_render::classes::RULES;
use ichor_render::redact::{PUBLIC_PATHS, SECRET_KEYS};

fn adr() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/adr/0004-drift-classes.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Every row of the path table is in the ADR, in the same order, with the same class and reason.
#[test]
fn path_table_matches_the_adr() {
    let text = adr();
    for (i, rule) in RULES.iter().enumerate() {
        let pattern = if rule.pattern.is_empty() {
            "(any other path)".to_owned()
        } else {
            format!("`{}`", rule.pattern)
        };
        let row = format!(
            "| {} | {} | {:?} | {} |",
            i + 1,
            pattern,
            rule.class,
            rule.reason
        );
        assert!(
            text.lines().any(|l| l == row),
            "docs/adr/0004-drift-classes.md lacks the row\n{row}\nUpdate the ADR's table with ichor_render::classes::RULES."
        );
    }
    let rows = text
        .lines()
        .filter(|l| l.starts_with("| ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()));
    assert_eq!(
        rows.count(),
        RULES.len(),
        "the ADR's table has rows the code does not"
    );
}

/// Every public path and every always-secret key is named in ADR 0013, and
/// the ADR names none the code does not have.
#[test]
fn the_redaction_table_is_the_adrs() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/adr/0013-redaction-by-default.md");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let mut want: Vec<&str> = PUBLIC_PATHS.iter().chain(SECRET_KEYS).copied().collect();
    want.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(
        got, want,
        "ADR 0013's lists and ichor_render::redact differ"
    );
}
