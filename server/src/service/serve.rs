//! Hosts the gRPC services on a listener: resource and cluster services, gRPC health, and server
//! reflection (v1 and v1alpha, so old and new grpcurl both work), until shutdown.

use std::sync::Arc;

use proto::cluster::v1::cluster_service_server::ClusterServiceServer;
use proto::resource::v1::resource_service_server::ResourceServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use super::ResourceService;
use super::cluster::ClusterGrpc;
use super::grpc::ResourceGrpc;
use crate::acl::TokenResolver;

/// Room above the resource limit for the request envelope, so an oversized resource reaches the
/// service and gets its clear message rather than a transport error.
const REQUEST_ENVELOPE_SLACK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Accepted connections with `TCP_NODELAY` set: without it, small gRPC frames wait on Nagle's
/// algorithm and the peer's delayed ACK (tens of milliseconds per request). tonic only sets it
/// on listeners it binds itself.
pub fn nodelay_incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// Serves until `shutdown` is cancelled, then stops accepting, lets open watches end (they are
/// tied to the same token) and returns once in-flight requests have finished.
pub async fn serve(
    listener: TcpListener,
    service: Arc<ResourceService>,
    tokens: Arc<dyn TokenResolver>,
    cluster: ClusterGrpc,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let max_message = service.max_resource_bytes() + REQUEST_ENVELOPE_SLACK;

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ResourceServiceServer<ResourceGrpc>>()
        .await;
    health_reporter
        .set_serving::<ClusterServiceServer<ClusterGrpc>>()
        .await;

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let resource_service = ResourceServiceServer::new(ResourceGrpc::new(service, tokens))
        .max_decoding_message_size(max_message);
    let cluster_service = ClusterServiceServer::new(cluster);

    let stopping = shutdown.clone();
    let reporter = health_reporter.clone();
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(resource_service)
        .add_service(cluster_service)
        .serve_with_incoming_shutdown(nodelay_incoming(listener), async move {
            stopping.cancelled().await;
            reporter
                .set_not_serving::<ResourceServiceServer<ResourceGrpc>>()
                .await;
            reporter
                .set_not_serving::<ClusterServiceServer<ClusterGrpc>>()
                .await;
        })
        .await?;
    Ok(())
}
