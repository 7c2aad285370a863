//! Benchmark (it prints figures and judges nothing): encoding and decoding
//! records with 10 and 100 revisions, and reading the history through Ichor
//! against `helm history` (v3 and v4) on the same records. Run it with
//!
//! ```text
//! cargo bench -p ichor-helm --bench records
//! ```

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use base64::Engine as _;
use common::*;
use ichor_helm::record::{decode_release, encode_release};
use ichor_helm::{SecretStorage, Status};
use ichor_testenv::{TestEnv, Tool};
use serde_json::json;

/// A release the size of a Cilium record: the demo chart rendered by real
/// helm, with its chart padded by 150 synthetic 4 KiB templates (about 0.8 MB of JSON).
async fn cilium_sized_release(home: &HelmHome) -> ichor_helm::Release {
    let r = home.renderer(Tool::Helm4);
    let mut rel = r
        .render(
            "bench",
            "kube-system",
            &ichor_helm::ChartRef::path(demo_chart()),
            &json!({}),
        )
        .await
        .unwrap();
    let templates = rel.chart.as_mut().unwrap()["templates"]
        .as_array_mut()
        .unwrap();
    // Template-like text with some entropy (a repeated line would compress
    // far better than a real chart does).
    const WORDS: [&str; 16] = [
        "{{- if",
        ".Values.",
        "hubble",
        "operator",
        "nindent 4",
        "include",
        "\"cilium.",
        "}}",
        "name:",
        "value:",
        "- key",
        "toYaml",
        "default",
        "end }}",
        "securityContext",
        "tolerations",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..150 {
        let mut text = String::with_capacity(4096);
        while text.len() < 4000 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            text.push_str(WORDS[(seed >> 60) as usize]);
            text.push_str(&format!("{:x}", (seed >> 40) & 0xfff));
            text.push(if (seed >> 32) & 7 == 0 { '\n' } else { ' ' });
        }
        templates.push(json!({"name": format!("templates/pad-{i}.yaml"),
            "data": base64::engine::general_purpose::STANDARD.encode(text)}));
    }
    rel.name = "bench".into();
    rel.namespace = "kube-system".into();
    rel
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let env = TestEnv::shared();
    let home = HelmHome::new();
    let base = cilium_sized_release(&home).await;
    let json_len = serde_json::to_vec(&base).unwrap().len();
    let encoded_len = encode_release(&base).unwrap().len();
    println!("record: JSON {json_len} bytes, stored base64(gzip) {encoded_len} bytes");

    for n in [10u32, 100] {
        let releases: Vec<_> = (1..=n)
            .map(|v| {
                let mut r = base.clone();
                r.version = v;
                let s = if v == n {
                    Status::Deployed
                } else {
                    Status::Superseded
                };
                r.set_status(s, "bench");
                r
            })
            .collect();
        let t = Instant::now();
        let encoded: Vec<String> = releases
            .iter()
            .map(|r| encode_release(r).unwrap())
            .collect();
        let enc = t.elapsed();
        let t = Instant::now();
        for e in &encoded {
            decode_release(e.as_bytes(), "bench").unwrap();
        }
        let dec = t.elapsed();

        let ns = env.namespace("bench").await;
        let storage = SecretStorage::new(env.client().await, &ns);
        for r in &releases {
            storage.create(r).await.unwrap();
        }
        let t = Instant::now();
        let h = storage.history("bench").await.unwrap();
        let ichor = t.elapsed();
        assert_eq!(h.len(), n as usize);
        let mut line = format!(
            "{n:>3} revisions: encode {:.2} ms ({:.2} ms/rec), decode {:.2} ms ({:.2} ms/rec), Ichor history (list+decode) {:.1} ms",
            ms(enc),
            ms(enc) / n as f64,
            ms(dec),
            ms(dec) / n as f64,
            ms(ichor)
        );
        for tool in [Tool::Helm3, Tool::Helm4] {
            let t = Instant::now();
            let out = home.json(
                tool,
                &["history", "bench", "--namespace", &ns, "--max", "1000"],
            );
            let helm = t.elapsed();
            assert_eq!(out.as_array().unwrap().len(), n as usize);
            line += &format!(
                ", helm {} history {:.1} ms (ratio Ichor/helm {:.2})",
                tool.version(),
                ms(helm),
                ms(ichor) / ms(helm)
            );
        }
        println!("{line}");
    }
}
