//! [`LeaseStore`] over the resource service, for a controller program talking to a cluster
//! (`proto::client::Client`: several servers, failover, TLS, a token).

use proto::client::{Client, ClientError};
use proto::resource::v1::{Id, Resource};

use crate::election::{LeaseStore, StoreError};

/// Leases read and written through a cluster client.
#[derive(Clone)]
pub struct ClientLeases(pub Client);

#[async_trait::async_trait]
impl LeaseStore for ClientLeases {
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
