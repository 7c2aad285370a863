//! Where the upstream tools built by `tools/testbin.sh` live.
//!
//! Each path comes from its `ICHOR_<TOOL>` environment variable when set, else
//! from the cache layout the script writes (`<cache>/<tool>-<version>/<tool>`),
//! with versions read from `tools/versions.env` — the one file that pins them.

use std::path::{Path, PathBuf};

/// The upstream tools the tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    KubeApiserver,
    Etcd,
    Helm3,
    Helm4,
    Talosctl,
    Crane,
    /// Talos's own config machinery (Go module
    /// `github.com/siderolabs/talos/pkg/machinery`) behind the small main in
    /// `tools/machinery-peer`: `validate`, `patch` and `codec-bench`.
    MachineryPeer,
    /// The manifests step of `talosctl upgrade-k8s`: the inventory-backed
    /// server-side apply with prune of the Go module
    /// `github.com/siderolabs/go-kubernetes` (package `kubernetes/ssa`) behind
    /// the small main in `tools/ssa-prune-peer`.
    SsaPrunePeer,
    /// The reference age (`filippo.io/age`), for the backup tests.
    Age,
    AgeKeygen,
    /// etcd's offline snapshot tool and its client, at the etcd version:
    /// real snapshots for the backup tests.
    Etcdutl,
    Etcdctl,
    /// Versity's S3 gateway over a folder: the S3-compatible server of the
    /// backup tests.
    Versitygw,
    /// The reference implementations behind `tools/go-peers` (cel-go,
    /// kstatus, gopher-lua), one subcommand each.
    GoPeers,
    /// Prometheus, its promtool and Alertmanager, from Debian's packages.
    Prometheus,
    Promtool,
    Alertmanager,
}

impl Tool {
    fn env_var(self) -> &'static str {
        match self {
            Tool::KubeApiserver => "ICHOR_KUBE_APISERVER",
            Tool::Etcd => "ICHOR_ETCD",
            Tool::Helm3 => "ICHOR_HELM3",
            Tool::Helm4 => "ICHOR_HELM4",
            Tool::Talosctl => "ICHOR_TALOSCTL",
            Tool::Crane => "ICHOR_CRANE",
            Tool::MachineryPeer => "ICHOR_MACHINERY_PEER",
            Tool::SsaPrunePeer => "ICHOR_SSA_PRUNE_PEER",
            Tool::Age => "ICHOR_AGE",
            Tool::AgeKeygen => "ICHOR_AGE_KEYGEN",
            Tool::Etcdutl => "ICHOR_ETCDUTL",
            Tool::Etcdctl => "ICHOR_ETCDCTL",
            Tool::Versitygw => "ICHOR_VERSITYGW",
            Tool::GoPeers => "ICHOR_GO_PEERS",
            Tool::Prometheus => "ICHOR_PROMETHEUS",
            Tool::Promtool => "ICHOR_PROMTOOL",
            Tool::Alertmanager => "ICHOR_ALERTMANAGER",
        }
    }

    fn version_key(self) -> &'static str {
        match self {
            Tool::KubeApiserver => "KUBERNETES_VERSION",
            Tool::Etcd | Tool::Etcdutl | Tool::Etcdctl => "ETCD_VERSION",
            Tool::Helm3 => "HELM3_VERSION",
            Tool::Helm4 => "HELM4_VERSION",
            Tool::Talosctl => "TALOS_VERSION",
            Tool::Crane => "CRANE_VERSION",
            Tool::MachineryPeer => "TALOS_MACHINERY_VERSION",
            Tool::SsaPrunePeer => "GO_KUBERNETES_VERSION",
            Tool::Age | Tool::AgeKeygen => "AGE_VERSION",
            Tool::Versitygw => "VERSITYGW_VERSION",
            Tool::GoPeers => "CEL_GO_VERSION",
            Tool::Prometheus | Tool::Promtool => "PROMETHEUS_DEB_VERSION",
            Tool::Alertmanager => "ALERTMANAGER_DEB_VERSION",
        }
    }

    fn binary(self) -> &'static str {
        match self {
            Tool::KubeApiserver => "kube-apiserver",
            Tool::Etcd => "etcd",
            Tool::Helm3 | Tool::Helm4 => "helm",
            Tool::Talosctl => "talosctl",
            Tool::Crane => "crane",
            Tool::MachineryPeer => "machinery-peer",
            Tool::SsaPrunePeer => "ssa-prune-peer",
            Tool::Age => "age",
            Tool::AgeKeygen => "age-keygen",
            Tool::Etcdutl => "etcdutl",
            Tool::Etcdctl => "etcdctl",
            Tool::Versitygw => "versitygw",
            Tool::GoPeers => "go-peers",
            Tool::Prometheus => "prometheus",
            Tool::Promtool => "promtool",
            Tool::Alertmanager => "prometheus-alertmanager",
        }
    }

    /// Where `tools/testbin.sh` puts this tool: `<tool>-<version>/<tool>`,
    /// except for go-peers (keyed by its sources, so one folder) and the
    /// Debian packages (unpacked whole).
    fn cache_path(self) -> PathBuf {
        let cache = cache_dir();
        match self {
            Tool::GoPeers => cache.join("go-peers").join(self.binary()),
            Tool::Prometheus | Tool::Promtool => cache
                .join(format!("deb-prometheus-{}", self.version()))
                .join("usr/bin")
                .join(self.binary()),
            Tool::Alertmanager => cache
                .join(format!("deb-prometheus-alertmanager-{}", self.version()))
                .join("usr/bin")
                .join(self.binary()),
            _ => cache
                .join(format!("{}-{}", self.binary(), self.version()))
                .join(self.binary()),
        }
    }

    /// The pinned version of this tool, from `tools/versions.env`.
    pub fn version(self) -> String {
        pinned_version(self.version_key())
    }

    /// The path of this tool's binary. Panics with the command to run when it
    /// has not been built: a test that needs a real peer must not pass without it.
    /// Whether the tool is in the cache (or named by its variable) — for the
    /// machinery peer, which a fresh machine cannot always build.
    pub fn is_built(self) -> bool {
        std::env::var_os(self.env_var()).is_some() || self.cache_path().is_file()
    }

    pub fn path(self) -> PathBuf {
        if let Some(p) = std::env::var_os(self.env_var()) {
            return PathBuf::from(p);
        }
        let path = self.cache_path();
        assert!(
            path.is_file(),
            "{} is not built at {}: run tools/testbin.sh (or make test), which builds it from its Go module{}",
            self.binary(),
            path.display(),
            if self == Tool::MachineryPeer {
                " (when the module proxy refuses the pinned version, set ICHOR_TALOS_MACHINERY_SRC to that module's source; tools/testbin.sh says how)"
            } else {
                ""
            }
        );
        path
    }
}

