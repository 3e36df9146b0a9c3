//! Tests of the resource service, one behaviour per test, on the in-memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use proto::demo::{v1 as demo_v1, v2 as demo_v2};
use proto::resource::v1::{
    DeleteRequest, Id, ListByOwnerRequest, ListRequest, ReadRequest, Resource, Status, Tenancy,
    WriteRequest, WriteStatusRequest,
};

use super::{Error, ResourceService};
use crate::acl::{AllowAll, Authorizer};
use crate::registry::Registry;
use crate::resource;
use crate::storage::inmem::InMemBackend;
use crate::storage::{Backend, Consistency, StorageError, UnversionedType, Watch};

mod absent_tenancy;
mod acl;
mod delete;
mod escalation;
mod grpc;
mod pages;
mod policies;
mod read;
mod select;
mod shards;
mod status;
mod versions;
mod watch;
mod write;

pub(super) struct Harness {
    service: Arc<ResourceService>,
}

pub(super) async fn harness() -> Harness {
    harness_with(Arc::new(InMemBackend::new())).await
}

pub(super) async fn harness_with(backend: Arc<dyn Backend>) -> Harness {
    let registry = Arc::new(Registry::builtin().expect("built-in registry"));
    let service = ResourceService::new(backend, registry);
    service
        .ensure_default_tenancy()
        .await
        .expect("default tenancy");
    Harness {
        service: Arc::new(service),
    }
}

pub(super) fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

pub(super) fn id(gvk: &str, tenancy: Tenancy, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(resource::parse_gvk(gvk).expect("valid gvk in test")),
        tenancy: Some(tenancy),
    }
}

pub(super) fn default_ns() -> Tenancy {
    tenancy("", "")
}

