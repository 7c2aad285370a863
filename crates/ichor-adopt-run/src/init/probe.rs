//! Reading the nodes, read-only: over the insecure maintenance API, or
//! with the cluster's own credentials when an earlier run configured them.

use std::time::Duration;

use ichor_adopt::init::{NodeAnswer, NodeProbe};
use ichor_api::error_text::{chain, with_help};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::Role;
use ichor_talos_client::{CertFingerprint, ClientIdentity, ClientOptions, TalosClient};

use crate::error::{AdoptError, talos};

use super::{InitOptions, read_state};

pub(super) fn client_options() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// An `os:admin` client of one node, with the cluster's own credentials.
pub(super) fn admin_client(
    opts: &InitOptions,
    bundle: &SecretsBundle,
    address: &str,
) -> Result<TalosClient, AdoptError> {
    let cert = ichor_talos::talosconfig::generate_client_certificate(
        bundle,
        Role::Admin,
        Duration::from_secs(3600),
    )
    .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
    let (ca, _) = bundle
        .os_ca_pem()
        .ok_or_else(|| AdoptError::Secrets("the bundle has no OS CA".into()))?;
    let key = ichor_talos::pem::relabel(&cert.key_pem, "PRIVATE KEY").unwrap_or(cert.key_pem);
    let identity = ClientIdentity::from_pem(ca, cert.crt_pem, key);
    TalosClient::new(&opts.endpoint(address), &identity, client_options())
        .map_err(talos(format!("making an admin client of node {address}")))
}

/// Reads one node, read-only: over the insecure API when it is in
/// maintenance mode (with the fingerprint of the certificate it presents);
/// with the cluster's own credentials when an earlier run of this init
/// configured it (then it is not a refusal, and not applied again).
pub(super) async fn probe(
    opts: &InitOptions,
    bundle: &SecretsBundle,
    address: &str,
) -> (NodeProbe, Option<CertFingerprint>) {
    let (answer, fingerprint) = match maintenance_answer(opts, address).await {
        Ok((answer, fingerprint)) => (answer, Some(fingerprint)),
        Err(insecure) => match initialized_answer(opts, bundle, address).await {
            Some(answer) => (answer, None),
            None => (insecure, None),
        },
    };
    let probe = NodeProbe {
        address: address.to_string(),
        answer,
    };
    (probe, fingerprint)
}

async fn maintenance_answer(
    opts: &InitOptions,
    address: &str,
) -> Result<(NodeAnswer, CertFingerprint), NodeAnswer> {
    let endpoint = opts.endpoint(address);
    // The certificate comes first: the plan shows it, and the reads that
    // follow go only to a server that presents it.
    let seen =
        ichor_talos_client::server_fingerprint(&endpoint, client_options().connect_timeout).await;
    let c = match &seen {
        Ok(fp) => TalosClient::maintenance_pinned(&endpoint, &[*fp], client_options()),
        // Nothing to pin: the calls below then say what is wrong, as before.
        Err(_) => TalosClient::maintenance(&endpoint, client_options()),
    }
    .map_err(|e| NodeAnswer::Unreachable { error: chain(&e) })?;
    let version = match c.version("").await {
        Ok(v) => v,
        Err(e) if looks_unreachable(&e) => {
            return Err(NodeAnswer::Unreachable { error: chain(&e) });
        }
        Err(e) => {
            return Err(NodeAnswer::Configured {
                detail: format!("its insecure API refuses: {}", chain(&e)),
            });
        }
    };
    let stage =
        c.machine_status("")
            .await
            .map(|s| s.stage)
            .map_err(|e| NodeAnswer::Configured {
                detail: format!("its machine status cannot be read: {}", chain(&e)),
            })?;
    if stage != 3 {
        return Err(NodeAnswer::Configured {
            detail: format!("its machine stage is {stage}, not maintenance"),
        });
    }
    let hostname = c
        .hostname("")
        .await
        .map_err(|e| NodeAnswer::Unreachable { error: chain(&e) })?;
    let disks = c
        .disks("")
        .await
        .map_err(|e| NodeAnswer::Unreachable { error: chain(&e) })?;
    let fingerprint = seen.map_err(|e| NodeAnswer::Unreachable {
        error: format!(
            "the certificate of its maintenance API cannot be read: {}",
            chain(&e)
        ),
    })?;
    let answer = NodeAnswer::Maintenance {
        hostname,
        talos_version: version.tag,
        disks: disks.into_iter().map(|(_, d)| d.dev_path).collect(),
    };
    Ok((answer, fingerprint))
}

/// Nothing listens there (as opposed to a node that answers, but not insecurely).
pub fn looks_unreachable(e: &ichor_talos_client::Error) -> bool {
    if matches!(e, ichor_talos_client::Error::Timeout { .. }) {
        return true;
    }
    let text = chain(e).to_lowercase();
    [
        "connection refused",
        "tcp connect",
        "no route to host",
        "timed out",
        "deadline",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// A node this init configured before (it answers the cluster's credentials):
/// what it reported then, from the state file, so the plan is the same.
async fn initialized_answer(
    opts: &InitOptions,
    bundle: &SecretsBundle,
    address: &str,
) -> Option<NodeAnswer> {
    let c = admin_client(opts, bundle, address).ok()?;
    c.version("").await.ok()?;
    let state = read_state(&opts.output_dir)?;
    let node = state
        .plan
        .nodes
        .into_iter()
        .find(|n| n.address == address)?;
    Some(NodeAnswer::Initialized {
        hostname: node.name,
        talos_version: node.talos_version,
        disks: vec![node.install_disk],
    })
}