/// The real Cilium chart folder that `tools/testbin.sh` copies out of
/// Cilium's published Go module: `$ICHOR_CILIUM_CHART` when it names a
/// folder, else `<cache>/cilium-chart-<CILIUM_VERSION>`. `None` when neither
/// holds a `Chart.yaml` (the tools were not built).
pub fn cilium_chart() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ICHOR_CILIUM_CHART") {
        let p = PathBuf::from(p);
        if p.join("Chart.yaml").is_file() {
            return Some(p);
        }
    }
    let dir = cache_dir().join(format!("cilium-chart-{}", cilium_version()));
    dir.join("Chart.yaml").is_file().then_some(dir)
}

/// The real Cilium chart, or a panic naming the command that fetches it:
/// for tests whose claim needs the real chart.
pub fn require_cilium_chart() -> PathBuf {
    cilium_chart().unwrap_or_else(|| {
        panic!(
            "the real Cilium chart {} is not in {}: run tools/testbin.sh (or make test), which copies it out of the Go module github.com/cilium/cilium",
            cilium_version(),
            cache_dir().display()
        )
    })
}

/// The pinned Cilium version (`CILIUM_VERSION` in `tools/versions.env`).
pub fn cilium_version() -> String {
    pinned_version("CILIUM_VERSION")
}

/// `helm template` of the Cilium chart at `chart` with `values`, as release
/// `cilium` in `kube-system` for the test control plane's Kubernetes
/// version, by the real `helm` (`tool`); the rendered objects. Panics with
/// helm's words when it refuses.
pub fn template_cilium(
    tool: Tool,
    chart: &Path,
    values: &serde_json::Map<String, serde_json::Value>,
) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let file = dir.path().join("values.json");
    std::fs::write(&file, serde_json::to_vec(values).expect("values serialise"))
        .expect("write the values file");
    let out = std::process::Command::new(tool.path())
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .args(["template", "cilium"])
        .arg(chart)
        .args(["--namespace", "kube-system", "--kube-version"])
        .arg(Tool::KubeApiserver.version())
        .arg("--values")
        .arg(&file)
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "{tool:?} could not render the Cilium chart at {} with values {values:?}: {}",
        chart.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("helm prints UTF-8")
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str::<serde_json::Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect()
}

/// The root of the tools cache: `$ICHOR_TESTBIN_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/ichor/testbin`, as the script computes it.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ICHOR_TESTBIN_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("ichor").join("testbin")
}

/// The repository root (where `tools/versions.env` lives), resolved through
/// symlinks so that a workspace assembled from links still finds the real tree.
pub fn repo_root() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/<name>")
        .to_path_buf();
    std::fs::canonicalize(compiled.join("tools"))
        .ok()
        .and_then(|tools| tools.parent().map(Path::to_path_buf))
        .unwrap_or(compiled)
}

fn pinned_version(key: &str) -> String {
    let file = repo_root().join("tools/versions.env");
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| panic!("{key} is not set in {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_pinned_with_a_leading_v() {
        for tool in [
            Tool::KubeApiserver,
            Tool::Etcd,
            Tool::Helm3,
            Tool::Helm4,
            Tool::Talosctl,
            Tool::Crane,
            Tool::MachineryPeer,
            Tool::Age,
            Tool::AgeKeygen,
            Tool::Etcdutl,
            Tool::Etcdctl,
            Tool::Versitygw,
        ] {
            let v = tool.version();
            assert!(v.starts_with('v'), "{tool:?} version {v} lacks its v");
            // a pre-release (v1.14.0-rc.1) is pinned by its full name
            let release = v[1..].split_once('-').map_or(&v[1..], |(r, _)| r);
            assert!(semver_like(release), "{tool:?} version {v} is not x.y.z");
        }
        assert!(Tool::MachineryPeer.version().starts_with("v1.14."));
        assert!(Tool::Helm3.version().starts_with("v3."));
        assert!(Tool::Helm4.version().starts_with("v4."));
        let cilium = cilium_version();
        assert!(
            cilium.starts_with("v1.18."),
            "Cilium {cilium} is not 1.18.x"
        );
    }

    fn semver_like(s: &str) -> bool {
        let parts: Vec<_> = s.split('.').collect();
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok())
    }
}
