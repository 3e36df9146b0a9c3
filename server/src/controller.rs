//! The server's controllers on the shared controller runtime (`runtime::controller`, DESIGN §7,
//! §16): definitions, the cache, the runner and the work queue live there, the same for a
//! team's program over gRPC. What is the server's own:
//!
//! - [`InProcess`]: the runtime's [`Api`] over the resource service, as the controller's own
//!   identity (`controller/<name>`: allowed everything, presentable by no client);
//! - [`builtin`]: the reaper, the namespace, type and replica-reports controllers and the demo
//!   controllers; [`shards`]: the sharded controllers' ShardMaps;
//! - [`manager`]: runs a node's controllers with their placement (a singleton on the raft
//!   leader only, the others on every server).

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use proto::resource::v1::{
    DeleteRequest, Id, ListByOwnerRequest, ListRequest, ReadRequest, Resource, Status, Tenancy,
    Type, WatchListRequest, WriteRequest, WriteStatusRequest,
};
use runtime::api::{Api, ApiError, EventStream};

use crate::acl::{Authorizer, ControllerIdentity};
use crate::service::{self, ResourceService};
use crate::storage::Consistency;

pub(crate) mod builtin;
pub(crate) mod manager;
pub(crate) mod shards;

#[cfg(test)]
mod tests;

pub(crate) use runtime::controller::{
    Action, DefinitionError, Placement, ReconcileError, Reconciler, Request, Stats,
    map_owner_filtered,
};

/// A controller of the server.
pub(crate) type Controller = runtime::controller::Controller<InProcess>;
/// What the server's reconcilers act through.
pub(crate) type Runtime = runtime::controller::Context<InProcess>;

/// The resource service in process, as one identity: the runtime's [`Api`] for the server's
/// own controllers. Reconcilers reach the service itself (`api().service`) for what only the
/// server may do (the children of a deleted owner, the registry).
#[derive(Clone, Debug)]
pub(crate) struct InProcess {
    pub service: Arc<ResourceService>,
    pub identity: Arc<dyn Authorizer>,
    /// The lease its writes are fenced by ([`Api::fenced`]).
    pub fence: Option<proto::fence::FenceCell>,
}

impl InProcess {
    /// As controller `name`.
    pub(crate) fn controller(service: Arc<ResourceService>, name: &str) -> Self {
        InProcess {
            service,
            identity: Arc::new(ControllerIdentity::new(name)),
            fence: None,
        }
    }

    /// As the server itself (allowed everything): tests and tools.
    #[cfg(test)]
    pub(crate) fn privileged(service: Arc<ResourceService>) -> Self {
        InProcess {
            service,
            identity: Arc::new(crate::acl::AllowAll),
            fence: None,
        }
    }

    /// Runs a write, status write or delete under this Api's fence, as the gRPC layer runs one
    /// that carries `x-resd-fence`.
    async fn fenced<T>(
        &self,
        write: impl Future<Output = Result<T, service::Error>>,
    ) -> Result<T, ApiError> {
        let Some(cell) = &self.fence else {
            return write.await.map_err(api_error);
        };
        let Some(fence) = cell.get() else {
            return Err(ApiError::Fenced(
                "fenced: this replica does not hold its lease now; the write was not made".into(),
            ));
        };
        let outcome = service::fenced::scope(Some(fence.clone()), write)
            .await
            .map_err(api_error);
        if let Err(ApiError::Fenced(_)) = &outcome {
            cell.revoke(&fence);
        }
        outcome
    }
}

impl From<service::Error> for ReconcileError {
    fn from(error: service::Error) -> Self {
        ReconcileError(error.to_string())
    }
}

/// What a controller decides on, from the service's error: its reason.
fn api_error(error: service::Error) -> ApiError {
    let (_, reason) = error.code_and_reason();
    ApiError::of_reason(reason, error.to_string())
}

#[async_trait]
impl Api for InProcess {
    async fn read(&self, id: &Id) -> Result<Option<Resource>, ApiError> {
        let request = ReadRequest {
            id: Some(id.clone()),
            ..Default::default()
        };
        match self
            .service
            .read(self.identity.as_ref(), Consistency::Eventual, request)
            .await
        {
            Ok(response) => Ok(response.resource),
            Err(service::Error::NotFound(_) | service::Error::TenancyNotFound(_)) => Ok(None),
            Err(error) => Err(api_error(error)),
        }
    }

    async fn write(&self, resource: Resource) -> Result<Resource, ApiError> {
        let request = WriteRequest {
            resource: Some(resource),
        };
        let response = self
            .fenced(self.service.write(self.identity.as_ref(), request))
            .await?;
        response
            .resource
            .ok_or_else(|| ApiError::Failed("the write returned no resource".into()))
    }

    async fn delete(&self, id: &Id, version: &str) -> Result<(), ApiError> {
        let request = DeleteRequest {
            id: Some(id.clone()),
            version: version.to_owned(),
        };
        self.fenced(self.service.delete(self.identity.as_ref(), request))
            .await
            .map(drop)
    }

    async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
    ) -> Result<Vec<Resource>, ApiError> {
        let request = ListRequest {
            r#type: Some(resource_type.clone()),
            tenancy: Some(tenancy.clone()),
            ..ListRequest::default()
        };
        self.service
            .list(self.identity.as_ref(), Consistency::Eventual, request)
            .await
            .map(|response| response.resources)
            .map_err(api_error)
    }

    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ApiError> {
        let request = ListByOwnerRequest {
            owner: Some(owner.clone()),
            ..ListByOwnerRequest::default()
        };
        self.service
            .list_by_owner(self.identity.as_ref(), request)
            .await
            .map(|response| response.resources)
            .map_err(api_error)
    }

    async fn write_status(
        &self,
        id: &Id,
        version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, ApiError> {
        let request = WriteStatusRequest {
            id: Some(id.clone()),
            version: version.to_owned(),
            key: key.to_owned(),
            status: Some(status),
        };
        let response = self
            .fenced(self.service.write_status(self.identity.as_ref(), request))
            .await?;
        response
            .resource
            .ok_or_else(|| ApiError::Failed("the status write returned no resource".into()))
    }

    fn fenced(&self, fence: proto::fence::FenceCell) -> Self {
        InProcess {
            fence: Some(fence),
            ..self.clone()
        }
    }

    async fn watch(&self, request: WatchListRequest) -> Result<EventStream, ApiError> {
        let stream = self
            .service
            .watch_list(self.identity.clone(), request)
            .await
            .map_err(api_error)?;
        Ok(stream.map(|event| event.map_err(api_error)).boxed())
    }
}
