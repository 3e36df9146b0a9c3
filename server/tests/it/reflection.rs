//! gRPC health and server reflection (v1 and v1alpha), so grpcurl works without proto files.

use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{v1, v1alpha};

use crate::process::Resd;

#[tokio::test]
async fn reflection_v1_lists_the_services_and_resolves_data_messages() {
    let resd = Resd::start();
    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(resd.channel().await);
    let requests = tokio_stream::iter(vec![
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        },
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                    "resd.demo.v2.Artist".into(),
                ),
            ),
        },
    ]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .expect("reflection")
        .into_inner();

    let listed = responses.next().await.expect("a response").expect("ok");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "resd.resource.v1.ResourceService",
        "resd.cluster.v1.ClusterService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    // The raft service is served on the raft port only: the API port does not advertise it.
    assert!(
        !names.iter().any(|n| n.contains("RaftService")),
        "{names:?}"
    );

    let file = responses.next().await.expect("a response").expect("ok");
    let Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        file.message_response
    else {
        panic!("expected a file descriptor, got {file:?}");
    };
    assert!(
        !files.file_descriptor_proto.is_empty(),
        "the Artist message resolves by its full name"
    );
}

#[tokio::test]
async fn reflection_v1alpha_lists_the_services_for_older_clients() {
    let resd = Resd::start();
    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(resd.channel().await);
    let requests = tokio_stream::iter(vec![v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    }]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .expect("reflection")
        .into_inner();
    let listed = responses.next().await.expect("a response").expect("ok");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "resd.resource.v1.ResourceService")
    );
}

#[tokio::test]
async fn health_reports_the_resource_service_serving() {
    let resd = Resd::start();
    let mut health = HealthClient::new(resd.channel().await);
    for service in [
        "",
        "resd.resource.v1.ResourceService",
        "resd.cluster.v1.ClusterService",
    ] {
        let response = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner();
        assert_eq!(
            response.status(),
            ServingStatus::Serving,
            "service {service:?}"
        );
    }
}
