//! A pod's process: its ServiceAccount's token, its command line and its
//! start as the local `ichor` binary.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ichor_api::endpoint::Endpoint;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::ProcessRunner;
use super::kubelet::{BACKOFF_FIRST, PodProcess};
use super::volumes::{Mount, VolumeError, project_volume};

/// How long a token the lab requests lives (the lab is short-lived).
const TOKEN_SECONDS: i64 = 24 * 3600;

/// Why a ServiceAccount's kubeconfig could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("requesting a token of ServiceAccount {namespace}/{service_account}")]
    Request {
        namespace: String,
        service_account: String,
        #[source]
        source: kube::Error,
    },
    #[error("the TokenRequest of {namespace}/{service_account} has no token")]
    NoToken {
        namespace: String,
        service_account: String,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a pod's process did not start (the kubelet's reason, shown in the
/// pod's status until the next attempt).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("opening {path}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A kubeconfig for `namespace/service_account` with a fresh token from the
/// TokenRequest API, written to `path`.
pub async fn token_kubeconfig(
    client: &kube::Client,
    runner: &ProcessRunner,
    namespace: &str,
    service_account: &str,
    path: &Path,
) -> Result<(), TokenError> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .map_err(|source| TokenError::Request {
            namespace: namespace.into(),
            service_account: service_account.into(),
            source,
        })?
        .status
        .map(|s| s.token)
        .ok_or_else(|| TokenError::NoToken {
            namespace: namespace.into(),
            service_account: service_account.into(),
        })?;
    let ca = serde_json::to_value(k8s_openapi::ByteString(runner.ca_pem.clone().into_bytes()))
        .expect("bytes serialise");
    let user = format!("system:serviceaccount:{namespace}:{service_account}");
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": runner.server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user, "namespace": namespace}}],
        "current-context": "lab",
    });
    let text = serde_yaml_ng::to_string(&doc).expect("kubeconfig serialises");
    std::fs::write(path, text).map_err(|source| TokenError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The command line of a container run as the local binary: the command's
/// first word (the image's path of `ichor`) replaced, then the args; every
/// `HOST:PORT` whose port is mapped rewritten to the pod's address.
/// A path under a volume's `mountPath` becomes the same path under the
/// lab's projection of that volume.
pub fn command_line(
    container: &Container,
    ip: Ipv4Addr,
    ports: &BTreeMap<u16, u16>,
    mounts: &[Mount],
) -> Vec<String> {
    let mut words: Vec<String> = container
        .command
        .clone()
        .unwrap_or_default()
        .into_iter()
        .skip(1)
        .collect();
    words.extend(container.args.clone().unwrap_or_default());
    words
        .into_iter()
        .map(|w| match ip_port(&w) {
            Some(port) => ports
                .get(&port)
                .map_or(w, |mapped| format!("{ip}:{mapped}")),
            None => mounted_path(&w, mounts).unwrap_or(w),
        })
        .collect()
}

/// The port of a word that is an IP address and a port (`0.0.0.0:8080`,
/// `[::]:8080`), read by the one endpoint parser.
fn ip_port(word: &str) -> Option<u16> {
    let e = Endpoint::parse_with_port(word).ok()?;
    e.host.parse::<IpAddr>().is_ok().then_some(e.port)
}

/// `word` as a path inside the lab's projection of a mounted volume, when it
/// names one (the mount path itself or a path below it).
fn mounted_path(word: &str, mounts: &[Mount]) -> Option<String> {
    mounts.iter().find_map(|m| {
        let base = m.mount_path.trim_end_matches('/');
        let rest = word.strip_prefix(base)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| format!("{}{rest}", m.dir.display()))
    })
}

/// What a pod's process is started from.
pub(super) struct PodRun<'a> {
    pub(super) ns: &'a str,
    pub(super) service_account: &'a str,
    pub(super) container: &'a Container,
    pub(super) mounts: &'a [Mount],
}

/// Starts the pod's process; a failure is logged and retried after the
/// first back-off.
pub(super) async fn start_pod_process(
    client: &kube::Client,
    runner: &ProcessRunner,
    pod: &PodRun<'_>,
    p: &mut PodProcess,
) {
    match start_process(client, runner, pod, p).await {
        Ok(child) => {
            p.child = Some(child);
            p.started_at = Some(Instant::now());
        }
        Err(e) => {
            let why = ichor_api::error_text::chain(&e);
            tracing::warn!("lab kubelet: starting pod {}/{}: {why}", pod.ns, p.name);
            p.last_exit = Some(why);
            p.next_start = Instant::now() + BACKOFF_FIRST;
        }
    }
}

