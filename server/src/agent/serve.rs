//! Hosts a node's gRPC servers until shutdown: the public API (resource and cluster services,
//! gRPC health, server reflection v1 and v1alpha so old and new grpcurl both work) and the
//! internal raft service. Both accept through [`crate::tls::accept`] (plain or TLS, with
//! `TCP_NODELAY`) and share the refinement of the status codes tonic gives broken requests.

use std::sync::Arc;

use proto::cluster::v1::cluster_service_server::ClusterServiceServer;
use proto::resource::v1::resource_service_server::ResourceServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::metrics::Metrics;
use crate::metrics::grpc::GrpcMetricsLayer;
use crate::service::ResourceService;
use crate::service::cluster::ClusterGrpc;
use crate::service::grpc::ResourceGrpc;
use crate::storage::raft::network::RaftGrpc;
use crate::storage::raft::node::RaftNode;
use crate::tls::accept::Listening;

/// Room above the resource limit for the request envelope, so an oversized resource reaches the
/// service and gets its clear message rather than a transport error.
pub(crate) const REQUEST_ENVELOPE_SLACK: usize = 64 * 1024;

/// The public API's services.
pub(super) struct Api {
    pub service: Arc<ResourceService>,
    pub resources: ResourceGrpc,
    pub cluster: ClusterGrpc,
    pub metrics: Arc<Metrics>,
    /// What each caller may hold; every request is admitted against it before its body is read.
    pub limits: Arc<crate::limits::Limits>,
    /// Where every request is logged (`--audit-log`), if anywhere.
    pub audit: Option<crate::audit::AuditLog>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// What tonic answers a request it cannot decode, refined: a message that is not valid protobuf
/// (or holds invalid UTF-8) is the client's mistake, `InvalidArgument` rather than `Internal`;
/// one over the size limit is `ResourceExhausted` naming the limit rather than `OutOfRange`.
/// Only answers that are nothing but a status (the header form) are rewritten: that is how
/// tonic refuses a request before any handler runs.
pub(super) fn refine_status<B>(mut response: http::Response<B>) -> http::Response<B> {
    let Some(status) = tonic::Status::from_header_map(response.headers()) else {
        return response;
    };
    let refined = match status.code() {
        Code::Internal
            if status
                .message()
                .starts_with("failed to decode Protobuf message") =>
        {
            tonic::Status::from(crate::service::Error::InvalidArgument(format!(
                "the request is not a valid message of this method: {}",
                status.message()
            )))
        }
        Code::OutOfRange
            if status
                .message()
                .contains("decoded message length too large") =>
        {
            let detail = status
                .message()
                .strip_prefix("Error, decoded message length too large: ")
                .unwrap_or(status.message());
            tonic::Status::from(crate::service::Error::ResourceExhausted(format!(
                "the request is larger than this server accepts ({detail}); resources are limited by --max-resource-bytes"
            )))
        }
        _ => return response,
    };
    let fresh = refined.into_http::<()>();
    for (name, value) in fresh.headers() {
        if name.as_str().starts_with("grpc-") {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}

/// Serves the public API until `shutdown` is cancelled, then stops accepting, lets open watches
/// end (they are tied to the same token) and returns once in-flight requests have finished.
pub(super) async fn serve_api(
    listener: TcpListener,
    listening: Listening,
    api: Api,
    raft: Option<Arc<RaftNode>>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let Api {
        service,
        resources,
        cluster,
        metrics,
        limits,
        audit,
    } = api;
    let max_message = service.max_resource_bytes() + REQUEST_ENVELOPE_SLACK;

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    // A raft node's health is its watch's to say (below), from the first check on.
    if raft.is_none() {
        set_serving(&health_reporter).await;
    } else {
        set_not_serving(&health_reporter).await;
    }
    // Health follows the node as `/readyz` does (DESIGN §13): NOT_SERVING for every reason it
    // gives — catching up after an unclean stop, removed, damaged, not a voter, no leader known
    // (a quorum lost) — checked on every readiness change and at least every half second, and
    // for good once its raft has stopped.
    let health_watch = raft.map(|raft| {
        let reporter = health_reporter.clone();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            let mut readiness = raft.readiness();
            let halted = raft.halted();
            tokio::pin!(halted);
            let mut tick = tokio::time::interval(HEALTH_CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut shown: Option<bool> = None;
            loop {
                let serving = raft.serving();
                if shown != Some(serving.is_ok()) {
                    match &serving {
                        Ok(()) => set_serving(&reporter).await,
                        Err(why) => {
                            if shown.is_some() {
                                tracing::warn!(%why, "reporting NOT_SERVING on gRPC health");
                            }
                            set_not_serving(&reporter).await;
                        }
                    }
                    shown = Some(serving.is_ok());
                }
                tokio::select! {
                    () = stopping.cancelled() => return,
                    reason = &mut halted => {
                        if let Some(reason) = reason {
                            tracing::error!(%reason, "raft stopped on this node; reporting NOT_SERVING");
                            set_not_serving(&reporter).await;
                        }
                        return;
                    }
                    changed = readiness.changed() => if changed.is_err() { return },
                    _ = tick.tick() => {}
                }
            }
        })
    });

    // Reflection follows the registry: types registered at runtime are reflected too.
    let reflection = super::reflection::Reflection::new(service.registry().clone());
    let reflection_v1 = super::reflection::v1_service(reflection.clone());
    let reflection_v1alpha = super::reflection::v1alpha_service(reflection);

    let resource_service = crate::service::encoded::ResourceApi::new(resources, max_message);
    let cluster_service = ClusterServiceServer::new(cluster);

    let stopping = shutdown.clone();
    let reporter = health_reporter.clone();
    let reflection_v1 =
        reflection_v1.max_decoding_message_size(crate::limits::ANONYMOUS_BODY_BYTES);
    let reflection_v1alpha =
        reflection_v1alpha.max_decoding_message_size(crate::limits::ANONYMOUS_BODY_BYTES);
    let served = with_connection_limits(tonic::transport::Server::builder())
        .layer(GrpcMetricsLayer::new(metrics))
        .layer(crate::audit::AuditLayer::new(audit))
        .layer(tower::util::MapResponseLayer::new(
            refine_status::<tonic::body::Body>,
        ))
        .layer(crate::limits::guard::GrpcGuardLayer::new(limits))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(resource_service)
        .add_service(cluster_service)
        .serve_with_incoming_shutdown(listening.incoming_grpc(listener, "API"), async move {
            stopping.cancelled().await;
            set_not_serving(&reporter).await;
        });
    let served = within_grace(served, &shutdown, "API").await;
    if let Some(task) = health_watch {
        task.abort();
        let _ = task.await;
    }
    served?;
    Ok(())
}

/// The whole server's status (service `""`, what load balancers and `grpc_health_probe` ask
/// for by default) follows the node's readiness with the services'.
/// How often health is checked against `/readyz`'s reasons besides readiness changes (a
/// leader lost shows within this).
const HEALTH_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

async fn set_serving(reporter: &tonic_health::server::HealthReporter) {
    reporter
        .set_serving::<ResourceServiceServer<ResourceGrpc>>()
        .await;
    reporter
        .set_serving::<ClusterServiceServer<ClusterGrpc>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
}

async fn set_not_serving(reporter: &tonic_health::server::HealthReporter) {
    reporter
        .set_not_serving::<ResourceServiceServer<ResourceGrpc>>()
        .await;
    reporter
        .set_not_serving::<ClusterServiceServer<ClusterGrpc>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
}

/// A connection whose peer does not answer a ping within this long is closed.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The per-connection HTTP/2 limits of a public port: streams, header size, pings that find
/// dead peers, and few resets a client may provoke.
fn with_connection_limits(server: tonic::transport::Server) -> tonic::transport::Server {
    server
        .max_concurrent_streams(crate::limits::MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(crate::limits::MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .http2_max_pending_accept_reset_streams(Some(64))
}

/// Serves the raft service on `listener` until `shutdown` is cancelled.
pub(super) async fn serve_raft(
    listener: TcpListener,
    listening: Listening,
    raft: RaftGrpc,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let served = with_connection_limits(tonic::transport::Server::builder())
        .tcp_nodelay(true)
        // Appends from a leader travel on one long-lived stream per peer: HTTP/2's default
        // 64 KiB window would hold a batch of appends back for window updates.
        .initial_stream_window_size(crate::storage::raft::network::STREAM_WINDOW)
        .initial_connection_window_size(crate::storage::raft::network::CONNECTION_WINDOW)
        .layer(GrpcMetricsLayer::new(metrics))
        .layer(tower::util::MapResponseLayer::new(
            refine_status::<tonic::body::Body>,
        ))
        .add_service(raft.with_shutdown(shutdown.clone()).into_server())
        .serve_with_incoming_shutdown(
            listening.incoming_grpc(listener, "raft service"),
            shutdown.clone().cancelled_owned(),
        );
    within_grace(served, &shutdown, "raft").await
}

/// How long a server may take, once the node is stopping, to finish what is in flight.
pub(super) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a server; once `shutdown` is cancelled it has [`SHUTDOWN_GRACE`] to finish its
/// in-flight requests and streams, then it is dropped, which closes what is left: a client
/// that keeps a request open cannot keep the node from stopping.
async fn within_grace<E>(
    served: impl Future<Output = Result<(), E>>,
    shutdown: &CancellationToken,
    server: &'static str,
) -> Result<(), E> {
    tokio::pin!(served);
    tokio::select! {
        result = &mut served => result,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(
                server,
                grace_seconds = SHUTDOWN_GRACE.as_secs(),
                "requests were still open when the shutdown grace period ended; closing their connections"
            );
            Ok(())
        }
    }
}
