//! The resource service (CRUD, status, watch over every registered type) and the cluster
//! service, as a plain async API ([`ResourceService`]) plus their gRPC handlers ([`grpc`],
//! [`cluster`]); [`admission`] checks what reaches storage by other ways (forwarded changes,
//! restored snapshots). The agent hosts them.
//!
//! The request handler chooses every non-deterministic value (uids, generations, timestamps)
//! before storage sees the write, so a replicated backend applies it deterministically. Values
//! read from storage are copied before they are changed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use proto::resource::v1::{Id, Resource, Tenancy, WriteRequest};
use tokio_util::sync::CancellationToken;

use crate::acl::{AllowAll, Authorizer};
use crate::registry::{Registration, Registry, Scope, builtin};
use crate::resource;
use crate::storage::{Backend, Consistency, StorageError};
use validate::{Violations, Wildcards};

mod acl_check;
mod admission;
pub(crate) mod cluster;
mod convert;
mod delete;
pub(crate) mod encoded;
mod error;
pub(crate) mod fenced;
pub(crate) mod grpc;
mod history;
mod migrate;
pub(crate) use migrate::MIGRATION_STATUS;
mod page;
mod plan;
mod policy;
pub(crate) mod projections;
mod read;
mod shard_watch;
pub(crate) mod stalls;
mod tenancy_units;
pub(crate) use read::pb_event;
mod validate;
mod write;

#[cfg(test)]
mod tests;

pub(crate) use admission::ForwardAdmission;
pub(crate) use error::{Error, NotLeader, VersionConflict};
pub(crate) use history::TypeHistory;

/// Largest encoded resource accepted by default.
pub(crate) use crate::resource::DEFAULT_MAX_RESOURCE_BYTES;

/// How long a blind operation keeps retrying lost compare-and-swap races (less when the request
/// has an earlier deadline). Under contention every round has a winner, so each writer gets
/// through well within it; etcd never fails an unconditional put either.
const BLIND_BUDGET: Duration = Duration::from_secs(10);

/// Pause before the retry after `attempt` (0-based) lost a CAS race: doubling from 2 ms up to
/// 64 ms, jittered over its upper half so writers that collided do not collide again in step.
fn blind_backoff(attempt: u32) -> Duration {
    let ceiling = 2u64 << attempt.min(5);
    let jitter = (ulid::Ulid::new().random() as u64) % (ceiling / 2 + 1);
    Duration::from_millis(ceiling / 2 + jitter)
}

/// The one retry loop of blind operations (no version given: the server retries lost races).
/// Runs `attempt` with its index (0-based) until it does not fail with a lost CAS race, for up
/// to [`BLIND_BUDGET`] with [`blind_backoff`] between tries. Without `blind`, one try.
async fn retry_blind<T, F, Fut>(blind: bool, mut attempt: F) -> Result<T, Error>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = crate::storage::deadline::bounded(BLIND_BUDGET);
    let mut index = 0;
    loop {
        match attempt(index).await {
            Err(Error::CasFailed(why)) if blind => {
                let pause = blind_backoff(index);
                if std::time::Instant::now() + pause >= deadline {
                    return Err(Error::CasFailed(format!(
                        "{why} (a blind write kept losing to concurrent writers for {} attempts; try again)",
                        index + 1
                    )));
                }
                tokio::time::sleep(pause).await;
                index += 1;
            }
            other => return other,
        }
    }
}

/// Tries of a change whose Type or ACLs kept changing under it before the caller hears
/// `SCHEMA_CHANGED` or `ACL_CHANGED` (each after the node caught up: a Type changing this often
/// is being written in a loop).
pub(crate) const FENCED_ATTEMPTS: usize = 8;

/// The resource service over one backend and one registry. Callers pass the authorizer of the
/// identity they act for: a token's, or [`AllowAll`] for in-process privileged callers.
pub(crate) struct ResourceService {
    backend: Arc<dyn Backend>,
    registry: Arc<Registry>,
    max_resource_bytes: usize,
    /// Cancelled when the server shuts down; open watches end with `Unavailable`.
    shutdown: CancellationToken,
    /// Partitions and namespaces found, while nothing of their group changed.
    tenancy_units: tenancy_units::TenancyUnits,
    /// Bytes of lists being answered, node-wide.
    list_budget: Arc<crate::limits::ByteBudget>,
    /// Where schemas compile and rules run.
    pool: crate::registry::pool::Pool,
}

impl std::fmt::Debug for ResourceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceService")
            .field("max_resource_bytes", &self.max_resource_bytes)
            .finish_non_exhaustive()
    }
}