async fn start_process(
    client: &kube::Client,
    runner: &ProcessRunner,
    pod: &PodRun<'_>,
    p: &PodProcess,
) -> Result<tokio::process::Child, StartError> {
    let PodRun {
        ns,
        service_account,
        container,
        mounts,
    } = *pod;
    // As the kubelet: no container without its volumes.
    for m in mounts {
        project_volume(client, ns, m).await?;
    }
    let kubeconfig = runner
        .state_dir
        .join(format!("pod-{ns}-{}.kubeconfig", p.name));
    token_kubeconfig(client, runner, ns, service_account, &kubeconfig).await?;
    let log_path = runner.state_dir.join(format!("pod-{ns}-{}.log", p.name));
    let opening = |source| StartError::Log {
        path: log_path.clone(),
        source,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(opening)?;
    let log2 = log.try_clone().map_err(opening)?;
    let std_cmd = {
        let mut c = ichor_testenv::command_dying_with_parent(&runner.ichor);
        c.args(command_line(container, p.ip, &p.ports, mounts));
        for e in container.env.iter().flatten() {
            if let Some(v) = &e.value {
                c.env(&e.name, v);
            }
            // The downward API's node name, as the kubelet fills it in.
            let field = e.value_from.as_ref().and_then(|f| f.field_ref.as_ref());
            if field.is_some_and(|f| f.field_path == "spec.nodeName") {
                c.env(&e.name, &p.node);
            }
        }
        c.env("KUBECONFIG", &kubeconfig)
            .env("ICHOR_HELM", &runner.helm)
            .env("ICHOR_CILIUM_CHART", &runner.cilium_chart)
            .env("NO_COLOR", "1")
            .envs(runner.ichor_log.iter().map(|f| ("ICHOR_LOG", f)))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        c
    };
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd.kill_on_drop(true);
    cmd.spawn().map_err(|source| StartError::Spawn {
        binary: runner.ichor.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One word as the command line rewrote it before the one parser.
    fn old_rewrite(w: String, ip: Ipv4Addr, ports: &BTreeMap<u16, u16>) -> String {
        match w.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && (host.parse::<std::net::IpAddr>().is_ok()
                        || host
                            .trim_matches(['[', ']'])
                            .parse::<std::net::IpAddr>()
                            .is_ok()) =>
            {
                match port.parse::<u16>().ok().and_then(|p| ports.get(&p)) {
                    Some(mapped) => format!("{ip}:{mapped}"),
                    None => w,
                }
            }
            _ => w,
        }
    }

    /// Words near every rule: `ip:port` with IPv4 and IPv6 (bare,
    /// bracketed), DNS names, ports in and out of range, flags, garbage
    /// with `:` `[` `]` `/` `@`.
    fn word() -> impl Strategy<Value = String> {
        let host = prop_oneof![
            any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
            Just("0.0.0.0".to_string()),
            Just("[::]".to_string()),
            "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,2}",
            "[a-zA-Z0-9.:\\[\\]/@=_-]{0,16}",
            Just(String::new()),
        ];
        let port = prop_oneof![
            Just(String::new()),
            prop_oneof![Just(8080u32), Just(9443), 0u32..=70000].prop_map(|p| format!(":{p}")),
            ":[0-9a-z+:]{0,7}",
        ];
        prop_oneof![
            4 => (host, port).prop_map(|(h, p)| format!("{h}{p}")),
            1 => any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// A word is rewritten as before, but where the old reading took a
        /// word that is no `ip:port` for one: a bare IPv6 address (its last
        /// group read as the port), an unclosed or doubled bracket.
        #[test]
        fn the_one_parser_rewrites_a_word_as_the_command_line_did(w in word()) {
            let ports = BTreeMap::from([(8080, 31000), (9443, 31001)]);
            let ip = Ipv4Addr::new(127, 9, 9, 10);
            let old = old_rewrite(w.clone(), ip, &ports);
            let new = command_line(
                &Container { command: Some(vec!["/ichor".into()]), args: Some(vec![w.clone()]), ..Container::default() },
                ip,
                &ports,
                &[],
            );
            prop_assert_eq!(new.len(), 1);
            if new[0] != old {
                prop_assert_eq!(&new[0], &w, "only the old reading rewrote {:?}", w);
                let is_ip_port = Endpoint::parse_with_port(&w)
                    .is_ok_and(|e| e.host.parse::<IpAddr>().is_ok());
                prop_assert!(!is_ip_port, "{:?}", w);
            }
        }
    }

    #[test]
    fn declared_ports_are_mapped_to_the_pods_address_and_nothing_else() {
        let container: Container = serde_json::from_value(json!({
            "name": "controller", "image": "ghcr.io/maeshinshin/ichor-controller:v0.1.0",
            "command": ["/ichor"],
            "args": ["controller", "--http-addr", "0.0.0.0:8080", "--webhook-addr", "0.0.0.0:9443",
                "--resync", "5m", "--other", "10.0.0.1:7000"]
        }))
        .unwrap();
        let ports = BTreeMap::from([(8080, 31000), (9443, 31001)]);
        let ip = Ipv4Addr::new(127, 9, 9, 10);
        assert_eq!(
            command_line(&container, ip, &ports, &[]),
            [
                "controller",
                "--http-addr",
                "127.9.9.10:31000",
                "--webhook-addr",
                "127.9.9.10:31001",
                "--resync",
                "5m",
                "--other",
                "10.0.0.1:7000"
            ]
        );
    }
}
