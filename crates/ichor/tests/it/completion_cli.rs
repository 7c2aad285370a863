//! `ichor completion bash` sourced in a real bash: the completion function
//! is registered for `ichor`, and driving it through COMP_WORDS/COMP_CWORD
//! (as bash does on Tab) completes subcommands and `--tunnel`'s values.
//! The man pages `ichor man-pages` writes render with `man -l` where man is
//! installed, else with groff or mandoc, else their roff is checked.

use std::process::Command;

use crate::common::text;

fn ichor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ichor"))
}

/// What the completion function offers for the words typed so far (the
/// last one being completed).
fn complete(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\n\
         spec=$(complete -p ichor) || exit 3\n\
         func=$(sed -E 's/.* -F ([^ ]+) .*/\\1/' <<< \"$spec\")\n\
         COMP_WORDS=({words})\n\
         COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
         COMP_LINE=\"${{COMP_WORDS[*]}}\"\n\
         COMP_POINT=${{#COMP_LINE}}\n\
         \"$func\" ichor \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words = quoted.join(" ")
    );
    let out = Command::new("bash")
        .arg("--norc")
        .arg("-c")
        .arg(&program)
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Covers: R17.20
#[test]
fn bash_completes_subcommands_and_tunnel_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = ichor().args(["completion", "bash"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let script = dir.path().join("ichor.bash");
    std::fs::write(&script, &out.stdout).unwrap();

    // `source <(ichor completion bash); complete -p ichor`, as a user types it.
    let out = Command::new("bash")
        .arg("--norc")
        .arg("-c")
        .arg(format!(
            "source <('{}' completion bash) && complete -p ichor",
            env!("CARGO_BIN_EXE_ichor")
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let spec = String::from_utf8_lossy(&out.stdout);
    assert!(
        spec.starts_with("complete ") && spec.trim_end().ends_with(" ichor"),
        "{spec}"
    );

    let top = complete(&script, &["ichor", ""]);
    for sub in ["adopt", "machine", "completion", "backup", "recover"] {
        assert!(top.iter().any(|w| w == sub), "{sub} not in {top:?}");
    }
    let machine = complete(&script, &["ichor", "machine", ""]);
    for sub in ["list", "add", "remove", "replace"] {
        assert!(machine.iter().any(|w| w == sub), "{sub} not in {machine:?}");
    }
    let tunnel = complete(&script, &["ichor", "cni", "bootstrap", "--tunnel", ""]);
    assert_eq!(
        {
            let mut t = tunnel.clone();
            t.sort();
            t
        },
        ["geneve", "vxlan"],
        "{tunnel:?}"
    );
    let role = complete(&script, &["ichor", "machine", "add", "--role", "c"]);
    assert_eq!(role, ["controlplane"]);
}

fn found(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Covers: R17.21
#[test]
fn man_pages_render() {
    let dir = tempfile::tempdir().unwrap();
    let out = ichor()
        .args(["man-pages", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let page = dir.path().join("ichor-machine-add.1");
    let roff = std::fs::read_to_string(&page).unwrap();
    assert!(
        roff.starts_with(".ie \\n(.g .ds Aq") || roff.contains(".TH"),
        "{roff}"
    );
    let renderer = if found("man") {
        Some(("man", vec!["-l".to_string()]))
    } else if found("groff") {
        Some(("groff", vec!["-man".to_string(), "-Tutf8".to_string()]))
    } else if found("mandoc") {
        Some(("mandoc", vec![]))
    } else {
        None
    };
    let Some((tool, args)) = renderer else {
        // No man, groff or mandoc here: the roff is checked, not rendered.
        assert!(roff.contains("\\-\\-cluster"), "{roff}");
        return;
    };
    let out = Command::new(tool)
        .args(&args)
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "{tool}: {}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    // Renderers may embolden with backspaces; compare the letters.
    let plain: String = {
        let mut s = String::new();
        for c in shown.chars() {
            if c == '\u{8}' {
                s.pop();
            } else {
                s.push(c);
            }
        }
        s
    };
    assert!(plain.contains("ichor-machine-add"), "{plain}");
    assert!(plain.contains("--cluster"), "{plain}");
    assert!(plain.contains("maintenance mode"), "{plain}");
}