/// Whether a tenancy unit is usable.
enum TenancyState {
    Active,
    MarkedForDeletion,
}

impl ResourceService {
    /// A service over `backend`; the registry's dynamic part follows the backend's stored
    /// Types from now on (a projection: `service::projections`).
    pub(crate) fn new(backend: Arc<dyn Backend>, registry: Arc<Registry>) -> Self {
        if let Err(error) =
            backend.project(Arc::new(projections::Types(registry.dynamic().clone())))
        {
            // Only a damaged store fails this; its types stay unknown (writes of them are
            // refused, never accepted unchecked) until the node rebuilds its state.
            tracing::error!(%error, "cannot read the stored Types; registered types are unavailable");
        }
        if let Err(error) =
            backend.project(Arc::new(projections::Policies(registry.policies().clone())))
        {
            tracing::error!(%error, "cannot read the stored admission policies");
        }
        ResourceService {
            backend,
            registry,
            max_resource_bytes: DEFAULT_MAX_RESOURCE_BYTES,
            shutdown: CancellationToken::new(),
            tenancy_units: tenancy_units::TenancyUnits::default(),
            list_budget: crate::limits::ByteBudget::new(crate::limits::DEFAULT_MAX_INFLIGHT_BYTES),
            pool: crate::registry::pool::Pool::default(),
        }
    }

    /// Makes sure this node knows `resource_type` when a committed Type registers it, before a
    /// request naming it is answered (DESIGN §15: a resource written right after its Type is
    /// accepted on every node). The registry follows what this node has applied; a type it
    /// does not know may be registered by a Type committed but not applied here yet, so the
    /// node first catches up with the leader (a read index), once.
    pub(crate) async fn know_type(&self, resource_type: Option<&proto::resource::v1::Type>) {
        let Some(resource_type) = resource_type else {
            return;
        };
        if resource_type.group.is_empty()
            || crate::registry::dynamic::RESERVED_GROUPS.contains(&resource_type.group.as_str())
            || self.registry.resolve(resource_type).is_some()
        {
            return;
        }
        if let Err(error) = self.backend.sync().await {
            tracing::debug!(%error, "cannot catch up with the leader to look for a type");
        }
    }

    /// What a change checked now, against `registration` and for `authorizer`, carries to
    /// storage (DESIGN §15's fence): its type's Type at the version it was checked against, the
    /// revision of every Type (for a change to a Type: `types`), and the revision of the tokens
    /// and policies its caller's grants were made from.
    fn fence(
        authorizer: &dyn Authorizer,
        registration: &Registration,
        types: Option<crate::storage::Version>,
    ) -> crate::storage::Fence {
        use crate::storage::{Domain, Guard, StorageKey};
        let mut guards = Vec::new();
        if let Some(registered) = &registration.registered {
            guards.push(Guard::Resource {
                key: StorageKey::of(&Id {
                    r#type: Some(builtin::registry_type()),
                    tenancy: Some(Tenancy::default()),
                    name: registered.name.clone(),
                    uid: String::new(),
                }),
                version: registered.version.clone(),
            });
        }
        if let Some(revision) = types {
            guards.push(Guard::Domain {
                domain: Domain::Types,
                revision,
            });
        }
        if let Some(revision) = authorizer.acl_revision() {
            guards.push(Guard::Domain {
                domain: Domain::Acl,
                revision,
            });
        }
        crate::storage::Fence { guards }
    }

