//! The destinations against a real S3-compatible server (versitygw over a
//! folder, started once for this binary) and a local folder.
//!
//! Whether an unfinished multipart upload remains is asked of the server
//! itself: a ListMultipartUploads request (`GET /<bucket>/?uploads`) presigned
//! by object_store's own SigV4 signer (`Signer::signed_url_opts`, the query
//! folded into the signature) and sent as plain HTTP/1.0 over loopback.

use std::io;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use ichor_backup::store::{Destination, PART_SIZE, S3Destination, Store, StoreError};
use ichor_testenv::s3::S3Server;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1024 * 1024;

/// One server for the whole binary; each test works under its own prefix.
/// The watchdog stops it when the test process ends.
fn server() -> &'static S3Server {
    static SERVER: OnceLock<S3Server> = OnceLock::new();
    SERVER.get_or_init(|| S3Server::start().expect("the S3 server starts"))
}

fn s3_destination(prefix: &str) -> Destination {
    let s3 = server();
    Destination::S3(S3Destination {
        endpoint: Some(s3.endpoint()),
        bucket: s3.bucket().to_string(),
        prefix: prefix.to_string(),
        region: s3.region().to_string(),
        access_key_id: s3.access_key_id().to_string(),
        secret_access_key: s3.secret_access_key().to_string(),
        allow_http: true,
    })
}

pub(crate) fn s3_store(prefix: &str) -> Store {
    Store::open(&s3_destination(prefix)).expect("the S3 destination opens")
}

/// The same bucket through object_store's S3 client, for its signer.
fn raw_s3() -> AmazonS3 {
    let s3 = server();
    AmazonS3Builder::new()
        .with_endpoint(s3.endpoint())
        .with_bucket_name(s3.bucket())
        .with_region(s3.region())
        .with_access_key_id(s3.access_key_id())
        .with_secret_access_key(s3.secret_access_key())
        .with_allow_http(true)
        .build()
        .expect("the S3 client builds")
}

/// The keys (full, in the bucket) of the multipart uploads the server holds
/// unfinished, from its ListMultipartUploads answer.
async fn unfinished_uploads() -> Vec<String> {
    let options = SignedUrlOptions::default().with_query([("uploads", "")]);
    let url = raw_s3()
        .signed_url_opts(
            Method::GET,
            &ObjectPath::from(""),
            Duration::from_secs(60),
            &options,
        )
        .await
        .expect("presign ListMultipartUploads");
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host = format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port().expect("a port")
    );
    let mut stream = tokio::net::TcpStream::connect(&host)
        .await
        .expect("connect to the S3 server");
    let request = format!("GET {target} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the answer");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("an HTTP answer has a head");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "ListMultipartUploads was refused: {head}\n{body}"
    );
    assert!(
        body.contains("ListMultipartUploadsResult"),
        "not a ListMultipartUploads answer: {body}"
    );
    body.split("<Upload>")
        .skip(1)
        .map(|upload| {
            let key = upload
                .split_once("<Key>")
                .and_then(|(_, rest)| rest.split_once("</Key>"))
                .map(|(key, _)| key)
                .expect("an upload names its key");
            key.to_string()
        })
        .collect()
}

pub(crate) async fn unfinished_uploads_under(prefix: &str) -> Vec<String> {
    unfinished_uploads()
        .await
        .into_iter()
        .filter(|k| k.starts_with(prefix))
        .collect()
}

/// `total` bytes of a deterministic pattern in chunks of uneven sizes (so
/// chunks straddle part boundaries), made as they are read.
fn pattern(total: usize) -> impl Stream<Item = Result<Bytes, io::Error>> + Send {
    let sizes = [MIB, 3 * MIB + 17, 64 * 1024, 5 * MIB - 3, 1];
    futures::stream::unfold((0usize, 0usize), move |(sent, i)| async move {
        if sent >= total {
            return None;
        }
        let len = sizes[i % sizes.len()].min(total - sent);
        let chunk: Vec<u8> = (sent..sent + len)
            .map(|n| (n as u64).wrapping_mul(2654435761).to_le_bytes()[1])
            .collect();
        Some((Ok(Bytes::from(chunk)), (sent + len, i + 1)))
    })
}

fn sha256_of_pattern(total: usize) -> String {
    let mut hasher = Sha256::new();
    for n in 0..total {
        hasher.update([(n as u64).wrapping_mul(2654435761).to_le_bytes()[1]]);
    }
    hex::encode(hasher.finalize())
}

