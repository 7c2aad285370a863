//! ImageService: pulling an image into one of the node's containerd stores.

use tonic::{Request, Response, Status};

use ichor_talos_client::proto::machine;
use ichor_talos_client::proto::machine::image_service_server::ImageService;

use super::{ADMIN, BoxStream, NodeApi, OPERATOR, caller};

#[tonic::async_trait]
impl ImageService for NodeApi {
    type PullStream = BoxStream<machine::ImageServicePullResponse>;

    async fn pull(
        &self,
        request: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR])?;
        let i = self.stream_target(request.metadata()).await?;
        let req = request.into_inner();
        let store = req.containerd.unwrap_or_default();
        let name = self
            .node(i)
            .pull_image(store.driver, store.namespace, &req.image_ref)?;
        use machine::image_service_pull_response::Response as Pull;
        let progress = machine::ImageServicePullResponse {
            response: Some(Pull::PullProgress(machine::ImageServicePullProgress {
                layer_id: "sha256:0000000000000000000000000000000000000000000000000000000000000000"
                    .to_string(),
                progress: Some(machine::ImageServicePullLayerProgress {
                    status: machine::image_service_pull_layer_progress::Status::ExtractComplete
                        as i32,
                    elapsed: None,
                    offset: 0,
                    total: 0,
                }),
            })),
        };
        let done = machine::ImageServicePullResponse {
            response: Some(Pull::Name(name)),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([
            Ok(progress),
            Ok(done),
        ]))))
    }
}
