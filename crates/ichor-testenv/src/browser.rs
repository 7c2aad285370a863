//! Driving Debian's headless Chromium over WebDriver (chromedriver), shared
//! by the browser tests: the UI's own and the lab's, against the UI pod the
//! chart deploys (feature `browser`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// Bound of every wait (a loaded 2-core machine is slow; nothing is timed).
pub const WAIT: Duration = Duration::from_secs(120);

fn repo_root() -> PathBuf {
    crate::tools::repo_root()
}

/// Runs `tools/browser.sh --env` (installs the packages when missing) and
/// returns the paths of chromium and chromedriver.
pub fn browser() -> (String, String) {
    let out = Command::new("bash")
        .arg(repo_root().join("tools/browser.sh"))
        .arg("--env")
        .stderr(Stdio::inherit())
        .output()
        .expect("run tools/browser.sh");
    assert!(out.status.success(), "tools/browser.sh failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = |key: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("tools/browser.sh printed no {key}: {text}"))
            .to_owned()
    };
    (value("ICHOR_CHROMIUM"), value("ICHOR_CHROMEDRIVER"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver, stopped on drop.
pub struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// chromedriver and a headless Chromium session with a profile in
/// `profile`; it accepts a certificate it cannot verify (the UI's
/// self-signed one, or a test CA the system does not trust).
pub async fn start_driver(chromedriver: &str, chromium: &str, profile: &Path) -> (Driver, Client) {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let driver = Driver(child);
    let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(json!({
        "acceptInsecureCerts": true,
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ]
        }
    }))
    .unwrap();
    let mut last = String::new();
    for _ in 0..300 {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => return (driver, c),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("chromedriver did not start a Chromium session: {last}");
}

/// Saves the page as `target/ui-screenshots/<name>.png`.
pub async fn screenshot(c: &Client, name: &str) {
    let dir = crate::bench::target_dir().join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Waits (bounded by [`WAIT`]) until the page, as htmx keeps it live with
/// no reload, contains `text`; returns its source.
pub async fn page_shows(c: &Client, text: &str) -> String {
    let mut last = String::new();
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let src = c.source().await.expect("page source");
            if src.contains(text) {
                return src;
            }
            last = src;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    match found {
        Ok(src) => src,
        Err(_) => panic!("the page never showed {text:?}; it shows:\n{last}"),
    }
}

/// Signs in at `base` with `token` through the sign-in form.
pub async fn sign_in(c: &Client, base: &str, token: &str) {
    c.delete_all_cookies().await.unwrap();
    c.goto(&format!("{base}/clusters")).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/signin"));
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    c.find(Locator::Id("signin"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    page_shows(c, "<h1>Clusters</h1>").await;
}

/// A POST from the page itself (same origin, the session cookie sent), as
/// a forged form would send it; returns the status.
pub async fn forged_post(c: &Client, path: &str) -> u64 {
    c.execute_async(
        "const done = arguments[arguments.length - 1];
         fetch(arguments[0], {method: 'POST', credentials: 'same-origin', redirect: 'manual'})
           .then(r => done(r.status)).catch(e => done(String(e)));",
        vec![json!(path)],
    )
    .await
    .expect("fetch runs")
    .as_u64()
    .expect("a status")
}

/// The actions of the page's POST forms.
pub async fn post_forms(c: &Client) -> Vec<String> {
    let mut actions = Vec::new();
    for f in c.find_all(Locator::Css("form[method=post]")).await.unwrap() {
        actions.push(f.attr("action").await.unwrap().unwrap_or_default());
    }
    actions
}
