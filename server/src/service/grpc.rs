//! gRPC handlers: turn request metadata into a caller (authorizer, consistency), call
//! [`ResourceService`], and map errors through the one `Error → Status` conversion.

use std::sync::Arc;

use proto::resource::v1::{
    DeleteRequest, DeleteResponse, ListByOwnerRequest, ListByOwnerResponse, ListRequest,
    ListResponse, MutateAndValidateRequest, MutateAndValidateResponse, ReadRequest, ReadResponse,
    WatchListRequest, WriteRequest, WriteResponse, WriteStatusRequest, WriteStatusResponse,
    resource_service_server,
};
use tonic::{Request, Response, Status};

use super::read::WatchStream;
use super::{Error, ResourceService};
use crate::acl::{Authorizer, TokenResolver};
use crate::storage::Consistency;

pub use proto::{CONSISTENCY_HEADER, TOKEN_HEADER};

/// `resd.resource.v1.ResourceService` over a [`ResourceService`].
#[derive(Debug, Clone)]
pub struct ResourceGrpc {
    service: Arc<ResourceService>,
    tokens: Arc<dyn TokenResolver>,
}

impl ResourceGrpc {
    pub fn new(service: Arc<ResourceService>, tokens: Arc<dyn TokenResolver>) -> Self {
        ResourceGrpc { service, tokens }
    }

    fn authorizer<T>(&self, request: &Request<T>) -> Result<Arc<dyn Authorizer>, Status> {
        let token = match request.metadata().get(TOKEN_HEADER) {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| {
                Status::from(Error::Unauthenticated(format!(
                    "{TOKEN_HEADER} is not valid ASCII"
                )))
            })?),
        };
        self.tokens
            .resolve(token)
            .map_err(|error| Status::from(Error::from(error)))
    }
}

/// When the caller stops waiting, from the `grpc-timeout` header.
fn deadline<T>(request: &Request<T>) -> Option<std::time::Instant> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let timeout = crate::storage::deadline::parse_grpc_timeout(value)?;
    Some(std::time::Instant::now() + timeout)
}

fn consistency<T>(request: &Request<T>) -> Result<Consistency, Status> {
    match request
        .metadata()
        .get(CONSISTENCY_HEADER)
        .map(|value| value.to_str())
    {
        None => Ok(Consistency::Eventual),
        Some(Ok("consistent")) => Ok(Consistency::Strong),
        Some(Ok("" | "default" | "eventual")) => Ok(Consistency::Eventual),
        Some(other) => Err(Status::from(Error::invalid(format!(
            "{CONSISTENCY_HEADER} must be \"consistent\" or absent, got {:?}",
            other.unwrap_or("<not ASCII>")
        )))),
    }
}

#[tonic::async_trait]
impl resource_service_server::ResourceService for ResourceGrpc {
    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let consistency = consistency(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .read(authorizer.as_ref(), consistency, request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn write(
        &self,
        request: Request<WriteRequest>,
    ) -> Result<Response<WriteResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .write(authorizer.as_ref(), request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn write_status(
        &self,
        request: Request<WriteStatusRequest>,
    ) -> Result<Response<WriteStatusResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .write_status(authorizer.as_ref(), request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let consistency = consistency(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .list(authorizer.as_ref(), consistency, request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn list_by_owner(
        &self,
        request: Request<ListByOwnerRequest>,
    ) -> Result<Response<ListByOwnerResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .list_by_owner(authorizer.as_ref(), request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .delete(authorizer.as_ref(), request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }

    type WatchListStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<proto::resource::v1::WatchEvent, Status>> + Send>,
    >;

    async fn watch_list(
        &self,
        request: Request<WatchListRequest>,
    ) -> Result<Response<Self::WatchListStream>, Status> {
        use futures::StreamExt;
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let events: WatchStream = crate::storage::deadline::scope(
            deadline,
            self.service.watch_list(authorizer, request.into_inner()),
        )
        .await?;
        Ok(Response::new(
            events.map(|item| item.map_err(Status::from)).boxed(),
        ))
    }

    async fn mutate_and_validate(
        &self,
        request: Request<MutateAndValidateRequest>,
    ) -> Result<Response<MutateAndValidateResponse>, Status> {
        let authorizer = self.authorizer(&request)?;
        let deadline = deadline(&request);
        let response = crate::storage::deadline::scope(
            deadline,
            self.service
                .mutate_and_validate(authorizer.as_ref(), request.into_inner()),
        )
        .await?;
        Ok(Response::new(response))
    }
}
