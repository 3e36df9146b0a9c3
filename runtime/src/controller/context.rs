//! What a reconciler acts through.

use std::sync::Arc;
use std::time::Duration;

use proto::resource::v1::{Id, Resource, Status, Tenancy, Type};

use super::{Cache, ReconcileError};
use crate::api::Api;
use crate::election::Leadership;

/// Who may reconcile now: a singleton's replica only while it holds its lease. A worker that
/// finds it does not puts the key back for `recheck`.
#[derive(Debug, Clone)]
pub struct Gate {
    pub leadership: Arc<Leadership>,
    pub recheck: Duration,
    /// A sharded controller's member: only its objects are watched and reconciled.
    pub shard: Option<Arc<crate::shard::Shard>>,
}

/// What a reconciler acts through: the [`Api`] (as the controller's identity), the running
/// controller's cache, and whether this replica may act.
pub struct Context<A: Api> {
    pub(super) api: A,
    pub(super) cache: Arc<Cache>,
    pub(super) gate: Option<Gate>,
    /// The controller's events (DESIGN §18).
    pub(super) events: crate::events::Recorder<A>,
}

impl<A: Api> Context<A> {
    /// A context outside a running controller (tests, tools): an empty cache, no gate.
    pub fn new(api: A) -> Self {
        Context {
            events: crate::events::Recorder::new(api.clone(), "controller/tool"),
            api,
            cache: Arc::new(Cache::default()),
            gate: None,
        }
    }

    /// Where the controller records what it did and why (`events.v1.Event`, merged and
    /// rate-limited; never waits).
    pub fn events(&self) -> &crate::events::Recorder<A> {
        &self.events
    }

    /// The client the controller acts through.
    pub fn api(&self) -> &A {
        &self.api
    }

    /// The running controller's cache of its managed and watched resources.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Whether this replica may act now (a singleton's replica: only while it holds the lease;
    /// always in the server, whose manager stops a singleton on a node that stops leading).
    /// Checked before each reconcile; a reconciler that writes after a long wait checks again.
    pub fn leads(&self) -> bool {
        self.gate.as_ref().is_none_or(|g| g.leadership.holds())
    }

    /// Reads a resource (a copy); `None` when it does not exist.
    pub async fn read(&self, id: &Id) -> Result<Option<Resource>, ReconcileError> {
        Ok(self.api.read(id).await?)
    }

    pub async fn write(&self, resource: Resource) -> Result<Resource, ReconcileError> {
        Ok(self.api.write(resource).await?)
    }

    /// Deletes whatever is stored under `id`.
    pub async fn delete(&self, id: &Id) -> Result<(), ReconcileError> {
        Ok(self.api.delete(id, "").await?)
    }

    pub async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
    ) -> Result<Vec<Resource>, ReconcileError> {
        Ok(self.api.list(resource_type, tenancy).await?)
    }

    pub async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ReconcileError> {
        Ok(self.api.list_by_owner(owner).await?)
    }

    /// Writes the status under `key` unless the stored one is the same (its observed
    /// generation and conditions; `updated_at` aside), so status writes do not cause reconcile
    /// loops. Whether it wrote.
    pub async fn write_status_if_changed(
        &self,
        resource: &Resource,
        key: &str,
        status: Status,
    ) -> Result<bool, ReconcileError> {
        if resource
            .status
            .get(key)
            .is_some_and(|stored| proto::meta::equal_status(stored, &status))
        {
            return Ok(false);
        }
        let id = resource.id.clone().unwrap_or_default();
        self.api.write_status(&id, "", key, status).await?;
        Ok(true)
    }
}
