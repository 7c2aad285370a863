//! The test control plane never outlives its owner.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ichor_testenv::TestEnv;

/// Processes whose command line mentions `dir` (the servers run with their
/// data and certificate paths inside it).
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && !cmdline.contains("ichor-testenv-watchdog") {
            found.push(cmdline);
        }
    }
    found
}

fn wait_no_process(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !processes_using(dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running after 30s: {:?}",
            processes_using(dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_gone(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let procs = processes_using(dir);
        if procs.is_empty() && !dir.exists() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still there after 30s: folder exists={}, processes={procs:?}",
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn dropping_a_control_plane_stops_its_servers_and_removes_its_folder() {
    let env = TestEnv::start().unwrap();
    let dir = env.dir().to_path_buf();
    assert!(
        !processes_using(&dir).is_empty(),
        "servers should be running"
    );
    drop(env);
    wait_gone(&dir);
}

#[test]
fn a_panicking_test_binary_leaves_no_server_behind() {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor-testenv-probe"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the probe panics on purpose");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let dir = Path::new(stdout.trim());
    assert!(
        dir.starts_with(std::env::temp_dir()),
        "probe printed {stdout:?}"
    );
    wait_gone(dir);
}

#[test]
fn a_killed_watchdog_takes_its_server_with_it() {
    let env = TestEnv::start().unwrap();
    let dir = env.dir().to_path_buf();
    assert!(
        !processes_using(&dir).is_empty(),
        "servers should be running"
    );
    for pid in env.watchdog_pids() {
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    wait_no_process(&dir);
    drop(env);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signalled_watchdog_stops_its_server_and_removes_the_folder() {
    let env = TestEnv::start().unwrap();
    let dir = env.dir().to_path_buf();
    for pid in env.watchdog_pids() {
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    wait_gone(&dir);
}
