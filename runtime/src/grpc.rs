//! [`LeaseStore`] and [`ReportStore`] over the resource service, for a controller program
//! talking to a cluster (`proto::client::Client`: several servers, failover, TLS, a token).

use proto::client::{Client, ClientError};
use proto::resource::v1::{Id, Resource};

use crate::election::{LeaseStore, StoreError};
use crate::report::ReportStore;

/// Leases and reports read and written through a cluster client.
#[derive(Clone)]
pub struct ClusterStore(pub Client);

#[async_trait::async_trait]
impl ReportStore for ClusterStore {
    async fn write_report(&self, report: Resource) -> Result<Resource, StoreError> {
        self.0.write(&report).await.map_err(failed)
    }

    async fn delete_report(&self, id: &Id) -> Result<(), StoreError> {
        self.0.delete(id, "").await.map(drop).map_err(failed)
    }
}

#[async_trait::async_trait]
impl LeaseStore for ClusterStore {
    async fn read(&self, id: &Id) -> Result<Option<Resource>, StoreError> {
        self.0.read(id).await.map_err(failed)
    }

    async fn write(&self, lease: Resource) -> Result<Resource, StoreError> {
        match self.0.write(&lease).await {
            Ok(written) => Ok(written),
            // A lost compare-and-swap, a create refused by its uid (someone created the lease
            // first), or a lease deleted and recreated since it was read: not this replica's.
            Err(ClientError::Conflict(_) | ClientError::FailedPrecondition(_)) => {
                Err(StoreError::Conflict)
            }
            Err(error) => Err(failed(error)),
        }
    }
}

fn failed(error: ClientError) -> StoreError {
    StoreError::Failed(error.to_string())
}
