//! Helpers the integration tests share: resources to write and snapshot plumbing.

use proto::cluster::v1::{SnapshotData, SnapshotSaveRequest};
use proto::resource::v1::{Id, ListRequest, Resource, Tenancy, Type};
use tokio_stream::StreamExt;

use crate::process::Resd;

/// `demo.v1.Artist`: no controller writes it, so tests see only their own writes.
pub(crate) fn artist_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Artist".into(),
    }
}

/// An artist id in the default tenancy (empty tenancy: the scope's defaults).
pub(crate) fn artist_id(name: &str) -> Id {
    Id {
        name: name.into(),
        r#type: Some(artist_type()),
        tenancy: Some(Tenancy::default()),
        ..Default::default()
    }
}

pub(crate) fn artist(name: &str) -> Resource {
    Resource {
        id: Some(artist_id(name)),
        data: Some(proto::to_any(&proto::demo::v1::Artist {
            name: name.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Every artist `node` holds, in every tenancy (a local, eventually consistent read).
pub(crate) async fn list_artists(node: &Resd) -> Vec<Resource> {
    node.resources()
        .await
        .list(ListRequest {
            r#type: Some(artist_type()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .resources
}

/// A snapshot file saved from `node`.
pub(crate) async fn save_snapshot(node: &Resd) -> Vec<u8> {
    save_snapshot_with(node, None).await
}

/// Uploads a snapshot file to `node` in 64 KiB chunks (`SnapshotRestore`).
pub(crate) async fn restore(
    node: &Resd,
    file: &[u8],
) -> Result<proto::cluster::v1::SnapshotRestoreResponse, tonic::Status> {
    restore_with(node, file, None).await
}

/// [`save_snapshot`] with a token.
pub(crate) async fn save_snapshot_as(node: &Resd, token: &str) -> Vec<u8> {
    save_snapshot_with(node, Some(token)).await
}

/// [`restore`] with a token.
pub(crate) async fn restore_as(
    node: &Resd,
    file: &[u8],
    token: &str,
) -> Result<proto::cluster::v1::SnapshotRestoreResponse, tonic::Status> {
    restore_with(node, file, Some(token)).await
}

async fn save_snapshot_with(node: &Resd, token: Option<&str>) -> Vec<u8> {
    let mut request = tonic::Request::new(SnapshotSaveRequest {});
    if let Some(token) = token {
        request.metadata_mut().insert(
            proto::TOKEN_HEADER,
            token.parse().expect("a token is valid metadata"),
        );
    }
    let mut stream = node
        .cluster()
        .await
        .snapshot_save(request)
        .await
        .expect("save")
        .into_inner();
    let mut file = Vec::new();
    while let Some(chunk) = stream.next().await {
        file.extend_from_slice(&chunk.expect("chunk").data);
    }
    file
}

async fn restore_with(
    node: &Resd,
    file: &[u8],
    token: Option<&str>,
) -> Result<proto::cluster::v1::SnapshotRestoreResponse, tonic::Status> {
    let chunks: Vec<SnapshotData> = file
        .chunks(64 * 1024)
        .map(|c| SnapshotData { data: c.to_vec() })
        .collect();
    let mut request = tonic::Request::new(tokio_stream::iter(chunks));
    if let Some(token) = token {
        request.metadata_mut().insert(
            proto::TOKEN_HEADER,
            token.parse().expect("a token is valid metadata"),
        );
    }
    node.cluster()
        .await
        .snapshot_restore(request)
        .await
        .map(|reply| reply.into_inner())
}
