//! `ichor controller`: flags into `ichor_controller::Config`.

use anyhow::Context as _;
use ichor_controller::{Config, DeployedBy, LeaderElection, WebhookServer};

use crate::args::ControllerArgs;
use crate::connect;

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let deployed_by: DeployedBy = args.deployed_by.parse().map_err(anyhow::Error::msg)?;
    let config = Config {
        namespace: args.namespace,
        deployed_by,
        http_addr: args.http_addr,
        webhook: args
            .webhook_addr
            .zip(args.webhook_cert_secret)
            .map(|(addr, cert_secret)| WebhookServer {
                cert_secret,
                ..WebhookServer::new(addr)
            }),
        leader_election: (!args.no_leader_election).then(LeaderElection::default),
        resync: args.resync,
        cni_job_image: args.cni_job_image,
        operation_bounds: ichor_controller::operation::OperationBounds {
            drain: args.drain_timeout,
            etcd: args.etcd_timeout,
            image: args.image_timeout,
            ..Default::default()
        },
        backup_volume: args.backup_volume_claim.map(|claim_name| {
            ichor_controller::backup::volume::BackupVolume {
                claim_name,
                root: ichor_controller::backup::volume::ROOT.into(),
            }
        }),
        ..Config::default()
    };
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    // SIGTERM (a pod's stop) or Ctrl-C: the Lease is handed back at once.
    ichor_controller::run_with(client, config, ichor_controller::shutdown_signal())
        .await
        .context("the controller stopped")
}
