//! The gRPC handlers: metadata (token, consistency) and the error mapping.

use std::sync::Arc;

use proto::resource::v1::resource_service_server::ResourceService as _;
use tonic::{Code, Request};

use super::*;
use crate::acl::{AclsDisabled, KeyRules, StaticTokens, TokenResolver};
use crate::service::grpc::{CONSISTENCY_HEADER, ResourceGrpc, TOKEN_HEADER};

async fn grpc(tokens: Arc<dyn TokenResolver>) -> ResourceGrpc {
    let h = harness().await;
    ResourceGrpc::new(Arc::new(h.service), tokens)
}

fn read_request(metadata: &[(&'static str, &str)]) -> Request<ReadRequest> {
    let mut request = Request::new(ReadRequest {
        id: Some(id("tenancy.v1.Partition", default_ns(), "default")),
    });
    for (key, value) in metadata {
        request
            .metadata_mut()
            .insert(*key, value.parse().expect("ascii metadata"));
    }
    request
}

#[tokio::test]
async fn a_request_without_a_token_is_unauthenticated_when_acls_are_on() {
    let tokens = StaticTokens::new().with_token(
        "operator",
        KeyRules::default()
            .operator(crate::acl::Access::Write)
            .key_prefix("resource/", crate::acl::Access::Write),
    );
    let grpc = grpc(Arc::new(tokens)).await;
    let status = grpc.read(read_request(&[])).await.expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains(TOKEN_HEADER),
        "{}",
        status.message()
    );
    let status = grpc
        .read(read_request(&[(TOKEN_HEADER, "wrong")]))
        .await
        .expect_err("unknown token");
    assert_eq!(status.code(), Code::Unauthenticated);
    grpc.read(read_request(&[(TOKEN_HEADER, "operator")]))
        .await
        .expect("known token");
}

#[tokio::test]
async fn a_request_without_a_token_is_allowed_when_acls_are_off() {
    let grpc = grpc(Arc::new(AclsDisabled)).await;
    grpc.read(read_request(&[])).await.expect("ACLs off");
}

#[tokio::test]
async fn the_consistency_header_accepts_consistent_and_rejects_unknown_modes() {
    let grpc = grpc(Arc::new(AclsDisabled)).await;
    grpc.read(read_request(&[(CONSISTENCY_HEADER, "consistent")]))
        .await
        .expect("consistent read");
    let status = grpc
        .read(read_request(&[(CONSISTENCY_HEADER, "linearizable-please")]))
        .await
        .expect_err("unknown mode");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains(CONSISTENCY_HEADER),
        "{}",
        status.message()
    );
}

#[test]
fn every_error_maps_to_its_grpc_code() {
    let cases = [
        (Error::InvalidArgument("x".into()), Code::InvalidArgument),
        (Error::NotFound("x".into()), Code::NotFound),
        (Error::CasFailed("x".into()), Code::Aborted),
        (Error::UidMismatch("x".into()), Code::FailedPrecondition),
        (Error::PermissionDenied("x".into()), Code::PermissionDenied),
        (Error::Unauthenticated("x".into()), Code::Unauthenticated),
        (Error::Unavailable("x".into()), Code::Unavailable),
        (Error::Aborted("x".into()), Code::Aborted),
        (Error::OutOfRange("x".into()), Code::OutOfRange),
        (Error::Internal("x".into()), Code::Internal),
    ];
    for (error, code) in cases {
        assert_eq!(tonic::Status::from(error.clone()).code(), code, "{error:?}");
    }
}

#[test]
fn storage_errors_map_to_the_codes_of_the_contract() {
    let cases = [
        (StorageError::NotFound, Code::NotFound),
        (StorageError::CasFailure, Code::Aborted),
        (StorageError::WrongUid, Code::FailedPrecondition),
        (
            StorageError::Inconsistent("no leader".into()),
            Code::Unavailable,
        ),
        (StorageError::WatchClosed("behind".into()), Code::Aborted),
        (
            StorageError::ResumeUnavailable("old".into()),
            Code::OutOfRange,
        ),
        (StorageError::Internal("disk".into()), Code::Internal),
    ];
    for (error, code) in cases {
        assert_eq!(
            tonic::Status::from(Error::from(error.clone())).code(),
            code,
            "{error:?}"
        );
    }
    let cas = tonic::Status::from(Error::from(StorageError::CasFailure));
    assert!(
        cas.message().starts_with("CAS operation failed"),
        "{}",
        cas.message()
    );
    let uid = tonic::Status::from(Error::from(StorageError::WrongUid));
    assert!(
        uid.message().starts_with("uid doesn't match"),
        "{}",
        uid.message()
    );
}
