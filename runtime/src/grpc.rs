//! [`Api`] over a cluster client (`proto::client::Client`: several servers, failover, TLS, a
//! token), for a controller program of its own. Its watches resume across disconnections and
//! failovers ([`proto::client::Watcher`]); one the server cannot resume ends with
//! [`ApiError::Relist`], and the controller starts over from a fresh snapshot.

use futures::StreamExt;
use proto::client::{Client, ClientError, WatchUpdate};
use proto::resource::v1::{Id, Resource, Status, Tenancy, Type, WatchListRequest};

use crate::api::{Api, ApiError, EventStream};

impl From<ClientError> for ApiError {
    /// On the server's reason when it gave one (the same decision as in process), else on
    /// what the client saw.
    fn from(error: ClientError) -> Self {
        let message = error.to_string();
        if let Some(reason) = error.reason() {
            return ApiError::of_reason(reason, message);
        }
        match error {
            ClientError::NotFound { .. } => ApiError::NotFound(message),
            // A lost compare-and-swap.
            ClientError::Conflict { .. }
            | ClientError::Other {
                code: tonic::Code::AlreadyExists,
                ..
            } => ApiError::Conflict(message),
            ClientError::Unavailable { .. }
            | ClientError::Unreachable { .. }
            | ClientError::DeadlineExceeded { .. } => ApiError::Unavailable(message),
            ClientError::OutOfRange { .. } => ApiError::Relist(message),
            ClientError::InvalidServer { .. }
            | ClientError::Settings(_)
            | ClientError::Tls { .. }
            | ClientError::InvalidArgument { .. }
            | ClientError::FailedPrecondition { .. }
            | ClientError::PermissionDenied { .. }
            | ClientError::Unauthenticated { .. }
            | ClientError::Other { .. } => ApiError::Failed(message),
        }
    }
}

#[async_trait::async_trait]
impl Api for Client {
    async fn read(&self, id: &Id) -> Result<Option<Resource>, ApiError> {
        Ok(Client::read(self, id).await?)
    }

    async fn write(&self, resource: Resource) -> Result<Resource, ApiError> {
        Ok(Client::write(self, &resource).await?)
    }

    async fn delete(&self, id: &Id, version: &str) -> Result<(), ApiError> {
        Ok(Client::delete(self, id, version).await?)
    }

    async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
    ) -> Result<Vec<Resource>, ApiError> {
        Ok(Client::list(self, resource_type, tenancy, "").await?)
    }

    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ApiError> {
        Ok(Client::list_by_owner(self, owner).await?)
    }

    async fn write_status(
        &self,
        id: &Id,
        version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, ApiError> {
        Ok(Client::write_status(self, id, version, key, &status).await?)
    }

    fn fenced(&self, fence: proto::fence::FenceCell) -> Self {
        self.with_fence(fence)
    }

    /// A resumable watch: disconnections are retried by the watcher (said once per outage);
    /// a watch the server cannot resume, or refuses, ends the stream.
    async fn watch(&self, request: WatchListRequest) -> Result<EventStream, ApiError> {
        let gvk = request
            .r#type
            .as_ref()
            .map(crate::controller::gvk)
            .unwrap_or_default();
        let watcher = self.watcher(request);
        let stream = futures::stream::unfold(
            (Some(watcher), false),
            move |(watcher, disconnected)| {
                let gvk = gvk.clone();
                async move {
                    let mut watcher = watcher?;
                    let mut disconnected = disconnected;
                    loop {
                        match watcher.next().await {
                            None => return None,
                            Some(WatchUpdate::Event(event)) => {
                                return Some((Ok(event), (Some(watcher), false)));
                            }
                            Some(WatchUpdate::Disconnected { error, retry_in }) => {
                                if !disconnected {
                                    tracing::warn!(r#type = %gvk, %error, ?retry_in, "the watch broke; resuming");
                                }
                                disconnected = true;
                            }
                            Some(WatchUpdate::Resumed { server, .. }) => {
                                if disconnected {
                                    tracing::info!(r#type = %gvk, %server, "the watch resumed");
                                }
                                disconnected = false;
                            }
                            Some(WatchUpdate::Relisting { reason }) => {
                                return Some((Err(ApiError::Relist(reason)), (None, false)));
                            }
                            Some(WatchUpdate::Failed(error)) => {
                                return Some((Err(error.into()), (None, false)));
                            }
                        }
                    }
                }
            },
        );
        Ok(stream.boxed())
    }
}