    /// Runs `attempt` again when the Type it was checked against changed before its change
    /// could be stored (`SCHEMA_CHANGED`): once this node has caught up, every check runs
    /// again, so no change checked under a replaced Type is ever stored. A change fenced off by
    /// the ACLs goes back to the caller, which resolves its token again (`grpc`).
    async fn refenced<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        for _ in 1..FENCED_ATTEMPTS {
            match attempt().await {
                Err(Error::Fenced(fenced)) if fenced.kind == crate::storage::FenceKind::Schema => {
                    tracing::debug!(why = %fenced, "a change was checked against a Type that changed; checking it again");
                    self.sync().await?;
                }
                other => return other,
            }
        }
        attempt().await
    }

    /// Keeps `projection` on this node's committed state ([`Backend::project`]).
    pub(crate) fn project(
        &self,
        projection: Arc<dyn crate::storage::Projection>,
    ) -> Result<(), StorageError> {
        self.backend.project(projection)
    }

    /// Returns once this node has applied every change acknowledged before the call: its
    /// registry and ACLs are then as new as any a client has seen ([`Backend::sync`]).
    pub(crate) async fn sync(&self) -> Result<(), Error> {
        self.backend.sync().await.map_err(Error::from)
    }

    /// Bounds the bytes of lists being answered at once (`--max-inflight-bytes`).
    pub(crate) fn with_list_budget(mut self, bytes: usize) -> Self {
        self.list_budget = crate::limits::ByteBudget::new(bytes);
        self
    }

    pub(crate) fn with_max_resource_bytes(mut self, max_resource_bytes: usize) -> Self {
        self.max_resource_bytes = max_resource_bytes;
        self
    }

    /// Ties open watches to a shutdown signal.
    pub(crate) fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Why a default read answered now may be stale ([`crate::storage::Backend::stale_reads`]).
    pub(crate) fn stale_reads(&self) -> Option<String> {
        self.backend.stale_reads()
    }

    pub(crate) fn max_resource_bytes(&self) -> usize {
        self.max_resource_bytes
    }

    /// The registration of a type, or an error naming the field and suggesting near misses.
    fn resolve_type(
        &self,
        resource_type: &proto::resource::v1::Type,
        field: &str,
    ) -> Result<Arc<Registration>, Error> {
        self.registry.resolve(resource_type).ok_or_else(|| {
            let similar = self.registry.similar(resource_type);
            let hint = if similar.is_empty() {
                "ListTypes lists the registered types".to_owned()
            } else {
                format!("did you mean {}?", similar.join(" or "))
            };
            Error::UnknownType(format!(
                "{field} {} is not registered ({hint})",
                resource::gvk(resource_type)
            ))
        })
    }

    /// Applies the scope of the id's type to its tenancy (defaults, forbidden parts) and returns
    /// the type's registration. The id's shape must have been checked.
    fn scope_id(
        &self,
        id: &mut Id,
        field: &str,
        wildcards: Wildcards,
    ) -> Result<Arc<Registration>, Error> {
        let resource_type = id.r#type.clone().unwrap_or_default();
        let registration = self.resolve_type(&resource_type, &format!("{field}.type"))?;
        // An absent tenancy is an empty one: the defaults of the type's scope.
        let tenancy = id.tenancy.get_or_insert_with(Tenancy::default);
        validate::apply_scope(
            &format!("{field}.tenancy"),
            &registration.gvk(),
            registration.scope,
            tenancy,
            wildcards,
        )?;
        Ok(registration)
    }

    /// Checks the shape of a request's id, then [`Self::scope_id`].
    fn check_request_id(
        &self,
        id: Option<Id>,
        field: &str,
    ) -> Result<(Id, Arc<Registration>), Error> {
        let mut violations = Violations::default();
        validate::check_id(
            &mut violations,
            field,
            id.as_ref(),
            Wildcards::Forbidden,
            &self.registry,
        );
        violations.finish()?;
        let mut id = id.ok_or_else(|| Error::invalid(format!("{field} is required")))?;
        let registration = self.scope_id(&mut id, field, Wildcards::Forbidden)?;
        Ok((id, registration))
    }

    /// Creates the `default` partition and the `default/default` namespace if they are missing.
    pub(crate) async fn ensure_default_tenancy(&self) -> Result<(), Error> {
        let partition = builtin::partition_id(resource::DEFAULT_PARTITION);
        let namespace =
            builtin::namespace_id(resource::DEFAULT_PARTITION, resource::DEFAULT_NAMESPACE);
        for (id, data) in [
            (
                partition,
                proto::to_any(&proto::tenancy::v1::Partition {
                    description: "The default partition".into(),
                }),
            ),
            (
                namespace,
                proto::to_any(&proto::tenancy::v1::Namespace {
                    description: "The default namespace".into(),
                }),
            ),
        ] {
            match self.backend.read(Consistency::Strong, &id).await {
                Ok(_) | Err(StorageError::GroupVersionMismatch { .. }) => continue,
                Err(StorageError::NotFound) => {}
                Err(error) => return Err(error.into()),
            }
            let request = WriteRequest {
                resource: Some(Resource {
                    id: Some(id.clone()),
                    data: Some(data),
                    ..Default::default()
                }),
            };
            self.write(&AllowAll, request).await?;
            tracing::info!(id = %resource::DisplayId(&id), "created default tenancy");
        }
        Ok(())
    }

    /// The deprecation warning of the version `resource_type` names, when it is a deprecated
    /// version of a registered Type (DESIGN §15.1).
    pub(crate) fn deprecation(
        &self,
        resource_type: Option<&proto::resource::v1::Type>,
    ) -> Option<String> {
        let registration = self.registry.resolve(resource_type?)?;
        registration
            .registered
            .as_ref()?
            .deprecation()
            .map(str::to_owned)
    }

    /// Checks that the partition (and namespace) of a tenancy exist
    /// ([`Error::TenancyNotFound`] naming which).
    async fn tenancy_state(&self, scope: Scope, tenancy: &Tenancy) -> Result<TenancyState, Error> {
        match self.tenancy_in_storage(scope, tenancy).await {
            Err(StorageError::MissingTenancy(which)) => Err(Error::TenancyNotFound(which)),
            other => Ok(other?),
        }
    }

    /// [`Self::tenancy_state`] in storage's terms, for checks below the service (changes a peer
    /// forwarded): a missing unit is [`StorageError::MissingTenancy`] naming which.
    async fn tenancy_in_storage(
        &self,
        scope: Scope,
        tenancy: &Tenancy,
    ) -> Result<TenancyState, StorageError> {
        let needs_partition = matches!(scope, Scope::Partition | Scope::Namespace)
            || (scope == Scope::Any && !tenancy.partition.is_empty());
        let needs_namespace =
            scope == Scope::Namespace || (scope == Scope::Any && !tenancy.namespace.is_empty());
        let units = [
            needs_partition.then(|| tenancy_units::UnitKey::partition(&tenancy.partition)),
            needs_namespace
                .then(|| tenancy_units::UnitKey::namespace(&tenancy.partition, &tenancy.namespace)),
        ];
        let mut state = TenancyState::Active;
        for unit in units.iter().flatten() {
            match self.tenancy_unit_marked(unit).await? {
                None => return Err(StorageError::MissingTenancy(unit.missing())),
                Some(true) => state = TenancyState::MarkedForDeletion,
                Some(false) => {}
            }
        }
        Ok(state)
    }

    /// Whether a partition or namespace is marked for deletion; `None` when it does not exist.
    /// Answered from [`tenancy_units::TenancyUnits`] while nothing of the tenancy group changed
    /// on this node since the unit was read.
    async fn tenancy_unit_marked(
        &self,
        key: &tenancy_units::UnitKey,
    ) -> Result<Option<bool>, StorageError> {
        let stamp = self.backend.group_stamp(builtin::TENANCY_GROUP);
        if let Some(stamp) = stamp
            && let Some(marked) = self.tenancy_units.get(key, stamp)
        {
            return Ok(Some(marked));
        }
        let Some(unit) = self.read_tenancy_unit(&key.id()).await? else {
            return Ok(None);
        };
        let marked = resource::is_marked_for_deletion(&unit);
        if let Some(stamp) = stamp {
            self.tenancy_units.found(key, stamp, marked);
        }
        Ok(Some(marked))
    }

    /// Reads a partition or namespace: locally first (the common case: it exists), and with a
    /// strong read before concluding it is missing, so a namespace just created through another
    /// node is seen by a follower that has not applied it yet (read-your-writes across nodes).
    async fn read_tenancy_unit(&self, id: &Id) -> Result<Option<Resource>, StorageError> {
        for consistency in [Consistency::Eventual, Consistency::Strong] {
            match self.backend.read(consistency, id).await {
                Ok(unit) => return Ok(Some(unit)),
                Err(StorageError::GroupVersionMismatch { stored }) => return Ok(Some(*stored)),
                Err(StorageError::NotFound) => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// Reads the current incarnation of a resource whatever uid or group version the caller
    /// named; `None` when nothing is stored under its name.
    async fn read_stored(&self, id: &Id) -> Result<Option<Resource>, Error> {
        self.read_stored_with(id, Consistency::Strong).await
    }

    async fn read_stored_with(
        &self,
        id: &Id,
        consistency: Consistency,
    ) -> Result<Option<Resource>, Error> {
        let mut any_uid = id.clone();
        any_uid.uid.clear();
        match self.backend.read(consistency, &any_uid).await {
            Ok(stored) => Ok(Some(stored)),
            Err(StorageError::GroupVersionMismatch { stored }) => Ok(Some(*stored)),
            Err(StorageError::NotFound) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }
}

/// A fresh ULID for uids and generations.
fn new_ulid() -> String {
    ulid::Ulid::new().to_string()
}

fn now_timestamp() -> prost_types::Timestamp {
    prost_types::Timestamp::from(std::time::SystemTime::now())
}
