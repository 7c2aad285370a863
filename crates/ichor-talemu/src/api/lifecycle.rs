//! LifecycleService: an upgrade that writes the installer to the other boot
//! slot (the node boots it at its next reboot).

use tonic::{Request, Response, Status};

use ichor_talos_client::proto::machine;
use ichor_talos_client::proto::machine::lifecycle_service_server::LifecycleService;

use super::{ADMIN, BoxStream, NodeApi, caller};

#[tonic::async_trait]
impl LifecycleService for NodeApi {
    type UpgradeStream = BoxStream<machine::LifecycleServiceUpgradeResponse>;

    async fn upgrade(
        &self,
        request: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let i = self.stream_target(request.metadata()).await?;
        let req = request.into_inner();
        let store = req.containerd.unwrap_or_default();
        let image = req.source.map(|s| s.image_name).unwrap_or_default();
        let lines = self
            .node(i)
            .lifecycle_upgrade(store.driver, store.namespace, &image)?;
        use machine::lifecycle_service_install_progress::Response as Progress;
        let progress = |p| {
            Ok(machine::LifecycleServiceUpgradeResponse {
                progress: Some(machine::LifecycleServiceInstallProgress { response: Some(p) }),
            })
        };
        let mut out: Vec<Result<_, Status>> = lines
            .into_iter()
            .map(|l| progress(Progress::Message(l)))
            .collect();
        out.push(progress(Progress::ExitCode(0)));
        Ok(Response::new(Box::pin(futures::stream::iter(out))))
    }
}