/// A `demo.v2.Artist` in the default namespace.
pub(super) fn artist(name: &str) -> Resource {
    Resource {
        id: Some(id("demo.v2.Artist", default_ns(), name)),
        data: Some(proto::to_any(&demo_v2::Artist {
            name: format!("Artist {name}"),
            genre: demo_v2::Genre::Jazz as i32,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A `demo.v2.Album` in the default namespace.
pub(super) fn album(name: &str) -> Resource {
    Resource {
        id: Some(id("demo.v2.Album", default_ns(), name)),
        data: Some(proto::to_any(&demo_v2::Album {
            name: format!("Album {name}"),
            year_of_release: 1959,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub(super) fn id_of(resource: &Resource) -> Id {
    resource.id.clone().expect("resource has an id")
}

pub(super) fn status(observed_generation: &str) -> Status {
    Status {
        observed_generation: observed_generation.into(),
        conditions: vec![proto::resource::v1::Condition {
            r#type: "Accepted".into(),
            state: proto::resource::v1::State::True as i32,
            reason: "Ok".into(),
            message: "all good".into(),
            resource: None,
        }],
        updated_at: None,
    }
}

/// Asserts an error's gRPC code and that its message contains `contains`.
pub(super) fn expect_error<T: std::fmt::Debug>(
    result: Result<T, Error>,
    code: tonic::Code,
    contains: &str,
) -> String {
    let error = result.expect_err("expected an error");
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), code, "wrong code for {:?}", status.message());
    assert!(
        status.message().contains(contains),
        "message {:?} lacks {contains:?}",
        status.message()
    );
    status.message().to_owned()
}

impl Harness {
    pub(super) async fn write(&self, resource: Resource) -> Result<Resource, Error> {
        self.write_as(&AllowAll, resource).await
    }

    pub(super) async fn write_as(
        &self,
        authorizer: &dyn Authorizer,
        resource: Resource,
    ) -> Result<Resource, Error> {
        let response = self
            .service
            .write(
                authorizer,
                WriteRequest {
                    resource: Some(resource),
                },
            )
            .await?;
        Ok(response.resource.expect("write returns the resource"))
    }

    pub(super) async fn read(&self, id: &Id) -> Result<Resource, Error> {
        self.read_as(&AllowAll, id).await
    }

    /// Reads through `read` and `read_encoded` (the gRPC answer's path), which must agree.
    pub(super) async fn read_as(
        &self,
        authorizer: &dyn Authorizer,
        id: &Id,
    ) -> Result<Resource, Error> {
        let request = ReadRequest {
            id: Some(id.clone()),
            ..Default::default()
        };
        let encoded = self
            .service
            .read_encoded(authorizer, Consistency::Strong, request.clone())
            .await;
        let response = self
            .service
            .read(authorizer, Consistency::Strong, request)
            .await;
        match (&response, &encoded) {
            (Ok(response), Ok(bytes)) => assert_eq!(
                Some(<Resource as prost::Message>::decode(bytes.as_slice()).expect("decodes")),
                response.resource,
                "read_encoded answers the resource read answers"
            ),
            (Err(read), Err(encoded)) => assert_eq!(
                format!("{read:?}"),
                format!("{encoded:?}"),
                "read_encoded fails as read does"
            ),
            (read, encoded) => panic!("read gave {read:?}, read_encoded {encoded:?}"),
        }
        Ok(response?.resource.expect("read returns the resource"))
    }

    pub(super) async fn delete(&self, id: &Id, version: &str) -> Result<(), Error> {
        self.delete_as(&AllowAll, id, version).await
    }

    pub(super) async fn delete_as(
        &self,
        authorizer: &dyn Authorizer,
        id: &Id,
        version: &str,
    ) -> Result<(), Error> {
        self.service
            .delete(
                authorizer,
                DeleteRequest {
                    id: Some(id.clone()),
                    version: version.into(),
                },
            )
            .await
            .map(|_| ())
    }

    pub(super) async fn write_status(
        &self,
        id: &Id,
        version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, Error> {
        self.write_status_as(&AllowAll, id, version, key, status)
            .await
    }

    pub(super) async fn write_status_as(
        &self,
        authorizer: &dyn Authorizer,
        id: &Id,
        version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, Error> {
        let response = self
            .service
            .write_status(
                authorizer,
                WriteStatusRequest {
                    id: Some(id.clone()),
                    version: version.into(),
                    key: key.into(),
                    status: Some(status),
                },
            )
            .await?;
        Ok(response
            .resource
            .expect("write_status returns the resource"))
    }

    pub(super) async fn list(
        &self,
        gvk: &str,
        tenancy: Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, Error> {
        self.list_as(&AllowAll, gvk, tenancy, name_prefix).await
    }

    pub(super) async fn list_as(
        &self,
        authorizer: &dyn Authorizer,
        gvk: &str,
        tenancy: Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, Error> {
        let response = self
            .service
            .list(
                authorizer,
                Consistency::Eventual,
                ListRequest {
                    r#type: Some(resource::parse_gvk(gvk).expect("valid gvk")),
                    tenancy: Some(tenancy),
                    name_prefix: name_prefix.into(),
                    ..ListRequest::default()
                },
            )
            .await?;
        Ok(response.resources)
    }

    pub(super) async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, Error> {
        let response = self
            .service
            .list_by_owner(
                &AllowAll,
                ListByOwnerRequest {
                    owner: Some(owner.clone()),
                    ..ListByOwnerRequest::default()
                },
            )
            .await?;
        Ok(response.resources)
    }
}

pub(super) fn names(resources: &[Resource]) -> Vec<String> {
    let mut names: Vec<String> = resources.iter().map(|r| id_of(r).name).collect();
    names.sort();
    names
}

pub(super) fn v1_artist(name: &str) -> Resource {
    Resource {
        id: Some(id("demo.v1.Artist", default_ns(), name)),
        data: Some(proto::to_any(&demo_v1::Artist {
            name: format!("Artist {name}"),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Wraps a backend and makes the next `cas_failures` writes or deletes lose a CAS race, so the
/// blind-write retry is tested without depending on timing; counts writes and the reads of
/// tenancy units (partitions and namespaces).
pub(super) struct LosingBackend {
    inner: InMemBackend,
    cas_failures: AtomicU32,
    pub writes: AtomicU32,
    pub tenancy_reads: AtomicU32,
}

impl LosingBackend {
    pub(super) fn new() -> Self {
        LosingBackend {
            inner: InMemBackend::new(),
            cas_failures: AtomicU32::new(0),
            writes: AtomicU32::new(0),
            tenancy_reads: AtomicU32::new(0),
        }
    }

    pub(super) fn lose_next(&self, count: u32) {
        self.cas_failures.store(count, Ordering::SeqCst);
    }

    /// Counts a write and fails it while losses are left.
    fn count_write(&self) -> Result<(), StorageError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.lose() {
            return Err(StorageError::CasFailure);
        }
        Ok(())
    }

    fn lose(&self) -> bool {
        self.cas_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[async_trait]
impl Backend for LosingBackend {
    async fn read(&self, consistency: Consistency, id: &Id) -> Result<Resource, StorageError> {
        if id.r#type.as_ref().is_some_and(|t| t.group == "tenancy") {
            self.tenancy_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read(consistency, id).await
    }
    async fn read_encoded(
        &self,
        consistency: Consistency,
        id: &Id,
    ) -> Result<Vec<u8>, StorageError> {
        self.inner.read_encoded(consistency, id).await
    }
    async fn write_cas_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<Resource, StorageError> {
        self.count_write()?;
        self.inner.write_cas_as(resource, actor, fence).await
    }
    async fn write_merged_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<Resource, StorageError> {
        self.count_write()?;
        self.inner.write_merged_as(resource, actor, fence).await
    }
    async fn delete_cas_as(
        &self,
        id: &Id,
        version: &str,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<(), StorageError> {
        if self.lose() {
            return Err(StorageError::CasFailure);
        }
        self.inner.delete_cas_as(id, version, actor, fence).await
    }
    async fn list(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        self.inner
            .list(consistency, resource_type, tenancy, name_prefix)
            .await
    }
    async fn list_encoded(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&crate::storage::StorageKey>,
        sink: &mut dyn crate::storage::EncodedSink,
    ) -> Result<(), StorageError> {
        self.inner
            .list_encoded(
                consistency,
                resource_type,
                tenancy,
                name_prefix,
                after,
                sink,
            )
            .await
    }
    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        self.inner.list_by_owner(owner).await
    }
    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<crate::storage::Version>,
        options: crate::storage::WatchOptions,
    ) -> Result<Watch, StorageError> {
        self.inner
            .watch_list(resource_type, tenancy, name_prefix, since, options)
            .await
    }
    fn group_stamp(&self, group: &str) -> Option<u64> {
        self.inner.group_stamp(group)
    }
    fn keep_history(&self, policy: Arc<dyn crate::storage::history::HistoryPolicy>) {
        self.inner.keep_history(policy)
    }
    async fn history(
        &self,
        consistency: Consistency,
        uid: &str,
        before: Option<crate::storage::Version>,
        limit: usize,
    ) -> Result<crate::storage::history::Page, StorageError> {
        self.inner.history(consistency, uid, before, limit).await
    }
    async fn sync(&self) -> Result<(), StorageError> {
        self.inner.sync().await
    }
    fn project(&self, projection: Arc<dyn crate::storage::Projection>) -> Result<(), StorageError> {
        self.inner.project(projection)
    }
}