/// `good` bytes of the pattern, then the error a cut snapshot stream gives.
fn broken_after(good: usize) -> impl Stream<Item = Result<Bytes, io::Error>> + Send {
    pattern(good).chain(futures::stream::once(async {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the etcd snapshot stream ended early",
        ))
    }))
}

async fn sha256_of(store: &Store, key: &str) -> (String, usize) {
    let mut stream = store.get(key).await.expect("the object is there");
    let mut hasher = Sha256::new();
    let mut size = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("the object reads whole");
        size += chunk.len();
        hasher.update(&chunk);
    }
    (hex::encode(hasher.finalize()), size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_stream_round_trips_through_s3_with_the_same_sha256() {
    let store = s3_store("roundtrip");
    let total = 64 * MIB;
    let key = "c1/c1-20260101000000/etcd.snapshot.age";
    let size = store
        .upload(key, pattern(total))
        .await
        .expect("the upload completes");
    assert_eq!(size, total as u64);
    assert!(total > 4 * PART_SIZE, "the upload needs several parts");

    let (sha, read) = sha256_of(&store, key).await;
    assert_eq!(read, total);
    assert_eq!(sha, sha256_of_pattern(total));
    let listed = store.list("c1").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, key);
    assert_eq!(listed[0].size, total as u64);
    assert!(unfinished_uploads_under("roundtrip/").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_leaves_no_object_and_no_unfinished_upload_in_s3() {
    let store = s3_store("broken");
    let key = "c1/c1-20260101000000/etcd.snapshot.age";
    // Past two parts, so the server holds parts when the stream breaks.
    let err = store
        .upload(key, broken_after(2 * PART_SIZE + MIB))
        .await
        .expect_err("a broken stream fails the upload");
    assert!(matches!(err, StoreError::Source { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(key) && message.contains("bucket backups"),
        "{message}"
    );
    let cause = std::error::Error::source(&err)
        .expect("a cause")
        .to_string();
    assert_eq!(cause, "the etcd snapshot stream ended early");

    let missing = match store.get(key).await {
        Ok(_) => panic!("an object is at {key} after a failed upload"),
        Err(e) => e,
    };
    assert!(missing.is_not_found(), "{missing:?}");
    assert!(store.list("").await.expect("list").is_empty());
    assert_eq!(
        unfinished_uploads_under("broken/").await,
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_upload_is_aborted_on_the_server() {
    let store = s3_store("cancelled");
    let key = "c1/c1-20260101000000/etcd.snapshot.age";
    // Three parts' worth, then the stream waits forever: the upload is open
    // on the server with parts in it.
    let stalled = pattern(3 * PART_SIZE).chain(futures::stream::pending());
    let upload = tokio::spawn({
        let store = store.clone();
        async move { store.upload(key, stalled).await }
    });
    let full_key = format!("cancelled/{key}");
    let mut open = Vec::new();
    for _ in 0..200 {
        open = unfinished_uploads_under("cancelled/").await;
        if !open.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The check sees an open upload: its empty answers below mean something.
    assert_eq!(open, vec![full_key.clone()]);

    upload.abort();
    assert!(upload.await.expect_err("cancelled").is_cancelled());
    let mut left = open;
    for _ in 0..200 {
        left = unfinished_uploads_under("cancelled/").await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        left,
        Vec::<String>::new(),
        "the cancelled upload was not aborted"
    );
    assert!(store.list("").await.expect("list").is_empty());
}

/// Small objects at keys that share leading characters but not segments.
const KEYS: [&str; 6] = [
    "c1/c1-20260101000000/manifest.json.age",
    "c1/c1-20260101000000/etcd.snapshot.age",
    "c1/c1-20260102000000/manifest.json.age",
    "c10/c10-20260101000000/manifest.json.age",
    "c1-old/c1-old-20260101000000/manifest.json.age",
    "c1.json",
];

async fn put_small(store: &Store, key: &str) {
    let body = futures::stream::iter([Ok::<_, io::Error>(Bytes::from(key.to_string()))]);
    store.upload(key, body).await.expect("a small upload");
}

async fn keys(store: &Store, prefix: &str) -> Vec<String> {
    store
        .list(prefix)
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// Lists and deletes under `c1` through `store`; `neighbour` is another
/// destination prefix in the same place that must stay untouched.
async fn list_and_delete_touch_only_their_prefix(store: &Store, neighbour: &Store) {
    for key in KEYS {
        put_small(store, key).await;
    }
    put_small(neighbour, KEYS[0]).await;

    let mut c1: Vec<String> = KEYS[..3].iter().map(|k| k.to_string()).collect();
    c1.sort();
    assert_eq!(keys(store, "c1").await, c1);
    assert_eq!(keys(store, "c1/").await, c1);
    assert_eq!(
        keys(store, "c1/c1-20260101000000").await,
        vec![KEYS[1].to_string(), KEYS[0].to_string()]
    );
    let (sha, _) = sha256_of(store, KEYS[3]).await;
    assert_eq!(sha, hex::encode(Sha256::digest(KEYS[3].as_bytes())));

    store.delete(&c1).await.expect("delete");
    // Deleting again: a key already gone is no error.
    store.delete(&c1[..1]).await.expect("delete again");
    assert!(keys(store, "c1").await.is_empty());
    let mut rest: Vec<String> = KEYS[3..].iter().map(|k| k.to_string()).collect();
    rest.sort();
    assert_eq!(keys(store, "").await, rest);
    assert_eq!(keys(neighbour, "").await, vec![KEYS[0].to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_list_and_delete_touch_only_their_prefix() {
    list_and_delete_touch_only_their_prefix(&s3_store("listing"), &s3_store("listing-other")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_list_and_delete_touch_only_their_prefix() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let open = |root: &Path| {
        Store::open(&Destination::Filesystem {
            root: root.to_path_buf(),
        })
        .expect("the folder destination opens")
    };
    list_and_delete_touch_only_their_prefix(
        &open(&dir.path().join("backups")),
        &open(&dir.path().join("backups-other")),
    )
    .await;
}

fn files_under(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_leaves_no_partial_file_in_a_folder() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let root = dir.path().join("backups");
    let store = Store::open(&Destination::Filesystem { root: root.clone() }).expect("open");
    let key = "c1/c1-20260101000000/etcd.snapshot.age";
    let err = store
        .upload(key, broken_after(PART_SIZE + MIB))
        .await
        .expect_err("a broken stream fails the upload");
    assert!(matches!(err, StoreError::Source { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&root.display().to_string()),
        "{err}"
    );
    assert_eq!(files_under(&root), Vec::<String>::new());

    // A cancelled upload leaves nothing either.
    let stalled = pattern(PART_SIZE + MIB).chain(futures::stream::pending());
    let upload = tokio::spawn({
        let store = store.clone();
        async move { store.upload(key, stalled).await }
    });
    for _ in 0..200 {
        if !files_under(&root).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!files_under(&root).is_empty(), "the upload never started");
    upload.abort();
    let _ = upload.await;
    let mut left = files_under(&root);
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = files_under(&root);
    }
    assert_eq!(left, Vec::<String>::new());

    // And a whole one round-trips.
    let total = 3 * PART_SIZE / 2;
    store.upload(key, pattern(total)).await.expect("upload");
    assert_eq!(
        sha256_of(&store, key).await,
        (sha256_of_pattern(total), total)
    );
    assert_eq!(files_under(&root).len(), 1);
}

#[tokio::test]
async fn keys_that_are_no_object_path_are_refused_with_the_key() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = Store::open(&Destination::Filesystem {
        root: dir.path().to_path_buf(),
    })
    .expect("open");
    let err = store
        .upload("c1/../escape", pattern(1))
        .await
        .expect_err("a key with .. is refused");
    assert!(matches!(err, StoreError::Key { .. }), "{err:?}");
    assert!(err.to_string().contains("c1/../escape"), "{err}");
}

#[test]
fn the_secret_key_stays_out_of_debug_output() {
    let shown = format!(
        "{:?}",
        Destination::S3(S3Destination {
            endpoint: None,
            bucket: "b".into(),
            prefix: String::new(),
            region: "eu-central-1".into(),
            access_key_id: "AKIA".into(),
            secret_access_key: "very-secret".into(),
            allow_http: false,
        })
    );
    assert!(!shown.contains("very-secret"), "{shown}");
    assert!(shown.contains("AKIA"), "{shown}");
}

/// `TryStreamExt` is what a caller uses to read a part whole; the store's
/// stream errors carry the key.
#[tokio::test]
async fn reading_a_missing_key_names_it() {
    let store = s3_store("missing");
    let err = match store.get("c1/none/manifest.json.age").await {
        Ok(stream) => stream
            .try_collect::<Vec<_>>()
            .await
            .map(|_| ())
            .expect_err("nothing to read"),
        Err(e) => e,
    };
    assert!(err.is_not_found(), "{err:?}");
    assert!(
        err.to_string().contains("c1/none/manifest.json.age"),
        "{err}"
    );
}
