//! `crypt` against the reference age (the Go `age` and `age-keygen` of
//! filippo.io/age, built by `tools/testbin.sh`): each side decrypts what the
//! other encrypted, over random sizes, chunkings and recipient counts.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bytes::Bytes;
use futures::StreamExt;
use ichor_backup::crypt::{self, Identities, PartDigest, Recipients};
use ichor_testenv::tools::Tool;
use proptest::prelude::*;

/// The real tools, where `tools/testbin.sh` (`make testbin`) builds them;
/// missing, the test fails saying so: it must not pass without the peer.
fn age() -> PathBuf {
    Tool::Age.path()
}

fn age_keygen() -> PathBuf {
    Tool::AgeKeygen.path()
}

/// An identity file written by `age-keygen -o`, and its recipient as
/// `age-keygen -y` prints it.
pub(crate) fn keygen(dir: &Path, i: usize) -> (PathBuf, String) {
    let file = dir.join(format!("identity-{i}.txt"));
    let out = Command::new(age_keygen())
        .arg("-o")
        .arg(&file)
        .output()
        .expect("run age-keygen");
    assert!(
        out.status.success(),
        "age-keygen -o failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(age_keygen())
        .arg("-y")
        .arg(&file)
        .output()
        .expect("run age-keygen -y");
    assert!(out.status.success(), "age-keygen -y failed");
    let recipient = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(recipient.starts_with("age1"), "{recipient}");
    (file, recipient)
}

/// Runs `age` with `args`, `input` on its stdin; its stdout, or its stderr
/// as the error.
pub(crate) fn run_age(args: &[&std::ffi::OsStr], input: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new(age())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run age");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Feed stdin from a thread: age writes while it reads, and both pipes
    // would fill up with megabytes in flight.
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn plaintext(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Encrypts `data` with `crypt`'s stream in chunks of the given sizes (as
/// an uploader feeds it), returning the ciphertext and the digest.
fn ichor_encrypt(recipients: &Recipients, data: &[u8], chunks: &[usize]) -> (Vec<u8>, PartDigest) {
    let mut input: Vec<Result<Bytes, std::io::Error>> = Vec::new();
    let mut at = 0;
    for c in chunks.iter().cycle() {
        if at >= data.len() {
            break;
        }
        let end = (at + c).min(data.len());
        input.push(Ok(Bytes::copy_from_slice(&data[at..end])));
        at = end;
    }
    let (s, slot) = crypt::encrypt_stream(recipients, futures::stream::iter(input)).unwrap();
    let ct = futures::executor::block_on(s.map(|c| c.unwrap().to_vec()).concat());
    (ct, slot.get().expect("the digest once the stream ended"))
}

/// Sizes 0..3 MiB, with age's 64 KiB chunk boundaries drawn often: a last
/// chunk that is empty, full or one byte over is where codecs differ.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..3 * 1024 * 1024,
        (0usize..48, -1i64..=1).prop_map(|(k, d)| (k as i64 * 65536 + d).max(0) as usize),
        0usize..200,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The real `age -d` opens what `crypt` encrypted, with each recipient's
    /// identity file, to the same bytes.
    ///
    /// Covers: R20.3, R20.7
    #[test]
    fn the_age_cli_decrypts_what_ichor_encrypted(
        len in size(),
        seed: u64,
        n in 1usize..=3,
        chunks in prop::collection::vec(1usize..200_000, 1..6),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<_> = (0..n).map(|i| keygen(dir.path(), i)).collect();
        let recipients = Recipients::parse(&keys.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>()).unwrap();
        let data = plaintext(len, seed);
        let (ct, digest) = ichor_encrypt(&recipients, &data, &chunks);
        prop_assert_eq!(digest, PartDigest::of(&data));
        for (file, _) in &keys {
            let got = run_age(&["-d".as_ref(), "-i".as_ref(), file.as_os_str()], &ct);
            let got = got.map_err(|e| TestCaseError::fail(format!("age -d refused {len} bytes to {n} recipients: {e}")))?;
            prop_assert!(got == data, "age -d gave {} bytes, not the {} encrypted", got.len(), len);
        }
        // and not with an identity it was not encrypted to
        let (stranger, _) = keygen(dir.path(), 99);
        prop_assert!(run_age(&["-d".as_ref(), "-i".as_ref(), stranger.as_os_str()], &ct).is_err());
    }

    /// `crypt` opens what the real `age -r … -r …` encrypted, with each
    /// identity file `age-keygen` wrote.
    ///
    /// Covers: R20.3, R20.7
    #[test]
    fn ichor_decrypts_what_the_age_cli_encrypted(
        len in size(),
        seed: u64,
        n in 1usize..=3,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<_> = (0..n).map(|i| keygen(dir.path(), i)).collect();
        let data = plaintext(len, seed);
        let mut args: Vec<&std::ffi::OsStr> = vec!["-e".as_ref()];
        for (_, r) in &keys {
            args.push("-r".as_ref());
            args.push(r.as_ref());
        }
        let ct = run_age(&args, &data).map_err(TestCaseError::fail)?;
        for (file, _) in &keys {
            let ids = Identities::parse(&std::fs::read_to_string(file).unwrap()).unwrap();
            let mut got = Vec::new();
            crypt::decrypt(&ids, &ct[..]).unwrap().read_to_end(&mut got).unwrap();
            prop_assert!(got == data, "crypt gave {} bytes, not the {} age encrypted", got.len(), len);
        }
    }
}

/// The real `age` refuses a ciphertext of `crypt`'s cut at a chunk boundary
/// or anywhere else: a backup cut short never decrypts as if it were whole.
///
/// Covers: R20.2, R20.7
#[test]
fn the_age_cli_refuses_a_cut_ciphertext() {
    let dir = tempfile::tempdir().unwrap();
    let (file, r) = keygen(dir.path(), 0);
    let recipients = Recipients::parse(&[r]).unwrap();
    let data = plaintext(3 * 65536 + 100, 5);
    let (ct, _) = ichor_encrypt(&recipients, &data, &[65536]);
    // The header ends where the first payload chunk (64 KiB + 16) starts.
    let payload = 3 * (65536 + 16) + 100 + 16;
    let header = ct.len() - payload;
    for cut in [
        ct.len() - 1,
        ct.len() - 116,      // the last, partial chunk gone: ends on a full chunk
        header + 65536 + 16, // after the first chunk
        header + 16 + 100,   // mid-chunk
        header,              // the header alone
    ] {
        let got = run_age(
            &["-d".as_ref(), "-i".as_ref(), file.as_os_str()],
            &ct[..cut],
        );
        assert!(
            got.is_err(),
            "age -d accepted a ciphertext cut to {cut} of {} bytes",
            ct.len()
        );
    }
}
