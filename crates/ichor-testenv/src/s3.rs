//! A real S3-compatible server for the backup tests: Versity's S3 gateway
//! (`versitygw`, built by `tools/testbin.sh`) over a temporary folder, on a
//! free loopback port, with its own credentials and one bucket.
//!
//! ```no_run
//! let s3 = ichor_testenv::s3::S3Server::start().expect("S3 server");
//! let endpoint = s3.endpoint(); // http://127.0.0.1:PORT
//! ```
//!
//! The server runs under the same watchdog as the test control plane, so it
//! never outlives the test binary; dropping the [`S3Server`] stops it and
//! removes its folder.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{Tool, Watchdog, free_port, log_tail, watchdog};

/// How long the gateway may take to answer on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The region the gateway reports and signs for.
pub const REGION: &str = "us-east-1";

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("cannot create the S3 server's folder {dir}")]
    Files {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Start(#[from] crate::Error),
    #[error(
        "the S3 server on 127.0.0.1:{port} did not answer within {timeout:?}; last lines of its log:\n{log_tail}"
    )]
    NotReady {
        port: u16,
        timeout: Duration,
        log_tail: String,
    },
}

/// A running S3-compatible server with one empty bucket.
pub struct S3Server {
    // Dropped first: stops the server, then its watchdog removes `dir`.
    watchdog: Option<Watchdog>,
    dir: PathBuf,
    port: u16,
    bucket: String,
    access_key_id: String,
    secret_access_key: String,
}

impl S3Server {
    /// Starts the server with the bucket `backups`. Panics with the command
    /// to run when `versitygw` has not been built.
    pub fn start() -> Result<S3Server, S3Error> {
        Self::start_with_bucket("backups")
    }

    /// Starts the server with one empty bucket named `bucket`.
    pub fn start_with_bucket(bucket: &str) -> Result<S3Server, S3Error> {
        let bin = Tool::Versitygw.path();
        let dir = tempfile::Builder::new()
            .prefix("ichor-s3-")
            .tempdir()
            .map_err(|source| S3Error::Files {
                dir: std::env::temp_dir(),
                source,
            })?
            .keep();
        let root = dir.join("root");
        // The posix backend serves each folder under its root as a bucket.
        std::fs::create_dir_all(root.join(bucket)).map_err(|source| S3Error::Files {
            dir: root.clone(),
            source,
        })?;
        let port = free_port();
        let access_key_id = format!("ichor-test-{port}");
        let secret_access_key = format!("ichor-test-secret-{}", rand::random::<u64>());
        let log = dir.join("versitygw.log");
        let watchdog = watchdog(
            "versitygw",
            &bin,
            &[
                "--port".into(),
                format!("127.0.0.1:{port}"),
                "--access".into(),
                access_key_id.clone(),
                "--secret".into(),
                secret_access_key.clone(),
                "--region".into(),
                REGION.into(),
                "--quiet".into(),
                "posix".into(),
                root.display().to_string(),
            ],
            &log,
            Some(&dir),
        )?;
        let server = S3Server {
            watchdog: Some(watchdog),
            dir,
            port,
            bucket: bucket.to_string(),
            access_key_id,
            secret_access_key,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn region(&self) -> &str {
        REGION
    }

    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    /// The folder the posix backend stores the buckets in (one folder each).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.dir.join("versitygw.log"), lines)
    }

    /// Stops the server now (dropping it does the same).
    pub fn stop(&mut self) {
        drop(self.watchdog.take());
    }

    fn wait_ready(&self) -> Result<(), S3Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if answers_http(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(S3Error::NotReady {
            port: self.port,
            timeout: READY_TIMEOUT,
            log_tail: self.log_tail(40),
        })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether an HTTP server answers on the port (any status: an unsigned
/// request is refused, which is an answer).
fn answers_http(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_stops_with_its_folder() {
        let mut s3 = S3Server::start_with_bucket("probe").expect("versitygw starts");
        assert!(s3.data_dir().join("probe").is_dir());
        assert!(answers_http(s3.port), "{}", s3.log_tail(20));
        let dir = s3.dir.clone();
        s3.stop();
        assert!(
            !answers_http(s3.port),
            "the server still answers after stop"
        );
        assert!(!dir.exists(), "{} stays after stop", dir.display());
    }
}
