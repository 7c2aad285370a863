//! The snapshot check against real etcd: the stream `etcdctl snapshot save`
//! writes (what Talos's `EtcdSnapshot` relays) passes in Talos's 1024-byte
//! messages with the size `etcdutl snapshot status` reads, a raw copy of the
//! member's db passes only as a raw copy, and a stream cut anywhere fails —
//! as `etcdutl snapshot restore` also refuses it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ichor_backup::snapshot::{CheckedSnapshot, Mode, SnapshotCheck, SnapshotError};
use ichor_testenv::tools::Tool;
use sha2::{Digest, Sha256};

/// An etcd of its own in a temporary folder, killed when dropped.
pub(crate) struct Etcd {
    child: Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Etcd {
    pub(crate) fn start() -> Etcd {
        let etcd = Tool::Etcd.path();
        let dir = tempfile::tempdir().unwrap();
        let client = format!("http://127.0.0.1:{}", ichor_testenv::free_port());
        let peer = format!("http://127.0.0.1:{}", ichor_testenv::free_port());
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let child = Command::new(etcd)
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .arg("--unsafe-no-fsync=true")
            .arg("--log-level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let e = Etcd {
            child,
            endpoint: client,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !e.ctl(&["endpoint", "health"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within 30 s: {}",
                std::fs::read_to_string(e.dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        e
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(Tool::Etcdctl.path())
            .arg(format!("--endpoints={}", self.endpoint))
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    pub(crate) fn put(&self, key: &str, value: &str) {
        let out = self.ctl(&["put", key, value]);
        assert!(out.status.success(), "etcdctl put {key}: {out:?}");
    }

    /// `etcdctl snapshot save`: the snapshot stream as etcd sends it.
    pub(crate) fn snapshot(&self) -> Vec<u8> {
        let file = self.dir.path().join("snapshot.db");
        let out = self.ctl(&["snapshot", "save", file.to_str().unwrap()]);
        assert!(out.status.success(), "etcdctl snapshot save: {out:?}");
        std::fs::read(file).unwrap()
    }
}

/// Feeds `stream` in Talos's messages of at most 1024 bytes.
fn check_in_messages(mode: Mode, stream: &[u8]) -> Result<CheckedSnapshot, SnapshotError> {
    let mut c = SnapshotCheck::new(mode);
    for m in stream.chunks(1024) {
        c.update(m);
    }
    c.finish()
}

/// `etcdutl snapshot status -w json`'s totalSize.
fn status_total_size(file: &Path) -> u64 {
    let out = Command::new(Tool::Etcdutl.path())
        .args(["snapshot", "status", "-w", "json"])
        .arg(file)
        .output()
        .expect("run etcdutl");
    assert!(out.status.success(), "etcdutl snapshot status: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["totalSize"].as_u64().expect("totalSize")
}

/// Whether `etcdutl snapshot restore` takes the file.
fn restores(file: &Path, into: &Path) -> bool {
    Command::new(Tool::Etcdutl.path())
        .args(["snapshot", "restore"])
        .arg(file)
        .arg(format!("--data-dir={}", into.display()))
        .output()
        .expect("run etcdutl")
        .status
        .success()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Covers: R20.1, R20.2, R20.7
#[test]
fn real_etcd_snapshots_pass_and_cut_ones_fail_as_etcdutl_refuses_them() {
    let etcd = Etcd::start();
    let work = tempfile::tempdir().unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    // Three snapshots of a growing database: a few pages to megabytes.
    for (round, keys) in [(0, 5usize), (1, 120), (2, 400)] {
        for k in 0..keys {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let value = format!("{x:016x}").repeat(1 + (x % 600) as usize);
            etcd.put(&format!("/ichor/r{round}/k{k}"), &value);
        }
        let stream = etcd.snapshot();
        let got = check_in_messages(Mode::WithTrailer, &stream)
            .unwrap_or_else(|e| panic!("a real snapshot of {} bytes failed: {e}", stream.len()));
        let db = &stream[..stream.len() - 32];
        assert_eq!(got.db_size, db.len() as u64);
        assert_eq!(got.sha256, <[u8; 32]>::from(Sha256::digest(db)));
        let whole = write(work.path(), &format!("whole-{round}.db"), &stream);
        assert_eq!(
            status_total_size(&whole),
            got.db_size,
            "etcdutl reads another size"
        );
        assert!(restores(
            &whole,
            &work.path().join(format!("restored-{round}"))
        ));

        // Cut at a message boundary, at a page boundary plus 32 (where a
        // trailer would be), or anywhere: both refuse.
        let n = stream.len();
        for (i, cut) in [
            n - 1,
            n - 32,
            n - 512,
            (n / 1024) * 1024,
            (n / 2 / 512) * 512 + 32,
            n / 3,
        ]
        .into_iter()
        .enumerate()
        {
            let part = &stream[..cut];
            assert!(
                check_in_messages(Mode::WithTrailer, part).is_err(),
                "a snapshot cut to {cut} of {n} bytes passed"
            );
            let file = write(work.path(), &format!("cut-{round}-{i}.db"), part);
            assert!(
                !restores(
                    &file,
                    &work.path().join(format!("cut-restored-{round}-{i}"))
                ),
                "etcdutl restored a snapshot cut to {cut} of {n} bytes"
            );
        }
        // A flipped byte in the database: both refuse.
        let mut bad = stream.clone();
        bad[n / 2] ^= 0x40;
        assert!(matches!(
            check_in_messages(Mode::WithTrailer, &bad),
            Err(SnapshotError::HashMismatch { .. })
        ));
        let file = write(work.path(), &format!("flipped-{round}.db"), &bad);
        assert!(!restores(
            &file,
            &work.path().join(format!("flipped-restored-{round}"))
        ));
    }

    // The member's own db file has no trailer: refused as a stream, taken
    // as a raw copy.
    let raw = std::fs::read(etcd.dir.path().join("data/member/snap/db")).unwrap();
    assert_eq!(
        check_in_messages(Mode::WithTrailer, &raw),
        Err(SnapshotError::MissingTrailer {
            size: raw.len() as u64
        })
    );
    let got = check_in_messages(Mode::RawDb, &raw).unwrap();
    assert_eq!(got.db_size, raw.len() as u64);
}

/// A real snapshot through the pipeline a backup uses (the check, then the
/// encryption, in Talos's 1024-byte messages): the reference `age` gives
/// back the very stream, `etcdutl` reads it, and the check's and the
/// digest's facts are the stream's.
///
/// Covers: R20.1, R20.3, R20.7
#[test]
fn a_real_snapshot_checked_and_encrypted_is_what_age_and_etcdutl_read_back() {
    use bytes::Bytes;
    use futures::StreamExt;
    use ichor_backup::crypt::{self, PartDigest, Recipients};
    use ichor_backup::snapshot::checked_stream;

    let etcd = Etcd::start();
    for k in 0..200 {
        etcd.put(&format!("/ichor/k{k}"), &format!("{k:08}").repeat(200));
    }
    let stream = etcd.snapshot();
    let work = tempfile::tempdir().unwrap();
    let (identity, recipient) = super::age_cli::keygen(work.path(), 0);
    let recipients = Recipients::parse(&[recipient]).unwrap();

    let messages: Vec<Result<Bytes, std::io::Error>> = stream
        .chunks(1024)
        .map(|m| Ok(Bytes::copy_from_slice(m)))
        .collect();
    let (checked, check) = checked_stream(Mode::WithTrailer, futures::stream::iter(messages));
    let (encrypted, digest) = crypt::encrypt_stream(&recipients, checked).unwrap();
    let ct = futures::executor::block_on(encrypted.map(|c| c.unwrap().to_vec()).concat());

    let checked = check.get().expect("a whole snapshot is checked");
    assert_eq!(checked.db_size, stream.len() as u64 - 32);
    assert_eq!(digest.get(), Some(PartDigest::of(&stream)));

    let plain = super::age_cli::run_age(&["-d".as_ref(), "-i".as_ref(), identity.as_os_str()], &ct)
        .unwrap_or_else(|e| panic!("age -d refused the encrypted snapshot: {e}"));
    assert!(plain == stream, "age -d gave back other bytes");
    let file = write(work.path(), "decrypted.db", &plain);
    assert_eq!(status_total_size(&file), checked.db_size);
    assert!(restores(&file, &work.path().join("restored")));
}
